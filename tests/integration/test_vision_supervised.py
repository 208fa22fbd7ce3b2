"""Learning from the expert's triplets: patient-disjoint folds, the linear-metric baseline, the
supervised training term, embedding new photos, and the CLI's bad-input errors."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from annotations.infra.workspace import Workspace
from core.embed import main as embed_main
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import agreement
from core.eval.protocol import (
    cross_validate,
    oriented_expert,
    out_of_fold,
    patient_folds,
    protocol_summary,
    repeated_folds,
    score_folds,
    split_triplets,
    versus_frozen,
)
from core.losses import ExpertTripletLoss
from core.runtime import load_embeddings, pick_device
from core.train_triderm import main as train_main
from core.vision.backbones import load_backbone
from core.vision.baseline import centred_folds, embed_baseline, normalized
from core.vision.features import PhotoFeatures, TokenBank, wound_fractions
from core.vision.supervised import LinearMetric, MetricHead, fit_metric_head, fused_distances
from core.vision.triderm import train
from core.vision.triderm_config import DEFAULT

FAST = {"epochs": 2, "views": 2, "batch_size": 4, "dim": 16}


@pytest.fixture(scope="module")
def tiny_dataset(tiny_phantom):
    return tiny_phantom(5, 8, 4, 12, 60)


@pytest.fixture
def tiny_ws(tiny_dataset, imported) -> Workspace:
    return imported(tiny_dataset)


def random_triplets(n: int, m: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.stack([rng.choice(n, 3, replace=False) for _ in range(m)])
    return t


def test_patient_disjoint_folds_never_train_on_a_test_patient():
    ids = [f"p{p}-{k}" for p in range(9) for k in range(1 + p % 3)] + ["lone"]
    patients = {i: i.split("-")[0] for i in ids[:-1]} | {"lone": "photo:lone"}
    folds = patient_folds(ids, patients, 5, seed=3)
    assert sorted(i for f in folds for i in f) == sorted(ids)
    assert max(map(len, folds)) - min(map(len, folds)) <= 2
    row = {i: n for n, i in enumerate(ids)}
    trip = random_triplets(len(ids), 400, 0)
    for fold in folds:
        test_rows = np.array([row[i] for i in fold])
        train, strict, anchor = split_triplets(trip, test_rows)
        fold_patients = {patients[i] for i in fold}
        seen = {patients[ids[x]] for x in trip[train].ravel()}
        assert not seen & fold_patients  # no photo of a test patient in any training triplet
        assert set(trip[strict].ravel()) <= set(test_rows)  # strict: all three photos in the fold
        assert set(trip[anchor][:, 0]) <= set(test_rows) and not np.isin(trip[anchor][:, 1:], test_rows).any()
        assert {patients[ids[x]] for x in test_rows} == fold_patients  # a patient is never split
    with pytest.raises(ValueError, match="larger than the number of patients"):
        patient_folds(ids, patients, 11)


def test_anchor_split_would_leak_but_patient_split_does_not():
    """Splitting by anchor alone leaves test photos as references in training triplets."""
    ids = [f"p{i}" for i in range(20)]
    trip = random_triplets(20, 300, 1)
    test_rows = np.arange(4)
    anchor_only_train = ~np.isin(trip[:, 0], test_rows)
    assert np.isin(trip[anchor_only_train][:, 1:], test_rows).any()
    train, _, _ = split_triplets(trip, test_rows)
    assert not np.isin(trip[train], test_rows).any() and len(ids) == 20


def test_a_folds_strict_triplets_name_no_photo_its_model_was_trained_on():
    """Repeated patient splits: every strict triplet a fold scores has its three photos outside every
    training triplet of that fold; anchor-unseen triplets reuse trained references."""
    ids = [f"p{p}-{k}" for p in range(30) for k in range(1 + p % 3)]
    patients = {i: i.split("-")[0] for i in ids}
    trip = random_triplets(len(ids), 3000, 2)
    splits = repeated_folds(ids, patients, 2, 3, seed=5)
    assert len({tuple(s[0]) for s in splits}) == 3  # three different random splits
    trained: list[set[int]] = []

    def fit_fold(train: np.ndarray, test_rows: np.ndarray) -> np.ndarray:
        trained.append(set(train.ravel()))
        assert not np.isin(train, test_rows).any()
        return np.random.default_rng(len(trained)).random((len(ids), len(ids)))

    folds = cross_validate(splits, trip, fit_fold)
    assert len(folds) == 6 == len(trained)
    records = score_folds(trip, folds)
    n_strict = 0
    for (rows, D), seen in zip(folds, trained):
        _, strict, anchor = split_triplets(trip, rows)
        assert not set(trip[strict].ravel()) & seen  # strict: no photo a training triplet named
        assert set(trip[anchor][:, 1:].ravel()) <= set(range(len(ids))) - set(rows)
        n_strict += strict.sum()
    assert len(records["strict"]) == n_strict and 0.15 < n_strict / (3 * len(trip)) < 0.35  # ~1/K² with K = 2
    # each fold's records are scored with that fold's distances
    rows, D = folds[0]
    _, strict, _ = split_triplets(trip, rows)
    i, j, k = trip[strict].T
    assert records["strict"][:strict.sum(), 1].tolist() == (D[i, j] < D[i, k]).astype(int).tolist()
    with pytest.raises(ValueError, match="at least 1 repeat"):
        repeated_folds(ids, patients, 2, 0)


def test_protocol_summary_pools_anchors_and_resamples_patients():
    ids = ["a", "b", "c", "d"]
    patients = {"a": "P", "b": "P", "c": "Q", "d": "R"}
    records = np.array([[0, 1], [0, 0], [1, 1], [2, 0], [2, 0], [3, 1]])
    s = protocol_summary(records, ids, patients, n_boot=500)
    assert s["per_anchor"] == {"a": 0.5, "b": 1.0, "c": 0.0, "d": 1.0}
    assert s["balanced"] == pytest.approx(0.625) and (s["n"], s["n_anchors"], s["n_patients"]) == (6, 4, 3)
    assert 0 <= s["ci"][0] <= s["balanced"] <= s["ci"][1] <= 1
    # one patient per anchor vs all anchors of one patient: resampling patients widens the interval
    one = protocol_summary(records, ids, {"a": "P", "b": "P", "c": "P", "d": "P"}, n_boot=200)
    assert one["ci"][0] == one["ci"][1] == pytest.approx(0.625)
    assert protocol_summary(np.zeros((0, 2), np.int64), ids, patients)["balanced"] is None


def test_fused_distances_scale_on_training_photos_only():
    rng = np.random.default_rng(0)
    A, B = rng.random((6, 6)), 100 * rng.random((6, 6))
    A, B = A + A.T, B + B.T
    rows = np.array([0, 1, 2])
    F = fused_distances(A, B, 0.5, rows)
    B2 = B.copy()
    B2[5, 4] = B2[4, 5] = 1e6  # a test photo's distances do not move the scales
    G = fused_distances(A, B2, 0.5, rows)
    assert np.allclose(F[:4, :4], G[:4, :4])
    off = ~np.eye(3, dtype=bool)
    assert np.median(fused_distances(A, B, 1.0, rows)[np.ix_(rows, rows)][off]) == pytest.approx(1.0)
    assert np.allclose(fused_distances(A, B, 0.0, rows), A / np.median(A[np.ix_(rows, rows)][off]))


def test_linear_metric_standardisation_sees_training_photos_only():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(30, 5))
    trip = random_triplets(20, 200, 3)  # names photos 0–19 only: 20–29 are held out
    model = LinearMetric(n_components=3, epochs=20).fit(X, trip)
    assert np.allclose(model.mean_, X[:20].mean(0)) and np.allclose(model.scale_, X[:20].std(0) + 1e-6)
    X2 = X.copy()
    X2[20:] = 1e3  # held-out photos changed beyond recognition
    other = LinearMetric(n_components=3, epochs=20).fit(X2, trip)
    assert np.array_equal(other.components_, model.components_) and np.array_equal(other.mean_, model.mean_)


def test_linear_metric_learns_a_planted_metric_out_of_sample():
    rng = np.random.default_rng(0)
    signal = rng.normal(size=(120, 2))
    X = np.hstack([signal, 3.0 * rng.normal(size=(120, 30))])  # 30 loud dimensions the judge ignores

    def judged(rows: np.ndarray, m: int, seed: int) -> np.ndarray:
        t = random_triplets(len(rows), m, seed)
        t = rows[t]
        d = lambda a, b: ((signal[a] - signal[b]) ** 2).sum(1)  # noqa: E731
        swap = d(t[:, 0], t[:, 1]) > d(t[:, 0], t[:, 2])
        t[swap, 1], t[swap, 2] = t[swap, 2], t[swap, 1].copy()
        return t

    train_rows, test_rows = np.arange(80), np.arange(80, 120)
    model = LinearMetric(n_components=8, epochs=200).fit(X, judged(train_rows, 2000, 1))
    test = judged(test_rows, 1000, 2)
    raw = agreement(np.linalg.norm(X[:, None] - X[None], axis=2), test)["balanced"]
    Z = model.transform(X)
    learned = agreement(np.linalg.norm(Z[:, None] - Z[None], axis=2), test)["balanced"]
    assert raw < 0.6 and learned > 0.8  # measured: raw 0.53, learned 0.90
    assert model.components_.shape == (32, 8)
    with pytest.raises(ValueError, match=r"\(m, 3\)"):
        LinearMetric().fit(X, np.zeros((4, 2), dtype=int))
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        LinearMetric().transform(X)


def test_expert_triplet_loss_is_the_ordinal_hinge():
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    loss = ExpertTripletLoss(margin=0.1)
    assert loss(z, torch.tensor([[0, 1, 2]])).item() == pytest.approx(0.0)  # d_ij 0, d_ik 2: satisfied
    assert loss(z, torch.tensor([[0, 2, 1]])).item() == pytest.approx(2.1)  # 0.1 + 2 − 0


def test_supervised_training_lowers_the_expert_term_and_records_cv(tiny_ws):
    triplets = oriented_expert(tiny_ws, sorted({w["image_id"] for w in tiny_ws.store.wounds()}))
    assert len(triplets) > 20
    run_id = train(tiny_ws, progress=False, supervise="triplets", cv=2, cv_repeats=2, supervise_steps=60,
                   **{**FAST, "epochs": 30, "normalize": "center-l2"})
    run = tiny_ws.store.run(run_id)
    cv = run["metrics"]["cv"]
    assert (cv["folds"], cv["repeats"], cv["protocol"], cv["ci_resamples"]) == (2, 2, "strict", "patients")
    assert 0 < cv["n"] <= 2 * len(triplets) and 0 < cv["anchor_unseen"]["n"] <= 2 * len(triplets)
    for m in (cv, cv["anchor_unseen"]):
        assert m["ci"][0] <= m["balanced"] <= m["ci"][1] and m["n_patients"] >= 1
    losses = run["metrics"]["loss"]
    assert len(losses) == 60 and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])  # the hinge falls
    emb = load_embeddings(tiny_ws, run_id)
    assert not np.allclose(np.linalg.norm(emb["image_emb"], axis=1), 1.0)  # the metric space, not center-l2
    assert (tiny_ws.run_dir(run_id) / "head.pt").exists()
    # in-sample, the supervised model agrees with its training triplets more than the SSL one
    ssl_id = train(tiny_ws, progress=False, **{**FAST, "epochs": 30, "normalize": "center-l2"})
    from core.vision.triderm import run_agreement

    assert run_agreement(tiny_ws, run_id)["balanced"] > run_agreement(tiny_ws, ssl_id)["balanced"] + 0.05


def test_metric_head_starts_at_mean_pooling_and_is_standardised():
    tokens = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 0.0]])
    segment = torch.tensor([0, 0, 1])
    head = MetricHead(2, dim=3, pooling="attention")
    head.mean.copy_(torch.tensor([1.0, 1.0]))
    head.scale.copy_(torch.tensor([2.0, 4.0]))
    z, w = head(tokens, segment, 2)
    assert torch.allclose(w, torch.tensor([0.5, 0.5, 1.0]))  # zero-initialised attention = the mean
    pooled = torch.tensor([[2.0, 4.0], [5.0, 0.0]])
    assert torch.allclose(z, ((pooled - 1.0) / torch.tensor([2.0, 4.0])) @ head.proj.weight.T)


def random_bank(n_photos: int, channels: int, seed: int) -> TokenBank:
    """One wound per photo, random tokens, two augmented views."""
    g = torch.Generator().manual_seed(seed)
    labels = np.zeros((32, 32), np.int64)
    labels[4:28, 4:28] = 1
    frac = wound_fractions(labels, [1], (4, 4))
    photos = {f"p{i}": PhotoFeatures([1], torch.randn(2, channels, 4, 4, generator=g).half(),
                                     frac[None].repeat(2, 1, 1, 1).half(),
                                     torch.randn(channels, 4, 4, generator=g).half(), frac)
              for i in range(n_photos)}
    return TokenBank(photos, [(f"p{i}", 1) for i in range(n_photos)])


@pytest.mark.parametrize("augment", [False, True])
def test_an_ensemble_of_heads_trains_each_block_as_its_own_model(augment):
    n, channels, dim = 10, 6, 3
    bank = random_bank(n, channels, 0)
    wound_image, wounds = torch.arange(n), torch.arange(n)
    triplets = torch.from_numpy(random_triplets(n, 40, 1))
    cfg = replace(DEFAULT, supervise_steps=25, supervise_augment=augment)
    ensemble = MetricHead(channels, dim, heads=2)
    start = ensemble.proj.weight.detach().clone()
    fit_metric_head(ensemble, bank, wound_image, n, wounds, triplets, cfg, torch.Generator().manual_seed(3),
                    torch.device("cpu"))
    assert ensemble(bank.eval_tokens, bank.eval_segment, n)[0].shape == (n, 2 * dim)
    for h in range(2):
        alone = MetricHead(channels, dim)
        with torch.no_grad():
            alone.proj.weight.copy_(start[h * dim:(h + 1) * dim])
        fit_metric_head(alone, bank, wound_image, n, wounds, triplets, cfg, torch.Generator().manual_seed(3),
                        torch.device("cpu"))
        block = ensemble.proj.weight[h * dim:(h + 1) * dim]
        # without augmentation a block trained beside another equals the same block trained alone;
        # with it, each block draws its own views, so none follows the draws of a lone head
        assert torch.allclose(alone.proj.weight, block, atol=1e-5) == (not augment)


def test_metric_head_rejects_an_empty_ensemble():
    with pytest.raises(ValueError, match="heads must be ≥ 1"):
        MetricHead(4, heads=0)


def test_a_supervised_run_places_new_photos_in_its_metric_space(tiny_ws, tmp_path, capsys):
    run_id = train(tiny_ws, progress=False, supervise="triplets", supervise_steps=20, **FAST)
    emb = load_embeddings(tiny_ws, run_id)
    first = emb["image_ids"][0]
    new = tmp_path / "new" / "images"
    new.mkdir(parents=True)
    Image.open(tiny_ws.image_path(first)).save(new / "again.png")
    (new.parent / "masks").mkdir()
    Image.fromarray((tiny_ws.load_mask(first) > 0).astype(np.uint8) * 255).save(new.parent / "masks" / "again.png")
    assert embed_main(["--workspace", str(tiny_ws.root), "--model", str(run_id), "--images", str(new.parent)]) == 0
    assert f"again: {first} (0.0" in capsys.readouterr().out


def test_versus_frozen_pairs_the_run_with_the_frozen_centred_baseline_on_the_same_folds():
    rng = np.random.default_rng(0)
    frozen = rng.normal(size=(12, 5))
    ids = [f"p{i}" for i in range(12)]
    patients = {i: f"patient{n // 2}" for n, i in enumerate(ids)}
    triplets = np.array([rng.choice(12, 3, replace=False) for _ in range(400)])
    everyone = np.arange(12)
    same = [(rows, pairwise_euclidean(normalized(frozen, "center-l2", np.setdiff1d(everyone, rows))[0]))
            for rows in (np.arange(6), np.arange(6, 12))]
    assert [(r.tolist(), D.tolist()) for r, D in centred_folds(frozen, same)] == [(r.tolist(), D.tolist())
                                                                                 for r, D in same]
    out = versus_frozen(out_of_fold(ids, triplets, same, patients)["strict"], ids, triplets, same, patients)
    expected = protocol_summary(score_folds(triplets, same)["strict"], ids, patients)
    assert out["balanced"] == expected["balanced"] and out["n"] == expected["n"] > 0
    assert out["paired"]["mean_diff"] == 0 and out["paired"]["n_patients"] == 6
    flipped = [(rows, -D) for rows, D in same]
    reversed_ = versus_frozen(out_of_fold(ids, triplets, flipped, patients)["strict"], ids, triplets, same, patients)
    assert reversed_["balanced"] == out["balanced"] and reversed_["paired"]["mean_diff"] < 0


def without_triplets(ws: Workspace, tmp_path) -> Workspace:
    """A workspace with ``ws``'s photos and wounds and no expert triplet."""
    import shutil

    from annotations.io.dataset import import_dataset

    empty = Workspace(tmp_path / "no-triplets")
    ds = tmp_path / "ds"
    shutil.copytree(ws.root / "images", ds / "images")
    shutil.copytree(ws.root / "masks", ds / "masks")
    (ds / "wounds.csv").write_text("image_id,wound_index,description\n" + "".join(
        f"{w['image_id']},{w['wound_index']},\n" for w in ws.store.wounds()))
    import_dataset(empty, ds)
    return empty


