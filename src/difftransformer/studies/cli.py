"""Command-line helpers both studies use: the configuration flags derived from the config dataclass
(``add_config_flags``, ``config_changes``), the modes and the flags each takes (``Mode``, ``Modes``), comma-separated
lists, and the rounding check's file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..rundir.files import ROUNDING_NAME


def floats(text: str, flag: str, n: Optional[int] = None) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated numbers, got {text!r}") from None
    if not vals or (n is not None and len(vals) != n):
        raise ValueError(f"{flag} must list {n or 'at least one'} number(s), got {text!r}")
    return vals


def ints(text: str, flag: str, n: Optional[int] = None) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not vals or (n is not None and len(vals) != n):
        raise ValueError(f"{flag} must list {n or 'at least one'} integer(s), got {text!r}")
    return vals


def write_rounding(out: str | Path, check: Mapping[str, Any], text: str) -> Path:
    """The rounding check's result: OUT/rounding.json written atomically, its text and the file's name printed."""
    from ..fileio import atomic_write
    path = Path(out) / ROUNDING_NAME
    atomic_write(path, json.dumps(check, indent=1) + "\n")
    print(text)
    print(f"wrote {path}")
    return path


# ---------------------------------------------------------------------------------------------- config flags
CONFIG_PREFIX = "config:"  # the dest of a configuration flag: CONFIG_PREFIX + the field's name


def _flag_type(typ: Any, name: str) -> dict[str, Any]:
    """argparse keywords for a config field of type ``typ``: its parser (a tuple is comma-separated) and metavar."""
    from ..fileio import text_arg
    origin, targs = typing.get_origin(typ), typing.get_args(typ)
    if origin is typing.Literal:
        return {"choices": targs, "type": text_arg}
    if typ is bool:
        def boolean(text: str) -> bool:
            if text.lower() not in ("true", "false"):
                raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")
            return text.lower() == "true"
        return {"type": boolean, "metavar": "true|false"}
    if origin is tuple:
        item = targs[0]
        n = None if len(targs) == 2 and targs[1] is Ellipsis else len(targs)
        if typing.get_origin(item) is typing.Literal or item is str:
            def names(text: str) -> tuple[str, ...]:
                return tuple(v.strip() for v in text_arg(text).split(",") if v.strip())
            return {"type": names, "metavar": "NAME,..."}
        conv = {int: ints, float: floats}[item]

        def values(text: str) -> tuple[Any, ...]:
            try:
                return conv(text, "", n)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e).lstrip()) from None
        what = "INT" if item is int else "X"
        return {"type": values, "metavar": "LO,HI" if n == 2 else f"{what},..."}
    if typ in (int, float):
        return {"type": typ, "metavar": "N" if typ is int else "X"}
    return {"type": text_arg, "metavar": name.upper()}


def _shown(v: Any) -> str:
    return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) if isinstance(v, tuple) else (
        f"{v:g}" if isinstance(v, float) else str(v))


def add_config_flags(p: argparse.ArgumentParser, cls: type, title: str, base: Any = None) -> list[str]:
    """One flag ``--field-name`` per field of the config dataclass ``cls`` declared with ``studies.config.flag``, in
    the group ``title``: its type, choices and help from the field (``base``, an instance: the defaults shown);
    default None (not given). Returns the dests (``CONFIG_PREFIX`` + field name)."""
    from ..jobs.codepath import CodePath  # a config names it for type checkers only (no jobs import at run time)
    hints = typing.get_type_hints(cls, localns={"CodePath": CodePath})
    base = cls() if base is None else base
    g = p.add_argument_group(title)
    dests = []
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue
        kw = _flag_type(hints[f.name], f.name)
        g.add_argument("--" + f.name.replace("_", "-"), dest=CONFIG_PREFIX + f.name, default=None,
                       help=f"{f.metadata['help']} (default {_shown(getattr(base, f.name))})", **kw)
        dests.append(CONFIG_PREFIX + f.name)
    return dests


def config_changes(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The config fields whose flags ``args`` gives, as ``replace(**changes)`` takes them; a field that ``follows``
    another takes that one's value unless its own flag is given."""
    ch = {k[len(CONFIG_PREFIX):]: v for k, v in vars(args).items() if k.startswith(CONFIG_PREFIX) and v is not None}
    for f in dataclasses.fields(cls):
        follows = f.metadata.get("follows")
        if follows and follows in ch and f.name not in ch:
            ch[f.name] = ch[follows]
    return ch


