"""The LLM oracle at registry scale: several Ollama servers at once (per-host concurrency, a dead
host's questions asked of the others, counts per host) and OpenAI-compatible servers, all on
loopback stubs."""
from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ollama_stub import OllamaStub, stub_choice
from openai_stub import OpenAIStub

from core import llm_triplets
from core.text.llm import PROMPT_VERSION, build_messages
from core.text.queries import photo_texts
from core.text.sampling import uniform_order


def _plan(ws, budget: int, seed: int = 5) -> list[tuple[str, str, str]]:
    ids = list(photo_texts(ws))
    return [tuple(ids[int(x)] for x in q) for q in uniform_order(len(ids), seed)[:budget]]


def _free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_questions_spread_over_hosts_with_per_host_concurrency(demo_workspace, capsys):
    ws, budget = demo_workspace, 24
    with OllamaStub(delay_s=0.2) as a, OllamaStub(delay_s=0.2) as b:
        assert llm_triplets.main(["--workspace", str(ws.root), "--oracle", "ollama", "--ollama-host", a.host,
                                  "--ollama-host", b.host, "--model", "stub-model", "--budget", str(budget),
                                  "--seed", "5", "--concurrency", "2"]) == 0
    assert a.max_in_flight == 2 and b.max_in_flight == 2
    assert len(a.chats) + len(b.chats) == budget and min(len(a.chats), len(b.chats)) >= budget // 4
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert summary["estimate"]["concurrency"] == 4
    hosts = summary["hosts"]
    assert {h: s["answered"] for h, s in hosts.items()} == {a.host: len(a.chats), b.host: len(b.chats)}
    assert all(s["failed"] == 0 and s["dead"] is None for s in hosts.values())
    assert f"{a.host}: answered {len(a.chats)}, failed 0" in out.err
    stored = [(r["anchor"], r["ref_j"], r["ref_k"]) for r in ws.store.llm_answers("ollama", "stub-model",
                                                                                  PROMPT_VERSION)]
    assert stored == _plan(ws, budget)


def test_a_dead_hosts_questions_go_to_the_others(demo_workspace, capsys):
    """Host A answers a few questions, then goes down mid-run: every question is still answered, by B."""
    ws, budget = demo_workspace, 20
    with OllamaStub(delay_s=0.05) as b:
        a = OllamaStub(delay_s=0.05).start()

        def kill_a() -> None:
            while len(a.chats) < 3:
                time.sleep(0.01)
            a.stop()

        killer = threading.Thread(target=kill_a, daemon=True)
        killer.start()
        code = llm_triplets.main(["--workspace", str(ws.root), "--oracle", "ollama", "--ollama-host", a.host,
                                  "--ollama-host", b.host, "--model", "stub-model", "--budget", str(budget),
                                  "--seed", "5", "--retries", "1", "--connect-timeout", "1"])
        killer.join(5)
    assert code == 0
    out = capsys.readouterr()
    hosts = json.loads(out.out)["hosts"]
    assert hosts[a.host]["dead"] and "refused" in hosts[a.host]["dead"] and hosts[b.host]["dead"] is None
    assert hosts[a.host]["answered"] >= 1 and hosts[a.host]["answered"] + hosts[b.host]["answered"] == budget
    assert f"host {a.host} is down" in out.err and "DOWN" in out.err
    assert len(ws.store.llm_answers("ollama", "stub-model", PROMPT_VERSION)) == budget


