"""The one job runner: the app starts ``python -m core.<module> ...`` as a detached process.

A job survives leaving the page or closing the browser (own session, output to
``runs/jobs/<name>.log``). Its description (module, arguments, pid, the process's create time,
host, log) is kept in ``runs/jobs/<name>.json``; its progress lives in the store's run record,
which the CLI writes itself (``store.start_run`` records the pid, its create time and the host,
and a :class:`Heartbeat` thread stamps the record while the process lives).

- **Liveness** (:func:`process_alive`): psutil's process table plus the process's create time, so
  a pid the system has reused for another process never passes for the job (no ``/proc``).
- **Launch** (:func:`start_job`): check-then-launch runs under a ``filelock`` on
  ``runs/jobs/.launch.lock``, so two browser tabs clicking Start at once start one job; one job of
  a module per workspace unless ``allow_parallel=True``.
- **Stale runs** (:func:`run_gone`): a ``running`` record whose process is gone (killed, machine
  rebooted) — or, for a record written on another host, whose heartbeat is older than
  :data:`STALE_S` — is reported so the store marks it ``interrupted``.

Stopping sends SIGTERM to the job's process group (after checking it is still the job's
process) and marks a still-running run record ``stopped``; resuming relaunches the same command,
since every CLI resumes from its own checkpoints and caches.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import filelock
import psutil

from annotations.infra.fileio import read_json, write_json

REPO_ROOT = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,80}")  # fullmatch: "$" would allow a final newline
#: seconds between two heartbeats of a running job's run record
HEARTBEAT_S = 15.0
#: a record from another host is stale when its heartbeat is older than this (8 missed beats)
STALE_S = 8 * HEARTBEAT_S
#: seconds a launch waits for another launch in the same workspace to finish
LAUNCH_LOCK_S = 30.0
#: create times are floats from the kernel's boot clock; the same process reads equal to ~1 µs
_SAME_PROCESS_S = 0.01


def hostname() -> str:
    """The machine's host name (recorded with each run's process)."""
    return socket.gethostname()


def process_identity(pid: int | None = None) -> tuple[int, float]:
    """(pid, create time) of process ``pid`` (default: this one): what tells it from a later
    process that reuses the pid."""
    proc = psutil.Process(pid if pid is not None else os.getpid())
    return proc.pid, proc.create_time()


def process_alive(pid: int | None, create_time: float | None = None) -> bool:
    """True while process ``pid`` exists, is not a zombie and — when ``create_time`` is given —
    is the process created then (a reused pid is not). A zombie child of ours is reaped."""
    if not pid:
        return False
    try:
        proc = psutil.Process(int(pid))
        if create_time is not None and abs(proc.create_time() - float(create_time)) > _SAME_PROCESS_S:
            return False
        if proc.status() == psutil.STATUS_ZOMBIE:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, os.WNOHANG)
            return False
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # it exists; another user's process cannot be ours, but cannot be ruled out either
    return True


def _timestamp(value: Any) -> float | None:
    """Epoch seconds of an ISO 8601 stamp (UTC when naive), None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def run_gone(run: dict[str, Any], now: float | None = None) -> str | None:
    """Why a ``running`` run record's process is gone, or None while it may still be running.

    On this host: the recorded pid and create time (psutil). From another host (or with no pid):
    a heartbeat older than :data:`STALE_S`. Records of an older schema, with a pid but neither
    create time nor host, are gone only when no process has that pid any more.
    """
    if run.get("status") != "running":
        return None
    pid, created, host = run.get("pid"), run.get("pid_created"), run.get("host")
    if pid and (host == hostname() or (host is None and created is None)):
        if process_alive(pid, created):
            return None
        return f"process {pid} ended without finishing the run (killed or crashed); rerun to resume"
    beat = _timestamp(run.get("heartbeat"))
    if beat is None:
        return None
    age = (now if now is not None else time.time()) - beat
    if age > STALE_S:
        where = f" on {host}" if host else ""
        return f"no heartbeat from process {pid}{where} for {age:.0f} s; rerun to resume"
    return None


class Heartbeat:
    """A daemon thread calling ``beat()`` every ``interval`` s until stopped or ``beat()`` says
    the run is over (returns False); a failing beat (database busy) is retried next time."""

    def __init__(self, beat: Callable[[], bool], interval: float | None = None) -> None:
        self._beat = beat
        self.interval = HEARTBEAT_S if interval is None else interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="triderm-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                running = self._beat()
            except Exception:
                running = True
            if not running:
                return

    def stop(self) -> None:
        """Stop the heartbeat thread after its current beat."""
        self._stop.set()


# -- job records -----------------------------------------------------------------------------------
def jobs_dir(ws: Any) -> Path:
    """``<workspace>/runs/jobs`` (created)."""
    path = Path(ws.runs_dir) / "jobs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _record_path(ws: Any, name: str) -> Path:
    if not _NAME.fullmatch(name):
        raise ValueError(f"job name {name!r} must match {_NAME.pattern}")
    return jobs_dir(ws) / f"{name}.json"