# ---------------------------------------------------------------------------------------------- modes
@dataclass(frozen=True)
class Mode:
    """One thing a study command does, and the flags it takes. ``selected_by``: dests that are all given (or
    ``dest=value``) select it, the first mode that matches wins, () the default; ``takes``: the other dests it
    accepts (``"config"`` the configuration flags, ``"jobs"`` where jobs run); ``needs``: dests it cannot go
    without; ``note``: why it refuses what it refuses (``(it takes its configuration from --reference DIR)``)."""

    name: str
    selected_by: tuple[str, ...] = ()
    takes: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    note: str = ""


ALWAYS = ("out", "no_progress")  # every mode takes these


class Modes:
    """A study command's modes (``Mode``), built from its parser once its flags are declared: ``select(args)`` is the
    mode the flags ask for, or one ValueError naming a flag that does not go with it (and which modes take it) or a
    flag it needs. The parser's actions give the flag names and defaults; a flag left at its default is not given."""

    def __init__(self, p: argparse.ArgumentParser, modes: Sequence[Mode], groups: dict[str, Sequence[str]]):
        self.modes, self.groups = tuple(modes), {k: tuple(v) for k, v in groups.items()}
        acts = [a for a in p._actions if a.option_strings and a.dest != "help"]
        self.flag = {a.dest: max(a.option_strings, key=len) for a in acts}
        self.metavar = {a.dest: a.metavar for a in acts}
        self.default = {a.dest: a.default for a in acts}

    def given(self, args: argparse.Namespace) -> list[str]:
        return [d for d, default in self.default.items() if getattr(args, d, default) != default]

    def _matches(self, mode: Mode, args: argparse.Namespace, given: list[str]) -> bool:
        for sel in mode.selected_by:
            dest, _, value = sel.partition("=")
            if dest not in given or (value and getattr(args, dest) != value):
                return False
        return True

    def _takes(self, mode: Mode) -> set[str]:
        out = set(ALWAYS) | {s.partition("=")[0] for s in mode.selected_by} | set(mode.needs)
        for t in mode.takes:
            out.update(self.groups.get(t, (t,)))
        return out

    def select(self, args: argparse.Namespace) -> Mode:
        given = self.given(args)
        mode = next(m for m in self.modes if self._matches(m, args, given))
        takes = self._takes(mode)
        for dest in given:
            if dest not in takes:
                if any(len(m.selected_by) == 1 and m.selected_by[0].partition("=")[0] == dest for m in self.modes):
                    raise ValueError(f"{self.flag[dest]} and {mode.name} are two modes: give one")
                others = [m.name for m in self.modes if dest in self._takes(m)]
                raise ValueError(f"{self.flag[dest]} does not go with {mode.name}{mode.note}"
                                 + (f"; it goes with {' or '.join(others)}" if others else ""))
        for dest in mode.needs:
            if dest not in given:
                raise ValueError(f"{mode.name} needs {self.flag[dest]} {self.metavar[dest] or ''}".rstrip())
        return mode


# ---------------------------------------------------------------------------------------------- inputs, up front
def check_pin(code_path: str, options: Any, flag: str) -> None:
    """A CPU code path a later stage of the command runs (``--rounding-check``): one this CPU cannot run refused now,
    as the first stage's own is (local workers; a Ray task checks on its node)."""
    from ..jobs.codepath import refuse_unsupported_code_path
    if options.executor == "local":
        try:
            refuse_unsupported_code_path(code_path)
        except ValueError as e:
            raise ValueError(str(e).replace(f"--cpu-code-path {code_path}", f"{flag} {code_path}", 1)) from None
