"""Crash-safe file writes and guarded JSON reads, below every other module (it imports none of them).

``atomic_write`` builds a file under a temporary name in the same directory, fsyncs it, renames it over the
target and fsyncs the directory: a kill at any point leaves either the old file or the new one, never a cut or
empty one. ``read_json`` turns every way a JSON file can be unreadable (bad syntax, nesting deep enough to
exhaust the parser's recursion) into a ``ValueError`` naming the file.

Text is UTF-8 everywhere: ``read_text`` reads a text file as UTF-8 and turns a bad byte into a ``ValueError`` naming
the file (and the flag or field that named it); ``check_text`` and ``text_arg`` (an argparse ``type=``) refuse
command-line text that is not UTF-8. On POSIX such an argument reaches Python with each bad byte as a lone
surrogate (U+DC80..U+DCFF, the ``surrogateescape`` error handler), which no tokenizer or JSON writer takes.

``fault_point`` is the fault-injection hook of the tests: with ``DIFFTRANSFORMER_FAULT_AT=k`` in the environment
the process exits (``os._exit``, no cleanup, as a SIGKILL would) at the k-th write it makes; every atomic file,
checkpoint directory and metrics line is one such point. ``DIFFTRANSFORMER_FAULT_AT=k:ENOSPC`` (any errno name,
``EROFS`` for a read-only mount) raises that ``OSError`` at the k-th write instead, naming the file, as a full disk
would.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional, Union

PathLike = Union[str, os.PathLike]

FAULT_ENV = "DIFFTRANSFORMER_FAULT_AT"
FAULT_EXIT_CODE = 86  # what a process killed by the hook exits with (tests tell it from a real failure)
_writes = 0


def fault_point(where: Optional[PathLike] = None) -> None:
    """Count one write (of ``where``); exit at once, or raise the named ``OSError``, when it is the one
    ``DIFFTRANSFORMER_FAULT_AT`` names."""
    global _writes
    _writes += 1
    at = os.environ.get(FAULT_ENV)
    if not at:
        return
    k, _, err = at.partition(":")
    if k.isdigit() and int(k) == _writes:
        if not err:
            os._exit(FAULT_EXIT_CODE)
        code = getattr(errno, err, None)
        if not isinstance(code, int):
            raise ValueError(f"{FAULT_ENV}={at!r}: {err!r} is not an errno name (e.g. ENOSPC, EROFS)")
        raise OSError(code, os.strerror(code), None if where is None else str(where))


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
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.tmp-", dir=p.parent)
    except OSError as e:  # a read-only or missing directory: name the file we meant to write
        raise OSError(e.errno, e.strerror, str(p)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        fault_point(p)  # the temp file is complete, the target not yet replaced
        os.replace(tmp, p)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:  # a full disk says so without a name: add it
            raise OSError(e.errno, e.strerror, str(p)) from None
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


def read_json(path: PathLike, where: Optional[str] = None) -> Any:
    """The JSON value in ``path``; ValueError naming the file when it is not UTF-8, not JSON (or absurdly nested),
    and ``where`` (the flag or field that led to it), when given."""
    return parse_json(read_text(path, where), f"{where}: {path}" if where else path)


def utf8_problem(text: str) -> Optional[str]:
    """None when ``text`` encodes as UTF-8; else where it does not, e.g. "byte 0xff at character 8" (a lone
    surrogate U+DC80..U+DCFF is an undecodable byte of a command-line argument)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        c = ord(text[e.start])
        what = f"byte 0x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"lone surrogate U+{c:04X}"
        return f"{what} at character {e.start + 1}"
    return None


def check_text(text: str, where: str) -> str:
    """``text``, or a ValueError naming ``where`` (a flag or config field) when it is not valid UTF-8."""
    problem = utf8_problem(text)
    if problem is not None:
        raise ValueError(f"{where}: not valid UTF-8 text ({problem}); give UTF-8")
    return text


def text_arg(text: str) -> str:
    """argparse ``type=`` for a flag that carries text: the parser then says ``argument --FLAG: not valid UTF-8
    text (byte 0xff at character 8)`` in its one error line."""
    problem = utf8_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text ({problem}); give UTF-8")
    return text


def decode_text(raw: bytes, path: PathLike, where: Optional[str] = None) -> str:
    """``raw`` (the bytes of ``path``) as UTF-8; a ValueError naming ``where`` (a flag or field) and the file."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}{path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                         "give UTF-8") from None


def read_text(path: PathLike, where: Optional[str] = None) -> str:
    """The text of ``path`` read as UTF-8 whatever the locale, newlines translated as ``Path.read_text`` does; a
    bad byte is a ValueError naming ``where`` (the flag or field that named the file, when given) and the file."""
    return decode_text(Path(path).read_bytes(), path, where).replace("\r\n", "\n").replace("\r", "\n")


def check_out_dir(out: PathLike, flag: str = "--out") -> Path:
    """``out`` as a directory a long command may write into: one that exists, or one it can create (no file in the
    way, on it or a parent); else one ValueError naming ``flag``, before any work."""
    path = Path(out)
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise ValueError(f"{flag} {out}: " + ("it is a file, not a directory" if p == path else
                                                      f"{p} is a file, not a directory"))
            break
    return path
