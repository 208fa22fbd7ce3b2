"""TriDerm-V training end to end on a tiny phantom workspace (few epochs, few views)."""
from __future__ import annotations

import numpy as np
import pytest

from annotations.workspace import Workspace
from core.runtime import load_embeddings
from core.train_triderm import agreement_table, main
from core.vision.triderm import run_agreement, train

FAST = {"epochs": 2, "views": 2, "batch_size": 4, "dim": 16}


@pytest.fixture(scope="module")
def tiny_dataset(tiny_phantom):
    return tiny_phantom(5, 5, 2, 8, 30)


@pytest.fixture
def tiny_ws(tiny_dataset, imported) -> Workspace:
    return imported(tiny_dataset)


def test_train_writes_run_embeddings_and_attention(tiny_ws):
    run_id = train(tiny_ws, progress=False, seed=1, **FAST)
    run = tiny_ws.store.run(run_id)
    assert run["kind"] == "vision-triderm" and run["status"] == "done"
    assert run["config"]["modality"] == "vision" and run["config"]["seed"] == 1
    assert len(run["metrics"]["loss"]) == 2 and all(np.isfinite(run["metrics"]["loss"]))
    emb = load_embeddings(tiny_ws, run_id)
    wounds = tiny_ws.store.wounds()
    assert emb["wound_emb"].shape == (len(wounds), 16)
    assert emb["image_emb"].shape == (len({w["image_id"] for w in wounds}), 16)
    # the image embedding: the mean of its wounds, centred and scaled to unit length (default)
    means = np.stack([emb["wound_emb"][[n for n, k in enumerate(emb["wound_keys"]) if k[0] == i]].mean(0)
                      for i in emb["image_ids"]])
    expected = (means - means.mean(0)) / np.linalg.norm(means - means.mean(0), axis=1, keepdims=True)
    assert np.allclose(emb["image_emb"], expected, atol=1e-5) and np.allclose(emb["center"], means.mean(0), atol=1e-5)
    seg, w = emb["token_wound"], emb["token_weight"]
    assert (w >= 0).all()
    assert np.allclose(np.bincount(seg, weights=w, minlength=len(wounds)), 1.0, atol=1e-5)
    assert emb["token_pos"].max() < emb["grid"].max() and tuple(emb["grid"]) == (14, 14)
    score = run_agreement(tiny_ws, run_id)
    assert 0.0 <= score["balanced"] <= 1.0 and score["n"] > 0


def test_no_cache_path_and_option_validation(tiny_ws):
    run_id = train(tiny_ws, progress=False, no_cache=True, loss="triplet", pooling="mean", **{**FAST, "epochs": 1})
    assert tiny_ws.store.run(run_id)["status"] == "done"
    with pytest.raises(TypeError, match="unknown training options"):
        train(tiny_ws, progress=False, epoch=3)
    with pytest.raises(ValueError, match="loss must be one of"):
        train(tiny_ws, progress=False, loss="hinge", **FAST)


def test_cli_prints_baseline_vs_trained_table(tiny_ws, capsys):
    assert main(["--workspace", str(tiny_ws.root), "--epochs", "2", "--views", "2", "--batch-size", "4",
                 "--dim", "16", "--loss", "contrastive"]) == 0
    out = capsys.readouterr().out
    assert "frozen efficientnet-lite0@full mean-pool" in out and "TriDerm-V attention/contrastive" in out
    assert "SYNTHETIC" in out
    kinds = [r["kind"] for r in tiny_ws.store.runs()]
    assert sorted(kinds) == ["vision-baseline", "vision-triderm"]
    with pytest.raises(SystemExit) as err:
        main(["--workspace", str(tiny_ws.root), "--views", "1"])
    assert err.value.code == 2


def test_agreement_table_formats_percentages():
    row = {"balanced": 0.716, "micro": 0.702, "macro_f1": 0.701, "kappa": 0.403, "n": 513}
    table = agreement_table([("TriDerm-V", row)])
    assert "71.6" in table and "0.403" in table and "513" in table


def test_same_seed_gives_identical_runs_and_another_seed_differs(tiny_ws):
    """Every draw (views, batches, initialisation) derives from the run seed (CPU: bit-identical)."""
    a = load_embeddings(tiny_ws, train(tiny_ws, progress=False, seed=3, **FAST))
    b = load_embeddings(tiny_ws, train(tiny_ws, progress=False, seed=3, **FAST))
    c = load_embeddings(tiny_ws, train(tiny_ws, progress=False, seed=4, **FAST))
    assert np.array_equal(a["image_emb"], b["image_emb"]) and np.array_equal(a["token_weight"], b["token_weight"])
    assert not np.allclose(a["image_emb"], c["image_emb"])
    runs = tiny_ws.store.runs(kind="vision-triderm")
    assert runs[1]["metrics"]["loss"] == runs[2]["metrics"]["loss"] != runs[0]["metrics"]["loss"]
