"""The run kinds registry and :func:`annotations.store.runs.recording`, the one way a job records its run."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from annotations.store import runs
from annotations.store.store import Store

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "store.db")


def test_success_finishes_done_with_what_the_block_set(store):
    with runs.recording(store, runs.TEXT_SOE, {"modality": "text"}, seed=3, name="soe") as rec:
        assert store.run(rec.id)["status"] == "running"
        rec.metrics = {"loss": [1.0, 0.5]}
        rec.artifacts = {"embeddings": "runs/1/embeddings.npz"}
    run = store.run(rec.id)
    assert (run["kind"], run["status"], run["seed"], run["name"], run["progress"], run["message"]) == \
        ("text-soe", "done", 3, "soe", 1.0, None)
    assert run["metrics"] == {"loss": [1.0, 0.5]} and run["artifacts"] == {"embeddings": "runs/1/embeddings.npz"}
    assert run["finished"]


def test_failure_stores_the_reason_in_the_message_and_reraises(store):
    with (pytest.raises(FloatingPointError, match="non-finite"),
          runs.recording(store, runs.VISION_FINETUNE, {"modality": "vision"}) as rec):
        rec.metrics = {"loss": [float("nan")]}  # set before the failure: not stored as a result
        raise FloatingPointError("non-finite training loss: [nan]")
    run = store.run(rec.id)
    assert (run["status"], run["message"]) == ("failed", "FloatingPointError: non-finite training loss: [nan]")
    assert "error" not in run["metrics"] and "loss" not in run["metrics"] and run["finished"]


def test_a_failure_without_text_is_named_by_its_type(store):
    with pytest.raises(MemoryError), runs.recording(store, runs.SEGMENTER, {}) as rec:
        raise MemoryError()
    assert (store.run(rec.id)["status"], store.run(rec.id)["message"]) == ("failed", "MemoryError")


def test_ctrl_c_stops_the_run_and_reraises(store):
    with (pytest.raises(KeyboardInterrupt),
          runs.recording(store, runs.LLM_TRIPLETS, {}, stop_message="interrupted; rerun to resume") as rec):
        raise KeyboardInterrupt
    run = store.run(rec.id)
    assert (run["status"], run["message"], run["progress"]) == ("stopped", "interrupted; rerun to resume", 0.0)


def test_the_block_can_end_a_run_failed_without_an_exception(store):
    with runs.recording(store, runs.LLM_TRIPLETS, {}) as rec:
        rec.metrics, rec.status, rec.message = {"failed": 2}, "failed", "2 questions failed after retries"
    run = store.run(rec.id)
    assert (run["status"], run["message"], run["metrics"]) == \
        ("failed", "2 questions failed after retries", {"failed": 2})


def test_an_unknown_kind_is_refused_and_records_nothing(store):
    with (pytest.raises(ValueError, match=r"unknown run kind 'vision-tridem'.*vision-triderm"),
          runs.recording(store, "vision-tridem", {})):
        pass
    assert store.runs() == []


def test_a_workspace_or_its_store(tmp_path):
    from annotations.infra.workspace import Workspace

    ws = Workspace(tmp_path / "ws")
    with runs.recording(ws, runs.REPORT, {}) as rec:
        pass
    assert ws.store.run(rec.id)["status"] == "done"


def test_every_kind_is_a_named_constant_with_a_description():
    constants = {v for k, v in vars(runs).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(runs.KINDS)
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", k) for k in runs.KINDS)
    assert all(":" in d and len(d) > 20 for d in runs.KINDS.values())  # "modality: what it trains"


def test_the_architecture_doc_lists_every_run_kind_and_no_other():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text[text.index("Run kinds (`annotations/store/runs.py`"):]
    section = section[:section.index("\n\n", section.index("\n- "))]
    listed = dict(re.findall(r"^- `([a-z-]+)`: (.+)$", section, flags=re.M))
    assert listed == runs.KINDS


def test_finished_returns_a_done_run_and_names_any_other(store):
    with runs.recording(store, runs.SEGMENTER, {}) as rec:
        pass
    assert runs.finished(store, rec.id)["id"] == rec.id
    assert runs.finished(store, rec.id, runs.SEGMENTER)["kind"] == runs.SEGMENTER
    with pytest.raises(ValueError, match=f"no finished vision-finetune run {rec.id}"):
        runs.finished(store, rec.id, runs.VISION_FINETUNE)
    with pytest.raises(ValueError, match="no finished run 99"):
        runs.finished(store, 99)
    running = store.start_run(runs.TEXT_SOE, {})
    with pytest.raises(ValueError, match=f"no finished run {running}"):
        runs.finished(store, running)
