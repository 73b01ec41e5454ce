"""What the Triton kernels (``triton_diff.py``, ``triton_decode.py``) and the hook (``hook.py``) share: the sizes
the kernels are built for, what makes two calls the same *kind* of launch, and the record of the kinds whose launch
failed in this process (one warning each; their later calls run the PyTorch path).

It imports neither triton nor a kernel, so the kernel files import it at their top while the hook imports the
kernels only when a Triton path runs (no import circle), and an install without triton imports it too.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections.abc import Iterator
from typing import Optional

import torch

# head_dim values the Triton kernel is built for (triton_diff.py checks them too).
TRITON_HEAD_DIMS = (16, 32, 64, 128)
# The kernels put the batch on CUDA grid axis 2, at most 65,535 (triton_diff.py checks it too); more rows: sdpa.
TRITON_MAX_BATCH = 65_535
# What a Triton call computes: "train" (forward and backward: autograd records the call), "prefill" (forward only,
# a prompt or an evaluation) or "decode" (one KV-cache step).
TRITON_PASSES = ("train", "prefill", "decode")

logger = logging.getLogger(__name__)
_SAID: set[str] = set()
# Kinds of Triton call (``triton_kind``) whose launch failed in this process -> the reason (warned once, then sdpa).
_TRITON_FAILED: dict[tuple, str] = {}
_CAPABILITY: dict[int, tuple[int, int]] = {}


def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def attention_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the attention runs in for the layer input ``x``: autocast's where it is on (the projections cast
    to it), else x's own."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def triton_pass(x: torch.Tensor) -> str:
    """The pass of a (non-decode) DIFF call on the attention input ``x``: "train" when autograd records it."""
    return "train" if torch.is_grad_enabled() and x.requires_grad else "prefill"


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device, read once per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABILITY:
        major, minor = torch.cuda.get_device_capability(index)
        _CAPABILITY[index] = (major, minor)
    return _CAPABILITY[index]


def triton_kind(device: torch.device, dtype: torch.dtype, head_dim: int, value_dim: int, pass_: str) -> tuple:
    """What makes two Triton calls launch the same kernels with the same tiles: the GPU (its compute capability),
    dtype, head and value widths and the pass. A launch that fails for one call fails for all calls of its kind."""
    if pass_ not in TRITON_PASSES:
        raise ValueError(f"pass_={pass_!r} is not allowed; use one of {', '.join(TRITON_PASSES)}")
    gpu = cuda_capability(device) if device.type == "cuda" else device.type
    return gpu, dtype, head_dim, value_dim, pass_


def describe_kind(kind: tuple) -> str:
    gpu, dtype, head_dim, value_dim, pass_ = kind
    where = f"sm_{gpu[0]}{gpu[1]}" if isinstance(gpu, tuple) else gpu
    return f"{pass_}, {str(dtype).replace('torch.', '')}, head_dim {head_dim}, value_dim {value_dim} on {where}"


def is_triton_launch_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of Triton itself to compile or launch a kernel (then the caller takes the
    PyTorch path), as opposed to a bug in our arguments or code (then it propagates).

    The rule is WHERE the exception came from, not its type or message, because Triton fails in many ways that no
    list can hold (``OutOfResources``, ``PTXASError``, a ``CompilationError``, a ``RuntimeError: PassManager::run
    failed`` from its LLVM lowering as an H200 raised for float64 dots, ``RuntimeError: Triton Error [CUDA]: ...``
    from its launcher, an assertion in a backend of another Triton version). It is a launch failure when

    * it was raised inside Triton: a frame of its traceback belongs to the ``triton`` package (``kernel[grid](...)``
      enters Triton's launch proxy first, so anything raised while Triton binds, compiles, autotunes or launches
      passes through Triton's frames, whatever its type), or
    * its class is one of Triton's own (``triton.*``: its errors carry their meaning wherever they are raised), or
    * it was raised ``from`` such an exception (``__cause__``),

    except memory exhaustion (``torch.OutOfMemoryError``), a state of the moment rather than of the kind of launch,
    which propagates as it would from the PyTorch path. Our own checks (``ValueError``/``TypeError`` naming the
    argument) run before the kernel is entered, in our frames, so they propagate; so does any other bug of ours
    that fails before ``kernel[grid]`` is called.
    """
    seen: set[int] = set()
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, torch.OutOfMemoryError):
            return False
        if _in_triton(type(cur).__module__) or any(_in_triton(name) for name in _traceback_modules(cur)):
            return True
        cur = cur.__cause__
    return False


def _in_triton(module: object) -> bool:
    return isinstance(module, str) and (module == "triton" or module.startswith("triton."))


def _traceback_modules(exc: BaseException) -> Iterator[object]:
    """The module name (``__name__`` of the globals) of every frame from where ``exc`` was caught to where it was
    raised."""
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame.f_globals.get("__name__")
        tb = tb.tb_next


def triton_kind_failed(kind: tuple) -> bool:
    """Whether a Triton launch of this kind already failed in this process (then its calls use the PyTorch path)."""
    return kind in _TRITON_FAILED


def triton_failed(kind: tuple, reason) -> None:
    """Record that Triton calls of this kind cannot run here; the first time, ONE warning line names the reason."""
    if kind in _TRITON_FAILED:
        return
    if isinstance(reason, BaseException):
        text = str(reason).strip().splitlines()
        reason = f"{type(reason).__name__}: {text[0][:300] if text else ''}"
    _TRITON_FAILED[kind] = reason
    pass_ = kind[-1]
    fallback = "the PyTorch decode step" if pass_ == "decode" else "sdpa"
    warnings.warn(f"difftransformer: the fused Triton kernel cannot run for {describe_kind(kind)} ({reason}); "
                  f"this call and later ones of this kind use {fallback}", RuntimeWarning, stacklevel=3)


def say_once(line: str) -> None:
    """Log ``line`` as a warning (``difftransformer.log``) the first time this process asks for it."""
    if line not in _SAID:
        _SAID.add(line)
        logger.warning(line)