def start_job(ws: Any, name: str, module: str, args: list[str], env: dict[str, str] | None = None,
              pass_workspace: bool = True, allow_parallel: bool = False) -> dict[str, Any]:
    """Launch ``python -m core.<module> [--workspace <ws>] <args>`` detached; return its record.

    Under the workspace's launch lock, refuses (ValueError) a job whose previous launch under the
    same name still runs, and — unless ``allow_parallel`` — a second running job of ``module``.
    """
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", module):
        raise ValueError(f"module {module!r} is not a core module name")
    path = _record_path(ws, name)
    lock = filelock.FileLock(str(jobs_dir(ws) / ".launch.lock"), timeout=LAUNCH_LOCK_S)
    try:
        with lock:
            existing = job(ws, name)
            if existing and existing["alive"]:
                raise ValueError(f"job {name!r} is still running (pid {existing['pid']}); stop it first")
            if not allow_parallel:
                for other in jobs(ws):
                    if other["alive"] and other["module"] == module:
                        raise ValueError(f"a core.{module} job ({other['name']!r}, pid {other['pid']}) is already "
                                         "running in this workspace; stop it first")
            record = _launch(ws, name, module, args, env, pass_workspace, allow_parallel)
            write_json(path, record, indent=1)
    except filelock.Timeout as exc:
        raise ValueError(f"another job launch in {ws.root} has held {lock.lock_file} for over "
                         f"{LAUNCH_LOCK_S:.0f} s; try again") from exc
    return {**record, "alive": True}


def _launch(ws: Any, name: str, module: str, args: list[str], env: dict[str, str] | None,
            pass_workspace: bool, allow_parallel: bool) -> dict[str, Any]:
    log_path = jobs_dir(ws) / f"{name}.log"
    where = ["--workspace", str(Path(ws.root).resolve())] if pass_workspace else []
    cmd = [sys.executable, "-m", f"core.{module}", *where, *map(str, args)]
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), child_env.get("PYTHONPATH", "")]))
    with open(log_path, "ab") as log:
        log.write(f"\n$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env, start_new_session=True,
        )
    try:
        _, created = process_identity(proc.pid)
    except psutil.NoSuchProcess:  # exited (and was reaped) already: nothing can reuse its identity
        created = time.time()
    return {
        "name": name, "module": module, "args": list(map(str, args)), "cmd": cmd, "pid": proc.pid,
        "create_time": created, "host": hostname(), "started": time.time(), "log": str(log_path),
        "env": env or {}, "pass_workspace": pass_workspace, "allow_parallel": allow_parallel,
    }


def job(ws: Any, name: str) -> dict[str, Any] | None:
    """A job's record with ``alive`` and its store ``run``, or None if unknown.

    A job launched on another host is alive while its run record is ``running`` (the store marks
    it ``interrupted`` once its heartbeat goes stale)."""
    path = _record_path(ws, name)
    if not path.exists():
        return None
    record = read_json(path)
    record["run"] = run_of(ws, record)
    if record.get("host", hostname()) == hostname():
        record["alive"] = process_alive(record.get("pid"), record.get("create_time"))
    else:
        record["alive"] = bool(record["run"] and record["run"]["status"] == "running")
    return record


def jobs(ws: Any) -> list[dict[str, Any]]:
    """Every job launched in this workspace, newest first."""
    found = [job(ws, p.stem) for p in jobs_dir(ws).glob("*.json")]
    return sorted((j for j in found if j), key=lambda j: j["started"], reverse=True)


def run_of(ws: Any, record: dict[str, Any]) -> dict[str, Any] | None:
    """The newest store run started by this job's process (same pid and create time)."""
    created = record.get("create_time")
    for run in ws.store.runs():
        if run.get("pid") != record.get("pid"):
            continue
        if created is not None and run.get("pid_created") is not None:
            if abs(run["pid_created"] - created) <= _SAME_PROCESS_S:
                return run
        elif (_timestamp(run.get("created")) or float("inf")) >= record["started"] - 5:
            return run
    return None


def stop_job(ws: Any, name: str, grace: float = 5.0) -> bool:
    """SIGTERM the job's process group (SIGKILL after ``grace`` s); mark its run ``stopped``.

    Returns True when a running process was signalled; a pid now held by another process is
    never signalled."""
    record = job(ws, name)
    if record is None:
        raise ValueError(f"unknown job {name!r}")
    signalled = False
    if record["alive"] and record.get("host", hostname()) == hostname():
        pid, created = record["pid"], record.get("create_time")
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not process_alive(pid, created):
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
                signalled = True
            deadline = time.monotonic() + grace
            while process_alive(pid, created) and time.monotonic() < deadline:
                time.sleep(0.1)
    run = run_of(ws, record)
    if run is not None and run.get("status") in ("running", "interrupted"):
        ws.store.finish_run(run["id"], status="stopped")
    return signalled


def resume_job(ws: Any, name: str) -> dict[str, Any]:
    """Relaunch a stopped or finished job with its original command (the CLI resumes itself)."""
    record = job(ws, name)
    if record is None:
        raise ValueError(f"unknown job {name!r}")
    return start_job(ws, name, record["module"], record["args"], env=record.get("env") or None,
                     pass_workspace=record.get("pass_workspace", True),
                     allow_parallel=record.get("allow_parallel", False))


def tail_log(ws: Any, name: str, lines: int = 40) -> str:
    """Last ``lines`` lines of a job's log ('' if none); tqdm carriage returns become newlines."""
    path = jobs_dir(ws) / f"{name}.log"
    if not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - 64_000))
        text = fh.read().decode("utf-8", "replace").replace("\r", "\n")
    return "\n".join([ln for ln in text.splitlines() if ln.strip()][-lines:])
