"""A fake GPU on the CPU: code runs to the end on real values, but fails where CUDA would on a device mix.

CI and the development machines have no GPU, so a path that runs only on ``--device cuda`` ships unrun (issue 48:
``TopAbs`` made its running top-k on the CPU and concatenated it with the model's values; the first GPU job died on
it). Here a second device exists in a CPU-only process: ``fakegpu`` (PyTorch's PrivateUse1 slot set up as a Python
backend, which gives it the device guard that scalar reads and autograd ask for). A tensor on it is a
``FakeGpuTensor``: it says ``device='fakegpu:0'`` and holds an ordinary CPU tensor that every operator runs on, so
``.item()``, ``float()``, boolean indexing, ``.tolist()``, autograd and the optimizers all work and the code under
test runs end to end -- unlike ``FakeTensorMode`` or the meta device, which stop at the first value read.

``FakeGpuMode`` sees every ATen operator (a ``TorchDispatchMode``) and applies CUDA's device rules:

* a factory (``torch.zeros``, ``arange``, ``tensor``, ``randn``, ... and ``with torch.device(...)``) with
  ``device=fakegpu`` makes a fake-GPU tensor; without one, a CPU tensor, as on a GPU machine;
* an operator that meets a fake-GPU tensor and a CPU tensor raises ``RuntimeError: Expected all tensors to be on
  the same device`` (the error of issue 48), except where CUDA allows the mix: a 0-dim CPU tensor read as a
  number (pointwise and ``_foreach`` operators -- TensorIterator's "CPU scalar" --, ``masked_fill``, ``fill_``,
  indexing), CPU index tensors for a GPU tensor's ``index`` and ``index_put``, and the copies (``.to``,
  ``copy_``: a move between devices copies, as on CUDA);
* ``.numpy()`` (and so ``np.asarray``) of a fake-GPU tensor raises as on CUDA: it must go through ``.cpu()``;
* a ``torch.Generator(device=fakegpu)`` (``FakeGpuGenerator``) draws on the CPU but is refused by an operator on
  the CPU, and a CPU generator by one on the fake GPU, as CUDA refuses a generator of the other device.

Its arithmetic is the CPU's, with the kernels PyTorch picks for a device that is not the CPU: SDPA's math path
(``device_scenarios.on_cpu`` makes the CPU reference take it too), decomposed backward formulas, per-tensor
gradient norms. What it does not see: code that branches on ``device.type == "cuda"`` takes its non-CUDA branch
here (CUDA graphs, Triton, ``torch.cuda`` calls, bf16 autocast need the real GPU: ``make gpu-check``), ``torch.compile``
on it, and speed. The registration is for the whole process and cannot be undone, so the checks run in a child
process (``tests/device_scenarios.py``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "fakegpu"
DEVICE = torch.device(NAME, 0) if hasattr(torch, NAME) else None  # set by register()
aten = torch.ops.aten


def register() -> torch.device:
    """Set up the fake GPU in this process (once; it cannot be undone) and return its device. Call it before the
    process's first backward pass: autograd sizes its per-device queues then, and a device added later fails
    its internal assert."""
    global DEVICE
    if not hasattr(torch, NAME):
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend
        _setup_privateuseone_for_python_backend(rename=NAME)
        _backend_kernels()
    DEVICE = torch.device(NAME, 0)
    return DEVICE


_LIBRARY: list[torch.library.Library] = []  # kept alive: the registrations last as long as it does


def _backend_kernels() -> None:
    """Allocation and host copies for the fake GPU below the dispatcher's Python key, where C++ makes a tensor on a
    given device itself (``torch.tensor(data, device=...)``, ``x[[0, -1]]``'s index tensor): on the CPU, wrapped."""
    lib = torch.library.Library("aten", "IMPL")
    _LIBRARY.append(lib)

    def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
        return FakeGpuTensor(torch.empty_strided(size, stride, dtype=dtype))

    def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return FakeGpuTensor(torch.empty(size, dtype=dtype, memory_format=memory_format))

    def copy_from(src, dst, non_blocking=False):
        unwrap = lambda t: t.elem if isinstance(t, FakeGpuTensor) else t  # noqa: E731
        unwrap(dst).copy_(unwrap(src))
        return dst

    lib.impl("empty_strided", empty_strided, "PrivateUse1")
    lib.impl("empty.memory_format", empty, "PrivateUse1")
    lib.impl("_copy_from", copy_from, "PrivateUse1")


def _mismatch(a: torch.device, b: torch.device, func) -> RuntimeError:
    # CUDA's own words (what a GPU run prints), with the operator's name for the reader of a failed check
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {a} and "
                        f"{b}! (fakegpu check, in {func})")


