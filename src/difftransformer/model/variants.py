"""The variant registry: every attention variant's name, label, colour, options and class, in one place.

Code outside ``model/attention/`` asks a variant (``variant(cfg.attention)``, ``variants()``, ``reference()``,
``compared()``) and never compares ``cfg.attention`` with a string. ``model/attention/__init__.py`` registers the
three built-in variants; a new one is a class in ``model/attention/`` plus one ``register(Variant(...))`` there
(``tests/test_fourth_variant.py`` registers a throwaway one and runs train, eval, report and bench on it).

This module imports nothing from the package, so ``model/config.py`` can validate against it; the classes are
registered when ``difftransformer.model`` is imported, which happens before any ``ModelConfig`` can be built
(importing ``difftransformer.model.config`` imports ``difftransformer.model`` first).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Variant:
    """One attention variant.

    ``name`` is the ``ModelConfig.attention`` value and the key in run configs; ``label`` the name in tables,
    plots and the report; ``short`` the column label of the bench tables; ``colour`` its colour in every figure.
    ``options`` are the ``ModelConfig`` fields that only this variant reads (set on another variant they are
    refused). ``reference`` marks the variant every ratio and verdict compares against (exactly one: the
    baseline). ``differential`` says its attention maps are differences ``A1 - lambda * A2`` (the analyses label
    them so). ``check`` validates a ``ModelConfig`` of this variant beyond the common fields (raise ValueError).
    ``cls`` is the ``Attention`` subclass that builds a layer: ``cls(cfg, layer_idx)``.
    """

    name: str
    label: str
    short: str
    colour: str
    cls: Any
    options: tuple[str, ...] = ()
    reference: bool = False
    differential: bool = True
    check: Optional[Callable[[Any], None]] = field(default=None, compare=False)


_REGISTRY: dict[str, Variant] = {}


def register(v: Variant) -> Variant:
    """Add a variant (its name must be new; only one may be the reference)."""
    if not isinstance(v, Variant):
        raise TypeError(f"register expects a Variant, got {type(v).__name__}")
    if not v.name.isidentifier():
        raise ValueError(f"Variant.name={v.name!r} must be an identifier (it is a config value and a file stem)")
    if v.name in _REGISTRY:
        raise ValueError(f"variant {v.name!r} is already registered")
    if v.reference and any(o.reference for o in _REGISTRY.values()):
        raise ValueError(f"variant {v.name!r} cannot be a second reference (the baseline is {reference().name!r})")
    _REGISTRY[v.name] = v
    return v


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


@contextlib.contextmanager
def registered(v: Variant) -> Iterator[Variant]:
    """``register(v)`` for the duration of a ``with`` block (tests)."""
    register(v)
    try:
        yield v
    finally:
        unregister(v.name)


def adopt(vs: tuple[Variant, ...]) -> None:
    """Register those of ``vs`` this process lacks: a spawned worker gets its parent's ``variants()`` this way (a
    variant registered at run time, by a user's script or a test, is not known to a fresh interpreter)."""
    for v in vs:
        if v.name not in _REGISTRY:
            register(v)


def names() -> tuple[str, ...]:
    """Every registered variant's name, reference first, then in registration order."""
    return tuple(v.name for v in variants())


def variants() -> tuple[Variant, ...]:
    ref = [v for v in _REGISTRY.values() if v.reference]
    return tuple(ref + [v for v in _REGISTRY.values() if not v.reference])


def variant(name: Any, field_name: str = "attention") -> Variant:
    """The variant called ``name``; a ValueError naming the field and the allowed values otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"{field_name}={name!r} is not allowed; choose one of {', '.join(names())}") from None


def reference() -> Variant:
    """The variant every other one is compared with (the baseline)."""
    for v in _REGISTRY.values():
        if v.reference:
            return v
    raise RuntimeError("no reference variant is registered (difftransformer.model registers the baseline)")


def compared() -> tuple[Variant, ...]:
    """Every variant that is compared with the reference, in registration order."""
    return tuple(v for v in variants() if not v.reference)


def all_options() -> tuple[str, ...]:
    """Every variant-specific ``ModelConfig`` field, each once."""
    return tuple(dict.fromkeys(o for v in variants() for o in v.options))


def label(name: str) -> str:
    """The variant's label, or ``name`` itself for a name no variant has (old result files)."""
    v = _REGISTRY.get(name)
    return v.label if v else name


def colour(name: str) -> Optional[str]:
    v = _REGISTRY.get(name)
    return v.colour if v else None
