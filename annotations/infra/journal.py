"""Crash-safe file swaps: a journal replayed or rolled back when the workspace is next opened.

An operation that changes files of a workspace together with its store (import, erase-patient,
restore) works in a folder ``.<kind>-XXXX`` inside the workspace, holding the staged files, the
files it replaces and ``journal.json``: every move ``src → dst`` it will make, written before
the first one. Each move is one rename, and the state of a half-done move can be read back from
the files themselves (is ``src`` still there? is the replaced file aside?), so a swap is resumed
forward or undone backward from any point, any number of times.

Whether a swap stands is decided by its commit point: ``meta`` swaps (import, erase) stand when
the store holds the meta key ``swap:<folder name>`` (set in the same transaction as the rows);
``marker`` swaps (restore, whose store is itself swapped) stand once ``committed`` is written.
:func:`recover` (run by :class:`annotations.infra.workspace.Workspace` when it opens) finishes or undoes
the swap of every such folder no live process holds (a lock file inside it), then removes the
folder, and with it stale staged photos.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import filelock

from annotations.infra.fileio import read_json, replace, write_json, write_text

#: The kinds of swap folders (``.<kind>-XXXX`` in the workspace).
KINDS = ("import", "erase", "restore")
JOURNAL = "journal.json"
LOCK = "lock"
COMMITTED = "committed"
#: A folder without its lock file this young may be a swap still being set up.
GRACE_S = 60.0


def _lexists(path: Path) -> bool:
    return os.path.lexists(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif _lexists(path):
        path.unlink()


class Swap:
    """One operation's swap folder ``.<kind>-XXXX`` inside ``root``, locked while it lives."""

    def __init__(self, root: Path, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"swap kind must be one of {KINDS}, got {kind!r}")
        self.root = Path(root)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=self.root))
        self._lock = filelock.FileLock(str(self.dir / LOCK))
        self._lock.acquire(timeout=0)
        self.entries: list[dict[str, Any]] = []
        self.settled = False

    @property
    def meta_key(self) -> str:
        """The store's meta key whose presence commits a ``meta`` swap."""
        return f"swap:{self.dir.name}"

    def plan(self, moves: Sequence[tuple[Path | None, Path]], commit: str) -> None:
        """Write the journal of ``moves`` (``(src, dst)``; ``src`` None: ``dst`` is only removed)
        before any of them is made; ``commit`` is ``meta`` or ``marker``."""
        def rel(p: str | Path) -> str:
            return Path(p).relative_to(self.root).as_posix()
        self.entries = [{"src": None if src is None else rel(src), "dst": rel(dst), "old": f"{self.dir.name}/old/{n}",
                         "had": _lexists(dst)} for n, (src, dst) in enumerate(moves)]
        (self.dir / "old").mkdir(exist_ok=True)
        write_json(self.dir / JOURNAL, {"commit": commit, "entries": self.entries})

    def forward(self) -> None:
        """Make every planned move."""
        _forward(self.root, self.entries)

    def backward(self) -> None:
        """Undo the moves made, putting back what was there."""
        _backward(self.root, self.entries)

    def mark_committed(self) -> None:
        """Mark the swap committed: a recovery then finishes it instead of undoing it."""
        write_text(self.dir / COMMITTED, "")

    def done(self) -> None:
        """Say that the swap is settled (made and committed, or undone): :meth:`close` may drop it."""
        self.settled = True

    def close(self) -> None:
        """Remove the folder (staged files, replaced files, journal) and release the lock; a swap
        planned but not settled (an error midway) keeps its folder for :func:`recover`."""
        if self.settled or not self.entries:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._lock.release()


def _paths(root: Path, entry: dict[str, Any]) -> tuple[Path | None, Path, Path]:
    parts = [entry["dst"], entry["old"]] + ([entry["src"]] if entry["src"] is not None else [])
    if any(Path(p).is_absolute() or ".." in Path(p).parts for p in parts):
        raise ValueError(f"journal entry {entry} points outside {root}")
    return (None if entry["src"] is None else root / entry["src"]), root / entry["dst"], root / entry["old"]


def _forward(root: Path, entries: list[dict[str, Any]]) -> None:
    """Make every move (resuming a half-done swap): the replaced file aside, then the new one in."""
    for entry in entries:
        src, dst, old = _paths(root, entry)
        if src is not None and not _lexists(src):
            continue  # already moved in
        if entry["had"] and _lexists(dst) and not _lexists(old):
            replace(dst, old)
        if src is not None:
            replace(src, dst)


def _backward(root: Path, entries: list[dict[str, Any]]) -> None:
    """Undo every move, last first (resuming a half-undone swap): the new file back to its staging
    place, the replaced one back where it was."""
    for entry in reversed(entries):
        src, dst, old = _paths(root, entry)
        if src is not None and not _lexists(src) and _lexists(dst):
            replace(dst, src)
        elif src is None and _lexists(dst) and (not entry["had"] or _lexists(old)):
            _remove(dst)  # made after the swap (e.g. a database's -wal beside a swapped-in store)
        if _lexists(old):
            replace(old, dst)


def pending(root: Path) -> list[Path]:
    """The swap folders in ``root`` (live or left by a killed process)."""
    try:
        return sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.is_symlink()
                      and any(p.name.startswith(f".{kind}-") for kind in KINDS))
    except FileNotFoundError:
        return []


def recover(root: Path, committed: Callable[[str], bool] | None, kinds: tuple[str, ...] = KINDS) -> list[str]:
    """Finish (committed) or undo every swap of ``kinds`` in ``root`` that no live process holds,
    then remove its folder; returns the folders handled. ``committed(meta_key)`` tells whether the
    store holds a ``meta`` swap's key (None: leave ``meta`` swaps alone)."""
    done = []
    for folder in pending(root):
        if not any(folder.name.startswith(f".{kind}-") for kind in kinds):
            continue
        lock_path = folder / LOCK
        if not lock_path.exists() and time.time() - folder.stat().st_mtime < GRACE_S:
            continue  # being set up right now
        lock = filelock.FileLock(str(lock_path))
        try:
            lock.acquire(timeout=0)
        except (filelock.Timeout, FileNotFoundError):
            continue  # a live operation holds it (or it vanished meanwhile)
        try:
            journal = folder / JOURNAL
            if journal.exists():
                plan = read_json(journal)
                if plan["commit"] == "meta":
                    if committed is None:
                        continue
                    stands = committed(f"swap:{folder.name}")
                else:
                    stands = (folder / COMMITTED).exists()
                (_forward if stands else _backward)(Path(root), plan["entries"])
            shutil.rmtree(folder, ignore_errors=True)
            done.append(folder.name)
        finally:
            with contextlib.suppress(OSError):
                lock.release()
    return done
