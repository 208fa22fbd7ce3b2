"""``--concurrency``: N requests in flight against the loopback Ollama stub, answers stored in
question order without duplicates, and the estimate printed before asking."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ollama_stub import OllamaStub

from core import llm_triplets
from core.text.llm import PROMPT_VERSION
from core.text.queries import photo_texts
from core.text.sampling import uniform_order


def test_concurrent_requests_in_flight_answers_stored_in_order(demo_workspace, capsys) -> None:
    ws = demo_workspace
    budget, concurrency = 24, 4
    # every fourth request is slow: answers complete out of order, the store must not follow them
    with OllamaStub(delay_of=lambda n: 0.8 if n % 4 == 1 else 0.3) as stub:
        assert llm_triplets.main(["--workspace", str(ws.root), "--oracle", "ollama", "--ollama-host", stub.host,
                                  "--model", "stub-model", "--budget", str(budget), "--seed", "5",
                                  "--concurrency", str(concurrency)]) == 0
    assert stub.max_in_flight == concurrency and stub.in_flight == 0
    out = capsys.readouterr()
    summary = json.loads(out.out)
    stored = [(r["anchor"], r["ref_j"], r["ref_k"])
              for r in ws.store.llm_answers("ollama", "stub-model", PROMPT_VERSION)]  # store (id) order
    ids = list(photo_texts(ws))
    plan = [tuple(ids[int(x)] for x in q) for q in uniform_order(len(ids), 5)[:budget]]
    assert stored == plan and len(set(stored)) == budget
    triplets = [(r["anchor"], r["ref_j"], r["ref_k"]) for r in ws.store.triplets(source="llm:stub-model")]
    assert triplets == plan
    assert len(stub.chats) == budget and summary["asked"] == budget
    estimate = summary["estimate"]
    assert estimate["to_ask"] == budget and estimate["concurrency"] == concurrency
    assert estimate["basis"] == "one probe question" and estimate["throughput_qps"] > 0
    assert estimate["eta_s"] == budget / estimate["throughput_qps"]
    assert f"{budget} questions to ask" in out.err and f"concurrency {concurrency}" in out.err


def test_the_estimate_uses_stored_latencies_once_there_are_some(demo_workspace, capsys) -> None:
    ws = demo_workspace
    with OllamaStub() as stub:
        args = ["--workspace", str(ws.root), "--oracle", "ollama", "--ollama-host", stub.host, "--model",
                "stub-model", "--concurrency", "2"]
        assert llm_triplets.main([*args, "--budget", "6"]) == 0
        capsys.readouterr()
        assert llm_triplets.main([*args, "--budget", "10"]) == 0
    summary = json.loads(capsys.readouterr().out)
    latencies = sorted(r["latency_ms"] for r in ws.store.llm_answers("ollama", "stub-model", PROMPT_VERSION)[:6])
    assert summary["estimate"]["basis"] == "stored answers" and summary["estimate"]["to_ask"] == 4
    assert summary["estimate"]["latency_ms"] == (latencies[2] + latencies[3]) / 2
    assert summary["from_cache"] == 6 and summary["asked"] == 4