def test_a_host_down_from_the_start_is_reported_and_skipped_and_all_down_is_exit_2(demo_workspace, capsys):
    ws = demo_workspace
    dead = f"http://127.0.0.1:{_free_port()}"
    with OllamaStub() as b:
        assert llm_triplets.main(["--workspace", str(ws.root), "--oracle", "ollama", "--ollama-host", dead,
                                  "--ollama-host", b.host, "--model", "stub-model", "--budget", "5"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["hosts"][b.host]["answered"] == 5 and f"host {dead}" in out.err
    with pytest.raises(SystemExit) as exit_:
        llm_triplets.main(["--workspace", str(ws.root), "--oracle", "ollama", "--ollama-host", dead,
                           "--ollama-host", f"http://127.0.0.1:{_free_port()}", "--model", "stub-model",
                           "--budget", "5"])
    assert exit_.value.code == 2 and "no host can answer" in capsys.readouterr().err


def test_an_openai_compatible_server_answers_through_the_same_pipeline(demo_workspace, capsys, monkeypatch):
    ws, budget = demo_workspace, 8
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    with OpenAIStub() as stub:
        assert llm_triplets.main(["--workspace", str(ws.root), "--oracle", "openai", "--base-url", stub.base_url,
                                  "--model", "stub-model", "--budget", str(budget), "--seed", "5"]) == 0
    rows = ws.store.llm_answers("openai", "stub-model", PROMPT_VERSION)
    assert [(r["anchor"], r["ref_j"], r["ref_k"]) for r in rows] == _plan(ws, budget)
    texts = photo_texts(ws)
    for r in rows:  # the stub's deterministic choice for each stored prompt
        user = build_messages(texts[r["anchor"]], texts[r["ref_j"]], texts[r["ref_k"]])[1]["content"]
        assert r["choice"] == stub_choice(user)
    body = stub.chats[0]
    assert body["response_format"]["type"] == "json_schema" and body["temperature"] == 0
    assert set(stub.auth) == {"Bearer sk-local-test"}
    assert [t["source"] for t in ws.store.triplets(source="llm:stub-model")][:1] == ["llm:stub-model"]
    capsys.readouterr()


@pytest.mark.parametrize(("argv", "message"), [
    (["--oracle", "openai"], "--oracle openai needs --base-url"),
    (["--oracle", "ollama", "--base-url", "http://127.0.0.1:8000/v1"], "--base-url is for --oracle openai"),
])
def test_openai_flag_errors(demo_workspace, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        llm_triplets.main(["--workspace", str(demo_workspace.root), *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_an_openai_url_off_the_allow_list_is_refused_before_any_request(demo_workspace, capsys, monkeypatch):
    monkeypatch.setenv("TRIDERM_OLLAMA_HOSTS", "gpu1.example.org")
    with OpenAIStub() as stub, pytest.raises(SystemExit) as exit_:
        llm_triplets.main(["--workspace", str(demo_workspace.root), "--oracle", "openai", "--base-url",
                           stub.base_url, "--model", "stub-model", "--budget", "3"])
    assert exit_.value.code == 2 and "not on this installation's allow-list" in capsys.readouterr().err
    assert stub.chats == [] and demo_workspace.store.runs() == []


def test_a_model_the_openai_server_does_not_serve_is_one_clear_error(demo_workspace, capsys):
    with OpenAIStub(models=("other",)) as stub, pytest.raises(SystemExit) as exit_:
        llm_triplets.main(["--workspace", str(demo_workspace.root), "--oracle", "openai", "--base-url",
                           stub.base_url, "--model", "stub-model", "--budget", "3"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "model 'stub-model' is not served" in err and "other" in err


def test_a_question_one_host_fails_is_asked_of_another(demo_workspace, capsys):
    """Host A answers every chat with HTTP 500 (no retries): its questions are answered by B, and
    A's failures are counted against A."""
    ws, budget = demo_workspace, 6
    with OllamaStub(behaviour="error500") as a, OllamaStub() as b:
        assert llm_triplets.main(["--workspace", str(ws.root), "--oracle", "ollama", "--ollama-host", a.host,
                                  "--ollama-host", b.host, "--model", "stub-model", "--budget", str(budget),
                                  "--retries", "0", "--concurrency", "1"]) == 0
    hosts = json.loads(capsys.readouterr().out)["hosts"]
    assert hosts[a.host] == {"answered": 0, "failed": len(a.chats), "dead": None} and len(a.chats) >= 1
    assert hosts[b.host]["answered"] == budget == len(ws.store.llm_answers("ollama", "stub-model", PROMPT_VERSION))
