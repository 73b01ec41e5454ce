"""A study config's shared parts: integer and lr-grid checks that name the field, and the dict round trip (the
config is hashed into every job's key, so ``to_dict``/``from_dict`` must give back an equal config)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Optional, TypeVar

C = TypeVar("C")


def flag(default: Any = dataclasses.MISSING, help: str = "", *, factory: Optional[Callable[[], Any]] = None,
         follows: Optional[str] = None) -> Any:
    """A study config field that is also a command-line flag ``--field-name`` (``studies.cli.add_config_flags``):
    ``help`` is its one line of ``--help`` (the default is appended). ``follows``: a field whose value this one takes
    when only that one's flag is given (``--eval-contexts`` sets the validation contexts too). A field declared
    without ``flag`` is fixed by the protocol, not a flag."""
    meta = {"help": help, "follows": follows}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_int(name: str, v: Any, low: int = 1) -> None:
    """A study config's integer field: an ``int`` (not a bool) of at least ``low``; the error names the field."""
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")


def check_lr_grid(grid: Sequence[float], high: float, message: str) -> None:
    """A study config's learning-rate grid: non-empty, distinct, every value finite in (0, ``high``) (``math.inf``:
    no upper bound). ``message``: the ValueError's text, the study's own (it names the field and what it allows)."""
    if not grid or len(set(grid)) != len(grid) or any(not (math.isfinite(x) and 0 < x < high) for x in grid):
        raise ValueError(message)


def as_tuples(cfg: Any, *names: str) -> None:
    """In a frozen config's ``__post_init__``: the sequence fields ``names`` as tuples (a config read back from JSON
    has lists), so that equal configs compare and hash equal."""
    for n in names:
        object.__setattr__(cfg, n, tuple(getattr(cfg, n)))


def to_dict(cfg: Any, *sequences: str) -> dict[str, Any]:
    """The config as JSON-ready data: ``dataclasses.asdict`` with the tuple fields ``sequences`` as lists."""
    d = dataclasses.asdict(cfg)
    for k in sequences:
        d[k] = list(d[k])
    return d


def from_dict(cls: type[C], d: dict[str, Any]) -> C:
    """``cls(**d)``, refusing keys ``cls`` does not have (a typo must not fall back to a default)."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} key(s): {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    return cls(**d)
