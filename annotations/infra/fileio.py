"""Atomic file writes and link-free copies: the helpers every writer of the project uses.

A reader (the app, another job) sees either the old file or the new one, never a half-written
file: the data goes to a unique temporary file in the target's own folder, is flushed and
fsynced, then ``os.replace`` swaps it in (atomic on POSIX and Windows within one file system).
Copies (:func:`copy_tree`) open every file and folder without following a symbolic link.

:func:`write_step` marks each durable write (a rename, a commit): ``scripts/crashtest.py`` sets
``TRIDERM_CRASH_AT=N`` to SIGKILL the process at the N-th one.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
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
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) if mode == "w" else os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        write_step()
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


@contextlib.contextmanager
def staged_folder(out: str | Path, error: type[Exception] = ValueError) -> Iterator[Path]:
    """Yield a new stage folder beside ``out`` (which must be absent or an empty folder, else
    ``error``); on success the stage is renamed to ``out``, on any error it is removed, so a
    failure leaves ``out`` as it was."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise error(f"{out}: exists and is not an empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield stage
        if out.exists():
            out.rmdir()
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


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


CRASH_ENV = "TRIDERM_CRASH_AT"
_steps = 0


def write_step() -> None:
    """Count one durable write step (called just before each rename and each commit); with
    ``$TRIDERM_CRASH_AT=N`` the process kills itself (SIGKILL, no clean-up) at the N-th step."""
    global _steps
    _steps += 1
    at = os.environ.get(CRASH_ENV)
    if at and _steps == int(at):
        os.kill(os.getpid(), signal.SIGKILL)


def replace(src: str | Path, dst: str | Path) -> None:
    """``os.replace`` as one counted write step (:func:`write_step`)."""
    write_step()
    os.replace(src, dst)


class LinkError(OSError):
    """A symbolic link (or a device, FIFO, socket) met while copying; links are never followed."""


_NOFOLLOW = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def copy_file(src: str | Path, dst: str | Path) -> str:
    """Copy the regular file ``src`` to ``dst`` without following a link at its last component
    (checked again on the open file); returns the sha256 of the bytes copied."""
    try:
        fd = os.open(src, _NOFOLLOW)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise LinkError(err.errno, "is a symbolic link; links are never followed", str(src)) from None
        raise
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise LinkError(0, "is not a regular file", str(src))
        with open(dst, "xb") as out:
            while block := fh.read(1 << 20):
                digest.update(block)
                out.write(block)
    return digest.hexdigest()


def copy_tree(src: str | Path, dst: str | Path, skip_hidden: bool = False) -> dict[str, str]:
    """Copy the folder ``src`` to the new folder ``dst``, never following a link: every entry is
    checked with ``lstat`` and every file opened with ``O_NOFOLLOW`` (:func:`copy_file`), so a
    file swapped for a link after the check is refused too. Returns ``{relative path: sha256}``."""
    src, dst = Path(src), Path(dst)
    if not stat.S_ISDIR(os.lstat(src).st_mode):
        raise LinkError(0, "is not a folder (a link?); links are never followed", str(src))
    copied: dict[str, str] = {}
    dst.mkdir(parents=True)
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if skip_hidden and entry.name.startswith("."):
            continue
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            copied.update({f"{entry.name}/{rel}": sha for rel, sha in
                           copy_tree(entry.path, dst / entry.name, skip_hidden).items()})
        elif stat.S_ISREG(mode):
            copied[entry.name] = copy_file(entry.path, dst / entry.name)
        else:
            raise LinkError(0, "is a symbolic link or not a regular file; links are never followed", entry.path)
    return copied
