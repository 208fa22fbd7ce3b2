"""LLM runs that cannot go on stop and say so: failures after retries (exit 1, --max-failures),
an unreachable server (exit 2 at once), hosts off the allow-list, no retry of programming errors;
the LLM page starts exactly the submitted settings, with the host chosen from the allow-list."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ollama_stub import OllamaStub

from annotations.accounts import accounts
from annotations.infra import jobs
from annotations.infra.workspace import Workspace
from core import llm_triplets
from core.text.llm import (
    OLLAMA_HOSTS_ENV,
    OllamaOracle,
    OracleUnavailable,
    allowed_ollama_host,
    ollama_hosts,
)

REPO = Path(__file__).resolve().parents[2]


def stub_cli(ws: Workspace, host: str, *extra: str) -> list[str]:
    return ["--workspace", str(ws.root), "--oracle", "ollama", "--ollama-host", host, "--model", "stub-model",
            "--retries", "0", *extra]


def test_failures_stop_at_max_failures_and_exit_1(demo_workspace, capsys) -> None:
    ws = demo_workspace
    with OllamaStub(behaviour="error500") as stub:
        assert llm_triplets.main(stub_cli(ws, stub.host, "--budget", "20", "--max-failures", "3")) == 1
        assert len(stub.chats) <= 4  # stopped at the third failure (+ at most one more in flight), not after 20
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert (summary["asked"], summary["answered"], summary["failed"]) == (3, 0, 3)
    assert "asked 3, answered 0, failed 3, cached 0" in out.err and "--max-failures 3" in out.err
    run = ws.store.runs(kind="llm-triplets")[0]
    assert run["status"] == "failed" and "HTTP 500" in run["message"]


def test_any_failed_question_exits_1_and_a_rerun_asks_only_those(demo_workspace, capsys) -> None:
    ws = demo_workspace
    with OllamaStub() as stub:
        stub.queue("error500", 2)
        assert llm_triplets.main(stub_cli(ws, stub.host, "--budget", "10")) == 1
        first = json.loads(capsys.readouterr().out)
        assert (first["answered"], first["failed"]) == (8, 2)
        stub.reset_counts()
        assert llm_triplets.main(stub_cli(ws, stub.host, "--budget", "10")) == 0
        again = json.loads(capsys.readouterr().out)
        assert (again["asked"], again["from_cache"], again["failed"]) == (2, 8, 0) and len(stub.chats) == 2


def test_unreachable_server_exits_2_at_once(tmp_path) -> None:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "core.llm_triplets", "--workspace", str(tmp_path / "ws"),
                          "--oracle", "ollama", "--ollama-host", "http://127.0.0.1:9"],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 2
    assert "cannot reach an Ollama server at http://127.0.0.1:9" in out.stderr
    assert out.stderr.count("\n") == 1  # one clear line, no traceback
    print(f"unreachable server: exit 2 after {time.monotonic() - started:.1f} s")


def test_host_outside_the_allow_list_is_one_clear_error(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv(OLLAMA_HOSTS_ENV, raising=False)
    ws = Workspace(tmp_path / "ws")
    with OllamaStub() as stub:  # a live server the workspace has not allowed
        ws.store.set_meta("ollama_hosts", ["gpu-box"])
        with pytest.raises(SystemExit) as exc:
            llm_triplets.main(stub_cli(ws, stub.host))
        assert exc.value.code == 2 and stub.tags_requests == 0 and stub.chats == []
        assert "not on this installation's allow-list (gpu-box)" in capsys.readouterr().err
        monkeypatch.setenv(OLLAMA_HOSTS_ENV, "gpu-box, 127.0.0.1")  # the CLI override
        OllamaOracle("stub-model", host=stub.host).check()
    assert ws.store.runs() == []


def test_allow_list_rules(monkeypatch) -> None:
    monkeypatch.delenv(OLLAMA_HOSTS_ENV, raising=False)
    assert ollama_hosts() == ["localhost", "127.0.0.1", "::1"]
    assert ollama_hosts(["http://gpu:11434"]) == ["http://gpu:11434"] and ollama_hosts([]) == []
    monkeypatch.setenv(OLLAMA_HOSTS_ENV, "a, b")
    assert ollama_hosts(["http://gpu:11434"]) == ["a", "b"]
    assert allowed_ollama_host("LOCALHOST", ["localhost"]) == "http://localhost:11434"
    assert allowed_ollama_host("http://[::1]:8000", ["::1"]) == "http://[::1]:8000"
    for host, allowed in [("http://gpu:11434", ["gpu:8080"]), ("http://127.0.0.1.evil.org", ["127.0.0.1"]),
                          ("http://me@evil.org@127.0.0.1", ["127.0.0.1"]), ("file:///etc/passwd", ["localhost"]),
                          ("http://localhost", [])]:
        with pytest.raises(ValueError):
            allowed_ollama_host(host, allowed)


def test_programming_errors_are_not_retried_and_a_vanished_server_ends_the_run() -> None:
    with OllamaStub() as stub:
        oracle = OllamaOracle("stub-model", host=stub.host, retries=3, backoff=0.01)
        calls = []

        class Broken:
            def chat(self, **kwargs):
                calls.append(kwargs)
                raise TypeError("a bug, not the network")

        oracle._client = Broken
        with pytest.raises(TypeError, match="a bug"):
            oracle.answer("a", "b", "c")
        assert len(calls) == 1
        host = stub.host
    with pytest.raises(OracleUnavailable, match="lost the Ollama server"):
        OllamaOracle("stub-model", host=host, retries=1, backoff=0.01).answer("a", "b", "c")


def test_llm_page_runs_exactly_the_submitted_settings(demo_workspace, monkeypatch, tmp_path) -> None:
    ws = demo_workspace
    monkeypatch.setenv("TRIDERM_WORKSPACE", str(ws.root))
    monkeypatch.setenv("TRIDERM_RESULTS_DIR", str(tmp_path / "no-results"))
    monkeypatch.delenv(OLLAMA_HOSTS_ENV, raising=False)
    ws.store.set_meta("ollama_hosts", ["http://gpu-a:11434", "http://gpu-b:11434"])
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=60)
    at.session_state["account"] = accounts.add_account(ws.store, "Rae", "researcher", "llm-page-password", "test")
    at.session_state["_cookie"] = accounts.issue_token(ws.store, accounts.secret_key(ws.root),
                                                       at.session_state["account"])
    at.run()
    at.switch_page("pages/3_LLM_oracle.py").run()
    assert not at.exception, at.exception
    next(s for s in at.selectbox if s.label == "Oracle").select("ollama").run()  # hosts shown for Ollama only
    host = next(s for s in at.selectbox if s.label == "Ollama host")
    assert host.options == ["http://gpu-a:11434", "http://gpu-b:11434"]  # no free text
    assert not any(t.label == "Ollama host" for t in at.text_input)
    host.select("http://gpu-b:11434")
    next(t for t in at.text_input if t.label == "Budget").input("5")
    try:
        next(b for b in at.button if b.label == "Start LLM run").click().run()
        assert not at.exception, at.exception
        record = jobs.job(ws, "llm-triplets")
        assert record is not None
        args = record["args"]
        assert args[args.index("--budget") + 1] == "5"
        assert args[args.index("--ollama-host") + 1] == "http://gpu-b:11434"
        assert args[args.index("--max-failures") + 1] == "5"
        assert any("--budget 5" in s.value for s in at.success)
    finally:
        if jobs.job(ws, "llm-triplets"):
            jobs.stop_job(ws, "llm-triplets", grace=2)
