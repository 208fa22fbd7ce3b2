"""TriDerm-V training end to end on a tiny phantom workspace (few epochs, few views)."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from annotations.infra.fileio import read_json
from annotations.infra.workspace import Workspace
from core.runtime import load_embeddings
from core.train_triderm import agreement_table, main
from core.vision import triderm
from core.vision.pooling import WoundHead
from core.vision.triderm import run_agreement, train

FAST = {"epochs": 2, "views": 2, "batch_size": 4, "dim": 16}


@pytest.fixture(scope="module")
def tiny_dataset(tiny_phantom):
    return tiny_phantom(5, 5, 2, 8, 30)


@pytest.fixture
def tiny_ws(tiny_dataset, imported) -> Workspace:
    return imported(tiny_dataset)


def assert_learned(ws: Workspace, run_id: int, loss_falls: bool = True) -> None:
    """The run's epoch loss went down (unless ``loss_falls`` is False: fresh random views per step make two
    epochs' losses noise) and every tensor of the saved head moved away from the initialisation its seed gives
    (an optimiser that never steps fails both)."""
    run = ws.store.run(run_id)
    loss = run["metrics"]["loss"]
    assert len(loss) >= 2 and all(np.isfinite(loss)), loss
    assert not loss_falls or loss[-1] < loss[0], f"loss did not decrease: {loss}"
    saved = torch.load(ws.run_dir(run_id) / "head.pt", weights_only=False)
    cfg = saved["config"]
    torch.manual_seed(cfg["seed"])
    start = WoundHead(saved["channels"], cfg["dim"], cfg["pooling"], cfg["hidden"]).state_dict()
    assert start.keys() == saved["head"].keys()
    unmoved = [k for k, v in start.items() if torch.equal(v, saved["head"][k])]
    assert not unmoved, f"head parameters left at their initial values: {unmoved}"


def test_train_writes_run_embeddings_and_attention(tiny_ws):
    run_id = train(tiny_ws, progress=False, seed=1, **FAST)
    run = tiny_ws.store.run(run_id)
    assert run["kind"] == "vision-triderm" and run["status"] == "done"
    assert run["config"]["modality"] == "vision" and run["config"]["seed"] == 1
    assert len(run["metrics"]["loss"]) == 2 and all(np.isfinite(run["metrics"]["loss"]))
    assert_learned(tiny_ws, run_id)
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
    answers = [t["choice"] for t in tiny_ws.store.expert_triplets()]
    assert score["n"] == sum(c in ("j", "k") for c in answers) and score["n_skipped"] == answers.count("skip")


def test_no_cache_path_and_option_validation(tiny_ws, monkeypatch):
    """``no_cache``: every training step draws two fresh augmented views through the backbone."""
    pairs = []
    fresh_pair = triderm.FreshViews.pair

    def spy(self, wounds, gen):
        pairs.append(len(wounds))
        return fresh_pair(self, wounds, gen)

    monkeypatch.setattr(triderm.FreshViews, "pair", spy)
    run_id = train(tiny_ws, progress=False, no_cache=True, loss="triplet", pooling="mean", **FAST)
    run = tiny_ws.store.run(run_id)
    assert run["status"] == "done" and run["config"]["no_cache"] is True
    assert pairs == [4, 4] * 2, pairs  # 8 wounds, batches of 4, 2 epochs: one fresh pair per step
    assert_learned(tiny_ws, run_id, loss_falls=False)  # 0.1108 → 0.1110 on one CPU: two epochs of fresh views
    assert load_embeddings(tiny_ws, run_id)["wound_emb"].shape == (len(tiny_ws.store.wounds()), 16)
    with pytest.raises(TypeError, match="unknown training options"):
        train(tiny_ws, progress=False, epoch=3)
    with pytest.raises(ValueError, match="loss must be one of"):
        train(tiny_ws, progress=False, loss="hinge", **FAST)


def test_cli_prints_baseline_vs_trained_table(tiny_ws, capsys):
    assert main(["--workspace", str(tiny_ws.root), "--mode", "self-supervised", "--epochs", "2", "--views", "2", "--batch-size", "4",
                 "--dim", "16", "--loss", "contrastive"]) == 0
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out
    runs = {r["kind"]: r for r in tiny_ws.store.runs()}
    assert sorted(runs) == ["report", "vision-baseline", "vision-triderm"]  # the evaluation is saved
    trained, frozen = runs["vision-triderm"], runs["vision-baseline"]
    assert trained["config"]["loss"] == "contrastive" and trained["config"]["epochs"] == 2
    assert_learned(tiny_ws, trained["id"])
    # each printed row holds its run's agreement with the expert triplets, and the run records it
    for label, run in ((f"frozen efficientnet-lite0@full mean-pool (run {frozen['id']})", frozen),
                       (f"TriDerm-V attention/contrastive (run {trained['id']})", trained)):
        score = run_agreement(tiny_ws, run["id"])
        (line,) = [x for x in out.splitlines() if x.startswith(label)]
        saved = runs["report"]["metrics"]["runs"][str(run["id"])]["balanced"]  # the saved evaluation's
        assert line[len(label):].split()[0] == f"{100 * score['balanced']:.1f}" == f"{100 * saved:.1f}", line
        assert re.search(rf"{100 * score['balanced']:.1f} \[\d+\.\d, \d+\.\d\]", line), line  # its 95% interval
        assert line.split()[-3:] == f"{100 * score['macro_f1']:.1f} {score['kappa']:.3f} {score['n']}".split(), line
    recorded = tiny_ws.store.run(trained["id"])["metrics"]
    assert recorded["agreement"] == run_agreement(tiny_ws, trained["id"])
    assert recorded["baseline"] == {"run": frozen["id"], **run_agreement(tiny_ws, frozen["id"])}
    assert re.search(rf"run {trained['id']} → .*runs", out)
    n, expert = run_agreement(tiny_ws, trained["id"])["n"], len(tiny_ws.store.expert_triplets())
    assert f"scored {n} of the expert's {expert} triplets" in out
    assert f"evaluation saved (report run {runs['report']['id']})" in out
    verdict = read_json(tiny_ws.runs_dir / "report" / "report.json")["verdict"]  # the Report page's first line
    assert (verdict["trained_run"], verdict["untrained_run"]) == (trained["id"], frozen["id"])
    assert f"Verdict [SYNTHETIC phantom data]: {verdict['line']}\nNext step: {verdict['next_step']}" in out
    assert "Next steps:" in out and "users add --role admin NAME" in out and "make app" in out
    assert "≥" not in out and "rank " not in out
    with pytest.raises(SystemExit) as err:
        main(["--workspace", str(tiny_ws.root), "--views", "1"])
    assert err.value.code == 2


def test_agreement_table_formats_percentages():
    row = {"balanced": 0.716, "micro": 0.702, "macro_f1": 0.701, "kappa": 0.403, "n": 513}
    table = agreement_table([("TriDerm-V", row)])
    assert "71.6" in table and "0.403" in table and "513" in table
    strict = {"balanced": 0.571, "micro": float("nan"), "macro_f1": float("nan"), "kappa": float("nan"), "n": 331}
    assert "nan" not in agreement_table([("fine-tuned, strict out of fold", strict)]).lower()


def test_same_seed_gives_identical_runs_and_another_seed_differs(tiny_ws):
    """Every draw (views, batches, initialisation) derives from the run seed (CPU: bit-identical)."""
    a = load_embeddings(tiny_ws, train(tiny_ws, progress=False, seed=3, **FAST))
    b = load_embeddings(tiny_ws, train(tiny_ws, progress=False, seed=3, **FAST))
    c = load_embeddings(tiny_ws, train(tiny_ws, progress=False, seed=4, **FAST))
    assert np.array_equal(a["image_emb"], b["image_emb"]) and np.array_equal(a["token_weight"], b["token_weight"])
    assert not np.allclose(a["image_emb"], c["image_emb"])
    runs = tiny_ws.store.runs(kind="vision-triderm")
    assert runs[1]["metrics"]["loss"] == runs[2]["metrics"]["loss"] != runs[0]["metrics"]["loss"]
