"""Atomic file writes: the one helper every writer of the project uses.

A reader (the app, another job) sees either the old file or the new one, never a half-written
file: the data goes to a unique temporary file in the target's own folder, is flushed and
fsynced, then ``os.replace`` swaps it in (atomic on POSIX and Windows within one file system).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb", suffix: str | None = None,
                 newline: str | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on success it replaces ``path`` atomically.

    ``suffix`` keeps the target's extension on the temporary name (some writers pick the
    format from it, e.g. PIL and ``numpy.savez``); ``newline`` is ``open``'s, for text mode
    (``""`` for the csv module). On error the temporary file is removed and ``path`` is left
    untouched.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', got {mode!r}")
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                               suffix=suffix if suffix is not None else ".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8", "newline": newline} if mode == "w" else {})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``."""
    with atomic_write(path, "wb") as fh:
        fh.write(data)


def write_text(path: str | Path, text: str) -> None:
    """Atomically replace ``path`` with ``text`` (UTF-8)."""
    with atomic_write(path, "w") as fh:
        fh.write(text)


def write_json(path: str | Path, value: Any, **dumps_kwargs: Any) -> None:
    """Atomically replace ``path`` with ``value`` as JSON (indent 2 unless given)."""
    dumps_kwargs.setdefault("indent", 2)
    write_text(path, json.dumps(value, **dumps_kwargs) + "\n")


def read_json(path: str | Path, retries: int = 3) -> Any:
    """Read a JSON file another process may be replacing (retries a torn or vanished read)."""
    for attempt in range(retries):
        try:
            return json.loads(Path(path).read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            if attempt == retries - 1:
                raise
    raise AssertionError("unreachable")


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
