"""Crash-safe file writes and guarded JSON reads, below every other module (it imports none of them).

``atomic_write`` builds a file under a temporary name in the same directory, fsyncs it, renames it over the
target and fsyncs the directory: a kill at any point leaves either the old file or the new one, never a cut or
empty one. ``read_json`` turns every way a JSON file can be unreadable (bad syntax, nesting deep enough to
exhaust the parser's recursion) into a ``ValueError`` naming the file.

``fault_point`` is the fault-injection hook of the tests: with ``DIFFTRANSFORMER_FAULT_AT=k`` in the environment
the process exits (``os._exit``, no cleanup, as a SIGKILL would) at the k-th write it makes; every atomic file,
checkpoint directory and metrics line is one such point.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Union

PathLike = Union[str, os.PathLike]

FAULT_ENV = "DIFFTRANSFORMER_FAULT_AT"
FAULT_EXIT_CODE = 86  # what a process killed by the hook exits with (tests tell it from a real failure)
_writes = 0


def fault_point() -> None:
    """Count one write; exit at once when it is the one ``DIFFTRANSFORMER_FAULT_AT`` names."""
    global _writes
    _writes += 1
    at = os.environ.get(FAULT_ENV)
    if at and at.isdigit() and int(at) == _writes:
        os._exit(FAULT_EXIT_CODE)


def fsync_dir(directory: PathLike) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: PathLike, data: Union[bytes, str]) -> Path:
    """Replace ``path`` with ``data`` (str is written as UTF-8) so that readers see the old or the new file."""
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.tmp-", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        fault_point()  # the temp file is complete, the target not yet replaced
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(p.parent)
    return p


def atomic_copy(src: PathLike, dst: PathLike) -> Path:
    """``atomic_write`` of ``src``'s bytes to ``dst`` (tokenizers and other small files)."""
    return atomic_write(dst, Path(src).read_bytes())


def atomic_json(path: PathLike, obj: Any, indent: int = 1, sort_keys: bool = False) -> Path:
    return atomic_write(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")


def parse_json(text: str, where: object) -> Any:
    """``json.loads`` whose failures are one ``ValueError`` naming ``where``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to be a configuration file") from None


def read_json(path: PathLike) -> Any:
    """The JSON value in ``path``; ValueError naming the file when it is not JSON (or absurdly nested)."""
    return parse_json(Path(path).read_text(), path)