def test_the_default_mode_follows_the_evidence(tiny_ws, tmp_path, capsys):
    """``--mode auto``: the last stage + head fine-tuned on the expert's triplets (the best mode on new patients),
    scored out of fold, when the workspace has them; else the frozen centred embedding (a ``vision-baseline``
    run, no training)."""
    assert train_main(["--workspace", str(tiny_ws.root), "--views", "2", "--cv-repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^mode: fine-tune \(\d+ expert triplets over outlined photos of \d+ patients\)", out, re.M), out
    (run,) = tiny_ws.store.runs(kind="vision-finetune")
    assert run["config"]["supervise"] == "triplets" and run["metrics"]["cv"]["protocol"] == "strict"
    assert "strict — all three photos unseen (the run's figure)" in out
    base = run["metrics"]["cv"]["frozen_centred"]
    assert 0 <= base["balanced"] <= 1 and base["n"] == run["metrics"]["cv"]["n"] and "paired" in base
    assert "frozen centred, the same strict triplets: balanced" in out and "this run − frozen centred:" in out

    empty = without_triplets(tiny_ws, tmp_path)
    assert train_main(["--workspace", str(empty.root)]) == 0
    out = capsys.readouterr().out
    assert "mode: frozen (no expert triplets over outlined photos)" in out and "No expert triplets yet" in out
    (run,) = empty.store.runs()
    assert run["kind"] == "vision-baseline" and run["config"]["normalize"] == "center-l2"
    assert run["name"] == "frozen, centred unit length"
    centred, raw = load_embeddings(empty, run["id"]), load_embeddings(empty, embed_baseline(empty, load_backbone(DEFAULT.backbone)))
    z = raw["image_emb"] - raw["image_emb"].mean(0)
    assert np.allclose(centred["image_emb"], z / np.linalg.norm(z, axis=1, keepdims=True), atol=1e-5)
    assert np.allclose(centred["center"], raw["image_emb"].mean(0))


def test_cli_bad_input_exits_2_and_records_nothing(tiny_ws, capsys, tmp_path):
    base = ["--workspace", str(tiny_ws.root), *["--epochs", "1", "--views", "2", "--batch-size", "4", "--dim", "8"]]
    for extra, message in [(["--mode", "self-supervised", "--layer", "stage9"], "unknown layer 'stage9'"),
                           (["--mode", "supervised", "--cv", "99"], "larger than the number of patients"),
                           (["--mode", "self-supervised", "--cv", "3"],
                            "--cv: not read by --mode self-supervised"),
                           (["--mode", "frozen", "--cv", "3"],
                            "--epochs, --batch-size, --views, --dim, --cv: not read by --mode frozen, which "
                            "reads only --backbone, --layer; leave them out"),
                           ([], "--mode auto chose fine-tune"),  # the mode first, then its options
                           (["--mode", "fine-tune"], "--epochs, --batch-size, --dim: not read by --mode fine-tune"),
                           (["--mode", "fine-tune", "--paper-recipe"], "--paper-recipe: not read")]:
        with pytest.raises(SystemExit) as err:
            train_main([*base, *extra])
        assert err.value.code == 2 and message in capsys.readouterr().err
    assert tiny_ws.store.runs() == []
    empty = without_triplets(tiny_ws, tmp_path)
    with pytest.raises(SystemExit) as err:
        train_main(["--workspace", str(empty.root), "--mode", "supervised", *base[2:]])
    assert err.value.code == 2 and "needs expert triplets" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:  # auto: refused once the workspace chose the mode, before any run
        train_main(["--workspace", str(empty.root), "--epochs", "3"])
    assert err.value.code == 2 and ("--mode auto chose frozen (no expert triplets over outlined photos). --epochs: "
                                    "not read by --mode frozen") in capsys.readouterr().err
    assert empty.store.runs() == []


def test_new_photos_are_placed_in_a_trained_runs_space(tiny_ws, tmp_path, capsys):
    run_id = train(tiny_ws, progress=False, **{**FAST, "normalize": "center-l2"})
    emb = load_embeddings(tiny_ws, run_id)
    new = tmp_path / "new"
    (new / "images").mkdir(parents=True)
    (new / "masks").mkdir()
    first = emb["image_ids"][0]
    Image.open(tiny_ws.image_path(first)).save(new / "images" / "again.png")
    Image.fromarray((tiny_ws.load_mask(first) > 0).astype(np.uint8) * 255).save(new / "masks" / "again.png")
    out = tmp_path / "d.csv"
    assert embed_main(["--workspace", str(tiny_ws.root), "--model", str(run_id), "--images", str(new),
                       "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"again: {first} (0.0" in text  # a study photo shown again lands on itself
    rows = out.read_text().splitlines()
    assert rows[0].split(",")[1:] == emb["image_ids"] and float(rows[1].split(",")[1]) < 1e-3
    with pytest.raises(SystemExit) as err:
        embed_main(["--workspace", str(tiny_ws.root), "--model", "999", "--images", str(new)])
    assert err.value.code == 2 and "no TriDerm-V" in capsys.readouterr().err
    # --model alone: the workspace's photos in the run's space, recorded as a vision-model run
    assert embed_main(["--workspace", str(tiny_ws.root), "--model", str(run_id)]) == 0
    again = load_embeddings(tiny_ws, tiny_ws.store.runs(kind="vision-model")[0]["id"])
    assert again["image_ids"] == emb["image_ids"] and np.allclose(again["image_emb"], emb["image_emb"], atol=1e-3)


def test_cuda_is_picked_when_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device().type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device().type == "cpu"