class FakeGpuTensor(torch.Tensor):
    """A tensor on the fake GPU: the device it reports is ``fakegpu:0``, its values are ``elem`` on the CPU."""

    elem: torch.Tensor
    __slots__ = ["elem"]

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> FakeGpuTensor:
        r = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=DEVICE, requires_grad=elem.requires_grad)
        r.elem = elem
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run_op(func, args, kwargs)

    # reads CUDA allows (a host copy through the tensor's values)
    def tolist(self) -> Any:
        return self.elem.tolist()

    def numpy(self, *, force: bool = False):
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        "tensor to host memory first. (fakegpu check)")

    def __array__(self, dtype=None, copy=None):
        return self.numpy()

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"FakeGpuTensor({self.elem!r})"

    def __format__(self, spec: str) -> str:
        return self.elem.__format__(spec)


_FAKE_GENERATORS: weakref.WeakSet = weakref.WeakSet()


SALT = 0x5EED_FA6E  # a fake-GPU generator's seeds are offset by it: see _is_fake_generator


class FakeGpuGenerator(torch._C.Generator):
    """``torch.Generator(device=fakegpu)`` inside ``fake_gpu()``: draws on the CPU (the fake GPU has no generator),
    says it is on the fake GPU, and is seeded ``SALT`` apart from a CPU generator given the same seed (a GPU's
    generator draws other numbers than the CPU's under one seed too)."""

    def __new__(cls, device: Any = None) -> FakeGpuGenerator:
        g = super().__new__(cls)
        torch._C.Generator.manual_seed(g, SALT)
        _FAKE_GENERATORS.add(g)
        return g

    def manual_seed(self, seed: int) -> FakeGpuGenerator:  # type: ignore[override]
        torch._C.Generator.manual_seed(self, (int(seed) + SALT) % 2**64)
        return self

    @property  # type: ignore[override]
    def device(self) -> torch.device:
        return DEVICE  # type: ignore[return-value]


def _is_fake_generator(g: torch.Generator) -> bool:
    # An operator receives a new Python object for the same C++ generator, so it is told apart by its state: a
    # fake one's never equals a CPU one's, whose seeds are SALT apart
    state = g.get_state()
    return any(torch.equal(state, f.get_state()) for f in list(_FAKE_GENERATORS))


def generator_class(real: type = torch.Generator) -> type:
    """A drop-in ``torch.Generator``: the fake GPU's is a ``FakeGpuGenerator``, any other device's a real one."""
    class Generator(real):  # type: ignore[misc, valid-type]
        def __new__(cls, device: Any = "cpu"):
            d = torch.device(device)
            return FakeGpuGenerator() if d.type == NAME else real(device=d)
    return Generator


def _device_of(x: Any) -> torch.device:
    return DEVICE if isinstance(x, FakeGpuTensor) else x.device  # type: ignore[return-value]


COPIES = {aten.copy_.default, aten.copy.default, aten._to_copy.default, aten._copy_from.default,
          aten._copy_from_and_resize.default}
INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default,
            aten._unsafe_index.Tensor, aten._unsafe_index_put.default}
# operators that read a 0-dim CPU tensor as a number (besides the pointwise and _foreach_ ones)
SCALAR_ARGS = {aten.masked_fill.Tensor, aten.masked_fill_.Tensor, aten.fill.Tensor, aten.fill_.Tensor} | INDEXING


def _scalars_ok(func) -> bool:
    return torch.Tag.pointwise in func.tags or func.name().startswith("aten::_foreach_") or func in SCALAR_ARGS


