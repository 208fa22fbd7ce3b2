"""Who holds a workspace: the app's server processes and the jobs working in it.

- **The app**: each app server process registers itself (:func:`register`, once per process and
  workspace) in ``<workspace>/cache/holders/<host>-<pid>.json`` (pid, its create time, host, the
  program without its arguments); a daemon thread touches the file every
  :data:`annotations.infra.jobs.HEARTBEAT_S` seconds (writing it again if it was deleted) and the file goes
  when the process exits.
- **Jobs**: a job's run record in the store (``running``, with pid, create time, host and heartbeat:
  :meth:`annotations.store.store.Store.start_run`) and the launch record of a job the app started
  (``runs/jobs/<name>.json``).

A holder is *live* while its process runs (on this host: the same pid and create time,
:func:`annotations.infra.jobs.process_alive`) and, for a registered one, its heartbeat is younger than
:data:`annotations.infra.jobs.STALE_S`; from another host, while its heartbeat is that young. A killed
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

from annotations.infra import jobs
from annotations.infra.fileio import read_json, write_json
from annotations.infra.workspace import DB_NAME
from annotations.store.run_records import running_runs

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
    """The live holders of the workspace ``root`` other than this process: registered app processes
    (with ``heartbeat_age_s``), running jobs' run records and running launched jobs; stale files of
    ended processes on this host are removed."""
    root = Path(root)
    now = time.time() if now is None else now
    me, host = os.getpid(), jobs.hostname()
    out = []
    for path in sorted((root / FOLDER).glob("*.json")):
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
    seen = {(r.get("host"), r.get("pid")) for r in out}
    for run in _running_runs(root):
        if run.get("pid") != me and jobs.run_gone(run, now) is None and (run.get("host"), run.get("pid")) not in seen:
            seen.add((run.get("host"), run.get("pid")))
            out.append({"pid": run.get("pid"), "host": run.get("host"), "command": f"run #{run['id']} {run['kind']}"})
    for path in sorted((root / "runs" / "jobs").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            job = read_json(path)
            if (isinstance(job, dict) and job.get("host") == host and job.get("pid") != me
                    and (host, job.get("pid")) not in seen and jobs.process_alive(job.get("pid"), job.get("create_time"))):
                seen.add((host, job.get("pid")))
                out.append({"pid": job["pid"], "host": host, "command": f"job {path.stem} (core.{job.get('module')})"})
    return out


def _running_runs(root: Path) -> list[dict[str, Any]]:
    """The store's ``running`` run records, read only (none when there is no store yet)."""
    path = root / DB_NAME
    if not path.is_file():
        return []
    return running_runs(path)


def describe(holder: dict[str, Any]) -> str:
    """One holder in words: pid, host and command."""
    return f"pid {holder.get('pid')} on {holder.get('host')} ({holder.get('command') or 'unknown command'})"
