"""The one job runner: psutil identity (pid + create time), the launch lock, heartbeats, and run
records whose process is gone becoming ``interrupted``."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import filelock
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ollama_stub import OllamaStub

from annotations.infra import jobs
from annotations.infra.workspace import Workspace
from annotations.store.rows import now

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# a job that runs for minutes unless stopped: a large phantom dataset
LONG_JOB = ["--photos", "400", "--wounds", "800", "--patients", "80"]


def _wait(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_sigkilled_run_becomes_interrupted(tmp_path) -> None:
    ws = Workspace(tmp_path / "ws")
    code = ("import sys, time; from annotations.infra.workspace import Workspace; "
            "ws = Workspace(sys.argv[1]); print(ws.store.start_run('fusion', {}), flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(ws.root)], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, text=True)
    try:
        run_id = int(proc.stdout.readline())
        assert ws.store.run(run_id)["status"] == "running"  # alive: left alone
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    listed = ws.store.runs()
    assert [r["status"] for r in listed] == ["interrupted"]
    assert f"process {proc.pid} ended" in listed[0]["message"] and listed[0]["finished"]
    assert ws.store.run(run_id)["status"] == "interrupted"
    assert ws.store.runs(status="running") == []


def test_a_reused_pid_does_not_pass_for_the_job(tmp_path) -> None:
    ws = Workspace(tmp_path / "ws")
    pid, created = jobs.process_identity()
    assert jobs.process_alive(pid, created)
    assert not jobs.process_alive(pid, created - 30)  # same pid, another (earlier) process
    run_id = ws.store.start_run("fusion", {})
    assert ws.store.run(run_id)["status"] == "running"
    # the record says the pid belonged to a process created a minute earlier: this one reuses it
    ws.store.db.execute("UPDATE runs SET pid_created = pid_created - 60 WHERE id = ?", [run_id])
    assert ws.store.run(run_id)["status"] == "interrupted"
    # a job record whose pid is now held by another process is dead and is never signalled
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        _, bystander_created = jobs.process_identity(bystander.pid)
        record = {"name": "old", "module": "phantoms", "args": [], "cmd": [], "pid": bystander.pid,
                  "create_time": bystander_created - 60, "host": jobs.hostname(), "started": time.time() - 120,
                  "log": "", "env": {}, "pass_workspace": False}
        (jobs.jobs_dir(ws) / "old.json").write_text(json.dumps(record))
        assert not jobs.job(ws, "old")["alive"]
        assert not jobs.stop_job(ws, "old", grace=0.2)
        assert bystander.poll() is None  # still running: not killed
    finally:
        bystander.kill()
        bystander.wait()


def test_heartbeat_while_running_and_stale_heartbeat_from_another_host(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(jobs, "HEARTBEAT_S", 0.05)
    ws = Workspace(tmp_path / "ws")
    run_id = ws.store.start_run("fusion", {})
    first = ws.store.run(run_id)["heartbeat"]
    _wait(lambda: ws.store.run(run_id)["heartbeat"] != first, "a heartbeat")
    beat = ws.store._heartbeats[run_id]
    ws.store.finish_run(run_id)
    beat._thread.join(timeout=60)  # the beat stops with the run: its thread ends (event, not a sleep)
    assert not beat._thread.is_alive(), "the heartbeat thread still runs after finish_run"
    finished = ws.store.run(run_id)["heartbeat"]
    assert ws.store._beat(run_id) is False and ws.store.run(run_id)["heartbeat"] == finished
    far = {"status": "running", "pid": 12345, "pid_created": 1.0, "host": "another-host"}
    assert jobs.run_gone({**far, "heartbeat": now()}) is None
    stale = time.time() - jobs.STALE_S - 5
    reason = jobs.run_gone({**far, "heartbeat": datetime.fromtimestamp(stale, timezone.utc).isoformat()})
    assert reason is not None and "another-host" in reason


def test_concurrent_launches_start_one_job(tmp_path) -> None:
    ws = Workspace(tmp_path / "ws")
    go = tmp_path / "go"
    code = ("import sys, time, pathlib; from annotations.infra import jobs; from annotations.infra.workspace import Workspace\n"
            "ws = Workspace(sys.argv[1]); go = pathlib.Path(sys.argv[2])\n"
            "pathlib.Path(sys.argv[4] + '.ready').touch()\n"
            "while not go.exists(): time.sleep(0.005)\n"
            "try:\n"
            "    jobs.start_job(ws, 'phantoms-' + sys.argv[3], 'phantoms', ['--out', sys.argv[4], *sys.argv[5:]],"
            " pass_workspace=False)\n"
            "    print('started')\n"
            "except ValueError as e:\n"
            "    print('refused:', e)\n")
    tabs = [subprocess.Popen([sys.executable, "-c", code, str(ws.root), str(go), name, str(tmp_path / f"out{i}"),
                              *LONG_JOB], cwd=REPO, env=ENV, stdout=subprocess.PIPE, text=True)
            for i, name in enumerate(["a", "a", "b", "c"])]  # two tabs, same job; two more of the same kind
    try:
        _wait(lambda: all((tmp_path / f"out{i}.ready").exists() for i in range(len(tabs))),
              "every tab to reach the start line", timeout=300)
        go.touch()
        outs = [t.communicate(timeout=120)[0].strip() for t in tabs]
        assert sum(o == "started" for o in outs) == 1, outs
        assert all(o.startswith("refused:") for o in outs if o != "started"), outs
        assert any("already running" in o for o in outs) or any("still running" in o for o in outs)
        alive = [j for j in jobs.jobs(ws) if j["alive"]]
        assert len(alive) == 1
        # asked for, a second job of the same module runs beside it
        extra = jobs.start_job(ws, "phantoms-extra", "phantoms", ["--out", str(tmp_path / "x"), *LONG_JOB],
                               pass_workspace=False, allow_parallel=True)
        assert extra["alive"] and len([j for j in jobs.jobs(ws) if j["alive"]]) == 2
    finally:
        for j in jobs.jobs(ws):
            if j["alive"]:
                jobs.stop_job(ws, j["name"], grace=2)
    assert not any(j["alive"] for j in jobs.jobs(ws))


def test_a_held_launch_lock_is_one_clear_error(tmp_path, monkeypatch) -> None:
    ws = Workspace(tmp_path / "ws")
    monkeypatch.setattr(jobs, "LAUNCH_LOCK_S", 0.2)
    with filelock.FileLock(str(jobs.jobs_dir(ws) / ".launch.lock")), \
            pytest.raises(ValueError, match="another job launch"):
        jobs.start_job(ws, "p", "phantoms", ["--out", str(tmp_path / "o")], pass_workspace=False)
    assert jobs.jobs(ws) == []


def test_a_sigkilled_background_job_shows_interrupted(demo_workspace) -> None:
    ws = demo_workspace
    with OllamaStub(delay_s=0.2) as stub:
        rec = jobs.start_job(ws, "llm", "llm_triplets", ["--oracle", "ollama", "--ollama-host", stub.host,
                                                         "--model", "stub-model", "--budget", "200"])
        _wait(lambda: len(stub.chats) >= 2, "the job's first questions", timeout=120)
        record = jobs.job(ws, "llm")
        assert record["alive"] and record["run"]["status"] == "running"
        os.killpg(rec["pid"], signal.SIGKILL)
        _wait(lambda: not jobs.job(ws, "llm")["alive"], "the job to die")
    record = jobs.job(ws, "llm")
    assert record["run"]["status"] == "interrupted" and "killed or crashed" in record["run"]["message"]