def check_devices(func, args: tuple, kwargs: dict) -> None:
    """Raise as CUDA would where ``func`` meets tensors on the fake GPU and on the CPU (rules: module docstring)."""
    if func in COPIES:
        return
    fake_self = bool(args) and isinstance(args[0], FakeGpuTensor)
    if func in INDEXING:  # self on the GPU takes CPU indices; the rest (values) must be on self's device
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        rest = [args[0], *args[2:], *kwargs.values()]
        for t in indices or ():
            if t is not None and not fake_self and isinstance(t, FakeGpuTensor):
                raise _mismatch(_device_of(t), _device_of(args[0]), func)
        args, kwargs = tuple(rest), {}
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    fake = [t for t in tensors if isinstance(t, FakeGpuTensor)]
    if not fake:
        return
    scalars_ok = _scalars_ok(func)
    for t in tensors:
        if isinstance(t, FakeGpuTensor) or t.device.type == "meta":
            continue
        if t.dim() == 0 and t.device.type == "cpu" and scalars_ok:
            continue
        raise _mismatch(DEVICE, t.device, func)  # type: ignore[arg-type]


def _check_generator(kwargs: dict, on_fake: bool, func) -> dict:
    g = kwargs.get("generator")
    if g is None:
        return kwargs
    g_fake = _is_fake_generator(g)
    if g_fake != on_fake:
        want = NAME if on_fake else "cpu"
        have = NAME if g_fake else g.device.type
        raise RuntimeError(f"Expected a '{want}' device type for generator but found '{have}' (fakegpu check, in "
                           f"{func})")
    return kwargs


def run_op(func, args: tuple = (), kwargs: dict | None = None) -> Any:
    """Run one operator on the CPU values, after CUDA's device checks; outputs go on the fake GPU where CUDA's
    would be on the GPU (a fake-GPU input, or ``device=fakegpu``)."""
    kwargs = dict(kwargs or {})
    check_devices(func, args, kwargs)
    target = kwargs.get("device")
    to_fake = target is not None and torch.device(target).type == NAME
    fake_in = any(isinstance(t, FakeGpuTensor) for t in tree_flatten((args, kwargs))[0])
    on_fake = to_fake or (fake_in and target is None)
    if to_fake:
        kwargs["device"] = torch.device("cpu")
    kwargs = _check_generator(kwargs, on_fake, func)
    inputs: dict[int, Any] = {}
    plain = {id(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}

    def unwrap(x):
        if isinstance(x, FakeGpuTensor):
            inputs[id(x.elem)] = x
            return x.elem
        return x

    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))

    def wrap(x):
        if not isinstance(x, torch.Tensor) or isinstance(x, FakeGpuTensor):
            return x
        own = inputs.get(id(x)) if id(x) in inputs and inputs[id(x)].elem is x else None
        if target is not None and own is None and id(x) in plain:  # ``aten.to`` gave its CPU input back
            return FakeGpuTensor(x.clone()) if to_fake else x  # a move to the GPU copies
        if target is not None and own is not None and not to_fake:  # ... or the values of its GPU input
            return x.clone()  # a move to the host copies
        if own is not None:  # an in-place op (or a no-op ``to``) returns its own input: the fake one
            return own
        if id(x) in plain:  # ... or a CPU one (``cpu.copy_(gpu)``)
            return x
        return FakeGpuTensor(x) if on_fake else x

    return tree_map(wrap, out)


class FakeGpuMode(TorchDispatchMode):
    """Every operator run inside goes through ``run_op`` (factories included)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return run_op(func, args, kwargs)


@contextlib.contextmanager
def fake_gpu() -> Iterator[torch.device]:
    """The fake GPU for the block: ``with fake_gpu() as dev: model.to(dev) ...``; ``torch.Generator`` made for it
    draws on the CPU (see ``FakeGpuGenerator``)."""
    dev = register()
    real = torch.Generator
    torch.Generator = generator_class(real)  # type: ignore[misc]
    try:
        with FakeGpuMode():
            yield dev
    finally:
        torch.Generator = real  # type: ignore[misc]


def on_fake_gpu(t: torch.Tensor) -> bool:
    return isinstance(t, FakeGpuTensor)
