"""Query runs: kill/resume against the loopback Ollama stub, debiasing, active sampling, the
local SmolLM2 oracle, CLI errors, and the SOE fit of the answers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ollama_stub import OllamaStub, stub_choice

from core import fit_soe, llm_triplets
from core.text.llm import PROMPT_VERSION, LocalOracle, PhantomOracle, build_messages
from core.text.queries import photo_texts, run

REPO = Path(__file__).resolve().parents[2]


def cli(ws, host: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "core.llm_triplets", "--workspace", str(ws.root), "--oracle", "ollama",
            "--ollama-host", host, "--model", "stub-model", *extra]


def cached(ws) -> set[tuple[str, str, str]]:
    return {(r["anchor"], r["ref_j"], r["ref_k"]) for r in ws.store.llm_answers("ollama", "stub-model", PROMPT_VERSION)}


def test_killed_run_resumes_without_asking_again(demo_workspace) -> None:
    ws = demo_workspace
    budget, kill_after = 60, 12
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with OllamaStub(delay_s=0.25) as stub:
        cmd = cli(ws, stub.host, "--budget", str(budget), "--workers", "2", "--seed", "3")
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 600  # generous: an event wait, not a timing check
        while len(cached(ws)) < kill_after:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the run never reached the kill point"
            time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=30)
        first = cached(ws)
        assert kill_after <= len(first) < budget
        assert len(ws.store.triplets(source="llm:stub-model")) == len(first)

        stub.reset_counts()
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        summary = json.loads(out.stdout)
        texts = photo_texts(ws)
        asked = stub.user_prompts()
        already = {build_messages(texts[a], texts[j], texts[k])[1]["content"] for a, j, k in first}
        assert not already & set(asked)  # none of the first run's answers is asked again
        assert len(asked) == budget - len(first) == summary["asked"]
        assert summary["from_cache"] == len(first) and summary["failed"] == 0
        assert len(cached(ws)) == budget
        assert len(ws.store.triplets(source="llm:stub-model")) == budget
        # the stub's rule decided every stored answer
        for a, j, k in cached(ws):
            row = ws.store.llm_cached("ollama", "stub-model", PROMPT_VERSION, a, j, k)
            assert row["choice"] == stub_choice(build_messages(texts[a], texts[j], texts[k])[1]["content"])
        runs = ws.store.runs(kind="llm-triplets")
        assert runs[0]["status"] == "done" and runs[0]["progress"] == 1.0


def test_debias_reports_position_bias_and_skips_disagreements(demo_workspace, capsys) -> None:
    ws = demo_workspace
    with OllamaStub() as stub:
        assert llm_triplets.main(["--workspace", str(ws.root), "--oracle", "ollama", "--host", stub.host,
                                  "--model", "stub-model", "--budget", "30", "--debias", "--workers", "3"]) == 0
    summary = json.loads(capsys.readouterr().out)
    texts = photo_texts(ws)
    # the stub answers by word overlap, ties → the first position: those pairs are position-biased
    pairs = {}
    for a, j, k in cached(ws):
        key = (a, frozenset((j, k)))
        pairs.setdefault(key, []).append(stub_choice(build_messages(texts[a], texts[j], texts[k])[1]["content"]))
    assert len(pairs) == 30 and all(len(v) == 2 for v in pairs.values())
    biased = sum(v[0] == v[1] for v in pairs.values())
    assert summary["position_bias_rate"] == pytest.approx(biased / 30)
    assert summary["asked"] == 60 and summary["debiased_pairs"] == 30
    rows = ws.store.triplets(source="llm:stub-model")
    assert sum(r["choice"] == "skip" for r in rows) == biased
    assert sum(r["choice"] in ("j", "k") for r in rows) == 2 * (30 - biased)


def test_missing_model_and_bad_budget_exit_2_changing_nothing(demo_workspace) -> None:
    ws = demo_workspace
    with OllamaStub(models=("other:latest",)) as stub:
        with pytest.raises(SystemExit) as exc:
            llm_triplets.main(["--workspace", str(ws.root), "--oracle", "ollama", "--host", stub.host,
                               "--model", "stub-model", "--budget", "5"])
        assert exc.value.code == 2 and stub.chats == []
    with pytest.raises(SystemExit) as exc:
        llm_triplets.main(["--workspace", str(ws.root), "--oracle", "phantom", "--budget", "ten"])
    assert exc.value.code == 2
    assert ws.store.llm_answers("ollama", "stub-model", PROMPT_VERSION) == []


def test_active_phantom_run_then_fit_soe(demo_workspace, capsys) -> None:
    ws = demo_workspace
    oracle = PhantomOracle(ws.truth_dir, seed=0)
    summary = run(ws, oracle, 1200, sampling="active", seed=0, active_batch=300, progress=False)
    assert summary["questions"] == 1200 and summary["asked"] == 1200 and summary["synthetic"]
    again = run(ws, oracle, 1200, sampling="active", seed=0, active_batch=300, progress=False)
    assert again["asked"] == 0 and again["from_cache"] == 1200
    assert fit_soe.main(["--workspace", str(ws.root), "--source", "llm:phantom-expert", "--dim", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    run_row = ws.store.run(out["run_id"])
    assert run_row["kind"] == "text-soe" and run_row["config"]["modality"] == "text"
    from core.runtime import load_embeddings

    emb = load_embeddings(ws, out["run_id"])
    assert emb["image_emb"].shape == (out["n_images"], 4)
    assert out["expert_agreement"]["balanced"] > 0.62  # measured 0.684 (seed 0); chance 0.5


def test_active_run_without_enumeration_resumes_from_the_cache(demo_workspace, tmp_path, monkeypatch) -> None:
    import shutil

    from annotations.infra.workspace import Workspace
    from core.text import sampling

    monkeypatch.setattr(sampling, "ENUMERATE_MAX", 1000)  # the demo's 70,278 questions count as a registry's
    shutil.copytree(demo_workspace.root, tmp_path / "copy")
    ws = Workspace(tmp_path / "copy")
    oracle = PhantomOracle(ws.truth_dir, seed=0)
    summary = run(ws, oracle, 600, sampling="active", seed=0, active_batch=200, progress=False)
    assert summary["questions"] == 600 and summary["asked"] == 600 - summary["from_cache"] > 0
    again = run(ws, oracle, 600, sampling="active", seed=0, active_batch=200, progress=False)
    assert again["asked"] == 0 and again["from_cache"] == 600

def test_active_selection_prefers_uncertain_questions() -> None:
    from core.text.sampling import all_questions, select_active
    from core.text.soe import triplet_margins

    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 2))
    q = all_questions(12)
    pick = select_active(x, q, 120)
    assert np.bincount(q[pick, 0], minlength=12).tolist() == [10] * 12  # anchor-balanced
    assert np.abs(triplet_margins(x, q[pick])).mean() < 0.5 * np.abs(triplet_margins(x, q)).mean()


def test_active_pools_are_drawn_not_enumerated_above_the_question_limit() -> None:
    from core.text.sampling import ENUMERATE_MAX, ActiveSampler, canonical_key, n_questions
    from core.text.soe import triplet_margins

    n = 300
    assert n_questions(n) > ENUMERATE_MAX
    sampler = ActiveSampler(n, 600, seed=0)
    assert sampler.questions is None
    first = sampler.next_batch(np.zeros((0, 3), dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert first.shape == (600, 3) and np.bincount(first[:, 0], minlength=n).tolist() == [2] * n
    assert (first[:, 0] != first[:, 1]).all() and (first[:, 0] != first[:, 2]).all() and (first[:, 1] != first[:, 2]).all()
    assert len(np.unique(canonical_key(first, n))) == 600
    x = np.random.default_rng(1).normal(size=(n, 2))
    oriented = first.copy()
    swap = triplet_margins(x, first) < 0  # answered by the truth x
    oriented[swap, 1], oriented[swap, 2] = first[swap, 2], first[swap, 1]
    nxt = sampler.next_batch(oriented, canonical_key(first, n), 300)
    assert len(nxt) == 300 and not np.isin(canonical_key(nxt, n), canonical_key(first, n)).any()
    fitted = sampler.embedding_
    assert np.abs(triplet_margins(fitted, nxt)).mean() < 0.5 * np.abs(triplet_margins(fitted, first)).mean()
    with pytest.raises(ValueError, match="too many to rank them all"):
        ActiveSampler(n, 10, pool_factor=None)

@pytest.mark.slow
def test_local_smollm2_oracle_writes_answers(demo_workspace) -> None:
    ws = demo_workspace
    oracle = LocalOracle(batch_size=4)
    summary = run(ws, oracle, 6, debias=True, progress=False)
    answers = ws.store.llm_answers("local", "smollm2-135m-instruct", PROMPT_VERSION)
    assert len(answers) == 12 and summary["asked"] == 12 and summary["demo_oracle"]
    assert summary["position_bias_rate"] is not None and summary["debiased_pairs"] == 6
    raw = json.loads(answers[0]["raw"])
    assert raw["answer"] == answers[0]["choice"] and raw["logp_j"] <= 0 and raw["logp_k"] <= 0
    assert (raw["logp_j"] - raw["logp_k"] >= raw["prior_log_odds"]) == (raw["answer"] == "j")
    assert answers[0]["tokens_in"] > 100
    # one question alone (no padding) gives the same log-likelihoods as inside the padded batch
    texts = photo_texts(ws)
    a = answers[0]
    single = oracle.answer(texts[a["anchor"]], texts[a["ref_j"]], texts[a["ref_k"]])
    assert abs(json.loads(single.raw)["logp_j"] - raw["logp_j"]) < 1e-3
