"""Who holds a workspace: one heartbeat file per process that has it open.

Every process that opens a :class:`annotations.workspace.Workspace` (each app server, every job, every
command) registers itself in ``<workspace>/cache/holders/<host>-<pid>.json`` (pid, its create time, host,
program, never its arguments) and a daemon thread touches the file every
:data:`annotations.jobs.HEARTBEAT_S` seconds (writing it again if it was deleted); the file goes
when the process exits. A holder is *live* while its process runs (on this host: the same pid
and create time, :func:`annotations.jobs.process_alive`) and its heartbeat is younger than
:data:`annotations.jobs.STALE_S`; from another host, while its heartbeat is that young. A killed
process's file is stale: ignored, and removed when seen. ``restore`` refuses to replace a workspace
that any other live process holds (:func:`live`).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from annotations import jobs
from annotations.fileio import read_json, write_json

FOLDER = Path("cache", "holders")
_lock = threading.Lock()
_held: dict[Path, dict[str, Any]] = {}
_heartbeat: list[jobs.Heartbeat] = []


def _file(root: Path, host: str, pid: int) -> Path:
    return root / FOLDER / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', host)}-{pid}.json"


def register(root: str | Path) -> Path:
    """Record this process as a holder of the workspace ``root`` (once per process); returns its file."""
    pid, created = jobs.process_identity()
    path = _file(Path(root), jobs.hostname(), pid)
    with _lock:
        if path in _held:
            return path
        record = {"pid": pid, "create_time": created, "host": jobs.hostname(), "command": _program(),
                  "started": time.time()}
        _write(path, record)
        _held[path] = record
        if not _heartbeat:
            _heartbeat.append(jobs.Heartbeat(_beat))
            atexit.register(_release)
    return path


def _program() -> str:
    """The program, without its arguments (they may name a patient): ``python -m core.x`` or the script."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if "-m" in argv[:-1]:
        return f"python -m {argv[argv.index('-m') + 1]}"
    if not sys.argv or sys.argv[0] in ("", "-c"):
        return "python -c" if sys.argv and sys.argv[0] == "-c" else "python"
    return Path(sys.argv[0]).name


def _write(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_json(path, record)


def _beat() -> bool:
    """Touch every file this process holds (one deleted meanwhile is written again)."""
    with _lock:
        for path, record in _held.items():
            try:
                os.utime(path)
            except FileNotFoundError:
                with contextlib.suppress(OSError):
                    _write(path, record)
            except OSError:
                continue
    return True


def _release() -> None:
    with _lock:
        for path in _held:
            with contextlib.suppress(OSError):
                path.unlink()
        _held.clear()


def live(root: str | Path, now: float | None = None) -> list[dict[str, Any]]:
    """The live holders of the workspace ``root`` other than this process (their records, with
    ``heartbeat_age_s``); stale files of ended processes on this host are removed."""
    folder = Path(root) / FOLDER
    if not folder.is_dir():
        return []
    now = time.time() if now is None else now
    me, host = os.getpid(), jobs.hostname()
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            record = read_json(path)
            age = now - path.stat().st_mtime
        except (OSError, ValueError):
            continue  # being written or removed right now
        if not isinstance(record, dict):
            continue
        here = record.get("host") == host
        if here and record.get("pid") == me:
            continue
        if here and not jobs.process_alive(record.get("pid"), record.get("create_time")):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if age <= jobs.STALE_S:
            out.append({**record, "heartbeat_age_s": round(age, 1)})
    return out


def describe(holder: dict[str, Any]) -> str:
    """One holder in words: pid, host and command."""
    return f"pid {holder.get('pid')} on {holder.get('host')} ({holder.get('command') or 'unknown command'})"
