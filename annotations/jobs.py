"""Background jobs: the app starts ``python -m core.<module> ...`` as a detached process.

A job survives leaving the page or closing the browser (own session, output to
``runs/jobs/<name>.log``). Its description (module, arguments, pid, log) is kept in
``runs/jobs/<name>.json``; its progress lives in the store's run record, which the CLI writes
itself (``store.start_run`` records the pid). Stopping sends SIGTERM to the job's process
group and marks a still-running run record ``stopped``; resuming relaunches the same command,
since every CLI resumes from its own checkpoints and caches.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,80}$")


def jobs_dir(ws: Any) -> Path:
    """``<workspace>/runs/jobs`` (created)."""
    path = Path(ws.runs_dir) / "jobs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _record_path(ws: Any, name: str) -> Path:
    if not _NAME.match(name):
        raise ValueError(f"job name {name!r} must match {_NAME.pattern}")
    return jobs_dir(ws) / f"{name}.json"


def pid_alive(pid: int | None) -> bool:
    """True while the process exists and is not a zombie (reaps it if it is our child)."""
    if not pid:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass  # not our child: fall through to a signal-0 probe
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return True
    return True


def start_job(ws: Any, name: str, module: str, args: list[str], env: dict[str, str] | None = None,
              pass_workspace: bool = True) -> dict[str, Any]:
    """Launch ``python -m core.<module> [--workspace <ws>] <args>`` detached; return its record.

    Refuses (ValueError) to start a job whose previous launch under the same name still runs.
    """
    if not re.match(r"^[a-z_][a-z0-9_]*$", module):
        raise ValueError(f"module {module!r} is not a core module name")
    existing = job(ws, name)
    if existing and existing["alive"]:
        raise ValueError(f"job {name!r} is still running (pid {existing['pid']}); stop it first")
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
    record = {
        "name": name, "module": module, "args": list(map(str, args)), "cmd": cmd, "pid": proc.pid,
        "started": time.time(), "log": str(log_path), "env": env or {},
        "pass_workspace": pass_workspace,
    }
    _record_path(ws, name).write_text(json.dumps(record, indent=1))
    return {**record, "alive": True}


def job(ws: Any, name: str) -> dict[str, Any] | None:
    """A job's record with ``alive`` and its store ``run`` (matched by pid), or None if unknown."""
    path = _record_path(ws, name)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    record["alive"] = pid_alive(record.get("pid"))
    record["run"] = run_of(ws, record)
    return record


def jobs(ws: Any) -> list[dict[str, Any]]:
    """Every job launched in this workspace, newest first."""
    found = [job(ws, p.stem) for p in jobs_dir(ws).glob("*.json")]
    return sorted((j for j in found if j), key=lambda j: j["started"], reverse=True)


def run_of(ws: Any, record: dict[str, Any]) -> dict[str, Any] | None:
    """The newest store run started by this job's process (its pid, started after launch)."""
    for run in ws.store.runs():
        if run.get("pid") == record.get("pid") and _run_time(run) >= record["started"] - 5:
            return run
    return None


def _run_time(run: dict[str, Any]) -> float:
    created = run.get("created") or run.get("started")
    if isinstance(created, (int, float)):
        return float(created)
    if isinstance(created, str):
        from datetime import datetime, timezone

        try:
            stamp = datetime.fromisoformat(created.replace("Z", "+00:00"))
        except ValueError:
            return float("inf")
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=timezone.utc)
        return stamp.timestamp()
    return float("inf")


def stop_job(ws: Any, name: str, grace: float = 5.0) -> bool:
    """SIGTERM the job's process group (SIGKILL after ``grace`` s); mark its run ``stopped``.

    Returns True when a running process was signalled.
    """
    record = job(ws, name)
    if record is None:
        raise ValueError(f"unknown job {name!r}")
    signalled = False
    if record["alive"]:
        try:
            os.killpg(record["pid"], signal.SIGTERM)
            signalled = True
        except ProcessLookupError:
            pass
        deadline = time.time() + grace
        while pid_alive(record["pid"]) and time.time() < deadline:
            time.sleep(0.1)
        if pid_alive(record["pid"]):
            try:
                os.killpg(record["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    run = run_of(ws, record)
    if run is not None and run.get("status") == "running":
        ws.store.finish_run(run["id"], status="stopped")
    return signalled


def resume_job(ws: Any, name: str) -> dict[str, Any]:
    """Relaunch a stopped or finished job with its original command (the CLI resumes itself)."""
    record = job(ws, name)
    if record is None:
        raise ValueError(f"unknown job {name!r}")
    return start_job(ws, name, record["module"], record["args"], env=record.get("env") or None,
                     pass_workspace=record.get("pass_workspace", True))


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
