"""SLIMP: nested loss terms, model, batching, the training CLI (resume, continual, torchrun DDP)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from annotations.infra.workspace import Workspace
from core.losses.nested import NestedContrastiveLoss, inner_losses, outer_loss, symmetric_infonce
from core.nested.model import SLIMP, crop_box, epoch_batches, masked_pool, retrieval_recall
from core.nested.tabular import TabularSchema

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- loss terms

def test_inner_loss_zero_for_single_wound_patient():
    torch.manual_seed(0)
    w, h = torch.randn(5, 4), torch.randn(5, 4)
    pidx = torch.tensor([0, 1, 1, 2, 2])  # patient 0 has one wound
    inner = inner_losses(w, h, pidx, 3, torch.tensor(10.0))
    assert inner[0].item() == 0.0
    assert (inner[1:] > 0).all()
    assert symmetric_infonce(w[:1], h[:1], torch.tensor(10.0)).item() == 0.0


def test_inner_loss_ignores_other_patients_wounds():
    torch.manual_seed(1)
    w, h = torch.randn(6, 4), torch.randn(6, 4)
    pidx = torch.tensor([0, 0, 0, 1, 1, 1])
    before = inner_losses(w, h, pidx, 2, torch.tensor(14.0))
    w2, h2 = w.clone(), h.clone()
    w2[3:] = torch.randn(3, 4) * 5
    h2[3:] = torch.randn(3, 4) * 5
    after = inner_losses(w2, h2, pidx, 2, torch.tensor(14.0))
    assert after[0].item() == before[0].item()
    assert after[1].item() != before[1].item()


def _cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_outer_loss_matches_hand_computed_three_patients():
    z = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    x = [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]
    tau = 0.5
    s = [[_cos(z[i], x[j]) / tau for j in range(3)] for i in range(3)]
    z_to_x = -sum(s[i][i] - math.log(sum(math.exp(s[i][j]) for j in range(3))) for i in range(3)) / 3
    x_to_z = -sum(s[j][j] - math.log(sum(math.exp(s[i][j]) for i in range(3))) for j in range(3)) / 3
    expected = 0.5 * (z_to_x + x_to_z)
    got = outer_loss(torch.tensor(z), torch.tensor(x), torch.tensor(1 / tau))
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # eq. 3 with λ = 0.9 on the same batch, all single-wound patients (inner terms 0)
    crit = NestedContrastiveLoss(lam=0.9, temperature=tau)
    out = crit(torch.tensor(z), torch.tensor(x), torch.arange(3), torch.tensor(z), torch.tensor(x))
    assert out["inner"].item() == 0.0
    assert out["loss"].item() == pytest.approx(0.1 * expected, rel=1e-6)


def test_temperature_is_learnable_from_clip_init():
    crit = NestedContrastiveLoss()
    assert 1 / crit.logit_scale.item() == pytest.approx(0.07)
    torch.manual_seed(2)
    w, h = torch.randn(4, 3), torch.randn(4, 3)
    crit(w, h, torch.tensor([0, 0, 1, 1]), torch.randn(2, 3), torch.randn(2, 3))["loss"].backward()
    assert crit.log_logit_scale.grad is not None and crit.log_logit_scale.grad.item() != 0.0


# ---------------------------------------------------------------- model and helpers

def _schemas():
    wound = TabularSchema.infer([{"site": "arm", "size_cm": 2.0}, {"site": "leg", "size_cm": 4.0}])
    patient = TabularSchema.infer([{"age": 10, "sex": "F"}, {"age": 30, "sex": "M"}])
    return wound, patient


def test_model_with_all_missing_metadata_is_finite():
    from core.nested.model import NestedInputs

    torch.manual_seed(3)
    wound, patient = _schemas()
    model = SLIMP(16, wound, patient, dim=8)
    inputs = NestedInputs(images=torch.randn(5, 16), masks=None, wound_tab=wound.encode([{}] * 5),
                          patient_index=torch.tensor([0, 0, 1, 2, 2]), patient_tab=patient.encode([{}, {"age": None}, {}]),
                          n_patients=3)
    out = model(inputs)
    loss = model.criterion(out["w"], out["h"], inputs.patient_index, out["z"], out["x"])["loss"]
    assert torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_epoch_batches_deterministic_capped_and_resampled():
    wounds = [np.arange(0, 5), np.arange(5, 6), np.arange(6, 9), np.array([], dtype=np.int64), np.arange(9, 12)]
    a = epoch_batches(wounds, batch_patients=2, max_wounds=2, seed=0, epoch=0)
    b = epoch_batches(wounds, batch_patients=2, max_wounds=2, seed=0, epoch=0)
    assert [[(p, w.tolist()) for p, w in bt] for bt in a] == [[(p, w.tolist()) for p, w in bt] for bt in b]
    patients = sorted(p for bt in a for p, _ in bt)
    assert patients == [0, 1, 2, 4]  # the patient without wounds is left out, every other appears once
    for bt in a:
        for p, w in bt:
            assert len(w) == min(2, len(wounds[p])) and set(w) <= set(wounds[p].tolist())
    draws = {tuple(w) for e in range(10) for bt in epoch_batches(wounds, 2, 2, 0, e) for p, w in bt if p == 0}
    assert len(draws) > 1  # the subset of patient 0's five wounds is resampled per epoch


def test_crop_box_and_masked_pool():
    assert crop_box([10, 20, 30, 30], 100, 80) == (7, 12, 33, 38)  # square side 20 × 1.3 = 26 around the centre
    assert crop_box([0, 0, 20, 20], 100, 80) == (0, 0, 26, 26)  # shifted inside the image
    assert crop_box([0, 0, 4, 4], 100, 80) == (0, 0, 16, 16)  # at least 16 px
    fmap = torch.zeros(1, 2, 4, 4)
    fmap[0, 0, :2, :2] = 1.0
    mask = torch.zeros(1, 8, 8)
    mask[0, :4, :4] = 1.0
    assert masked_pool(fmap, mask)[0].tolist() == [1.0, 0.0]
    assert masked_pool(fmap, torch.zeros(1, 8, 8))[0].tolist() == [0.25, 0.0]  # no wound cell → whole crop


def test_retrieval_recall():
    w = np.eye(3)
    h = np.array([[1.0, 0, 0], [0, 0, 1.0], [0, 1.0, 0]])
    r = retrieval_recall(w, h, ks=(1, 2, 3))
    assert r["R@1"] == pytest.approx(1 / 3) and r["R@3"] == 1.0


def _probe_data(signal: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """40 patients × 3 wounds, a wound-level binary label; features = signal · label + noise."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(40), 3)
    y = rng.integers(0, 2, len(groups))
    X = rng.normal(size=(len(groups), 6)) + signal * y[:, None]
    return X, np.array(["ab"[v] for v in y], dtype=object), groups


def test_probe_permutation_chance_and_folds():
    from core.nested.model import MIN_PATIENTS_PER_FOLD, probe

    strong = probe(*_probe_data(3.0), fractions=(1.0,), permutations=100)
    assert strong["permutations"] == 100 and strong["folds"] == 5
    assert strong["patients_per_fold"] >= MIN_PATIENTS_PER_FOLD  # 40 patients → 5 folds of 8
    assert strong["linear"]["1"]["acc"] > 0.9 and strong["p"]["linear"]["1"]["acc"] == pytest.approx(1 / 101)
    assert abs(strong["chance"]["linear"]["1"]["acc"] - 0.5) < 0.1  # permuted labels: a coin
    noise = probe(*_probe_data(0.0), fractions=(1.0,), permutations=100)
    assert noise["p"]["linear"]["1"]["acc"] >= 0.05 and noise["p"]["knn"]["acc"] >= 0.05


def test_probe_patient_level_label_one_row_per_patient():
    from core.nested.model import probe

    X, _, groups = _probe_data(0.0)
    y = np.array(["ab"[g % 2] for g in groups], dtype=object)  # a patient-level label, repeated per wound
    X[:, 0] += 3.0 * (groups % 2)
    out = probe(X, y, groups, fractions=(1.0,), level="patient", permutations=100)
    assert out["n"] == 40 and out["rows"] == "patient" and out["classes"] == {"a": 20, "b": 20}


def test_report_says_not_above_chance():
    from core.train_slimp import _probe_line

    fig = {"acc": 0.55, "bacc": 0.52}
    pr = {"linear": {"1": fig}, "knn": fig, "chance": {"linear": {"1": {"acc": 0.5, "bacc": 0.5}},
                                                       "knn": {"acc": 0.6, "bacc": 0.5}},
          "p": {"linear": {"1": {"acc": 0.01, "bacc": 0.3}}, "knn": {"acc": 0.7, "bacc": 0.4}}}
    line = _probe_line("image w", pr)
    assert "LP100% acc  55.0 (chance 50.0, p 0.01)  BA  52.0 (chance 50.0, p 0.30, not above chance)" in line
    assert "kNN    acc  55.0 (chance 60.0, p 0.70, not above chance)" in line


# ---------------------------------------------------------------- CLI on a tiny synthetic workspace

def _tiny_workspace(root: Path) -> Workspace:
    """6 synthetic patients, 10 photos, 15 wounds (two single-wound patients), gaps in metadata."""
    ws = Workspace(root)
    rng = np.random.default_rng(0)
    layout = {"p1": [2, 1], "p2": [1], "p3": [3], "p4": [1, 2], "p5": [1], "p6": [2, 1, 1]}
    sites, subtypes = ["arm", "leg", "back"], ["A", "B"]
    n = 0
    for pi, (pid, photos) in enumerate(layout.items()):
        ws.store.upsert_patient(pid, {"age": None if pi == 2 else 10 + 7 * pi, "sex": "FM"[pi % 2],
                                      "subtype": subtypes[pi % 2]})
        for k, n_wounds in enumerate(photos):
            image_id = f"{pid}_{k}"
            img = (rng.random((64, 80, 3)) * 255).astype(np.uint8)
            labels = np.zeros((64, 80), dtype=np.int32)
            for wi in range(1, n_wounds + 1):
                x0 = 4 + 24 * (wi - 1)
                labels[10:30, x0:x0 + 18] = wi
                img[10:30, x0:x0 + 18, 0] = 150 + 30 * (pi % 3)
            Image.fromarray(img).save(ws.images_dir / f"{image_id}.png")
            ws.store.upsert_image(image_id, f"{image_id}.png", f"sha{image_id}", 80, 64, pid, {"camera": "phone"})
            ws.save_mask(image_id, labels)
            for wi in range(1, n_wounds + 1):
                meta = {"site": sites[(n + wi) % 3], "size_cm": None if n % 4 == 0 else 1.0 + n % 5}
                ws.store.upsert_wound(image_id, wi, 360, [4 + 24 * (wi - 1), 10, 22 + 24 * (wi - 1), 30], "", meta)
                n += 1
    ids = [im["image_id"] for im in ws.store.images()]
    for i in range(len(ids) - 2):
        ws.store.add_triplet(ids[i], ids[i + 1], ids[i + 2], "j", "expert:test")
    return ws


@pytest.fixture
def tiny_ws(tmp_path) -> Workspace:
    return _tiny_workspace(tmp_path / "ws")


COMMON = ["--epochs", "2", "--batch-size", "4", "--max-wounds", "2", "--crop-size", "64", "--lr", "1e-3", "--dim", "16"]


def _run(ws: Workspace, *extra: str) -> dict:
    from core.train_slimp import main

    assert main(["--workspace", str(ws.root), *COMMON, *extra]) == 0
    return ws.store.runs("slimp")[0]


@pytest.mark.slow
def test_cli_trains_evaluates_and_resumes(tiny_ws, capsys):
    run = _run(tiny_ws, "--target", "subtype", "--ablation")
    assert run["status"] == "done" and run["config"]["modality"] == "nested"
    assert len(run["metrics"]["loss"]) == 2 and all(math.isfinite(v) for v in run["metrics"]["loss"])
    assert len(run["metrics"]["epoch_seconds"]) == 2 and min(run["metrics"]["epoch_seconds"]) > 0
    ev = run["metrics"]["eval"]
    assert set(ev["retrieval"]) >= {"R@1", "R@5", "R@10"}
    assert ev["triplets"]["n"] == 8
    assert set(ev["probe"]["linear"]) == {"0.01", "0.1", "1"}
    assert list(ev["ablation"])[1:] == ["image w", "image w + wound meta h", "w + h + patient meta x"]
    assert "subtype" not in run["config"]["patient_fields"]  # the probe target is not an input
    out = capsys.readouterr().out
    assert "R@1" in out and "triplet agreement" in out and "w + h + patient meta x" in out
    assert ev["probe"]["permutations"] == 100 and ev["probe"]["rows"] == "patient" and ev["probe"]["n"] == 6
    assert "label permutations within the same folds" in out and sum(line.count("(chance ") for line in out.splitlines() if " acc " in line) == 5 * 8
    from core.runtime import load_embeddings

    emb = load_embeddings(tiny_ws, run["id"])
    assert len(emb["image_ids"]) == 10 and emb["image_emb"].shape == (10, 32)
    # resume: 2 epochs then +1 equals 3 straight epochs
    from core.train_slimp import main

    assert main(["--workspace", str(tiny_ws.root), *COMMON]) == 0
    first = tiny_ws.store.runs("slimp")[0]["id"]
    assert main(["--workspace", str(tiny_ws.root), "--resume", str(first), "--epochs", "3"]) == 0
    resumed = tiny_ws.store.run(first)["metrics"]["loss"]
    straight = _run(tiny_ws, "--epochs", "3")["metrics"]["loss"]
    assert len(resumed) == 3
    np.testing.assert_allclose(resumed, straight, rtol=1e-5)


def test_cli_ablation_without_target_is_a_clean_error(tiny_ws, capsys):
    from core.train_slimp import main

    with pytest.raises(SystemExit) as e:
        main(["--workspace", str(tiny_ws.root), *COMMON, "--ablation"])
    assert e.value.code == 2 and "--ablation compares linear probes of a target column: give --target" in capsys.readouterr().err
    assert tiny_ws.store.runs("slimp") == []
    with pytest.raises(SystemExit) as e:
        main(["--workspace", str(tiny_ws.root), *COMMON, "--target", "subtype", "--permutations", "10"])
    assert e.value.code == 2 and "--permutations must be ≥ 100" in capsys.readouterr().err


def test_cli_bad_target_is_a_clean_error(tiny_ws, capsys):
    from core.train_slimp import main

    with pytest.raises(SystemExit) as e:
        main(["--workspace", str(tiny_ws.root), *COMMON, "--target", "nope"])
    assert e.value.code == 2 and "nope" in capsys.readouterr().err
    assert tiny_ws.store.runs("slimp") == []


@pytest.mark.slow
def test_continual_trains_only_stem_and_tabular_input_embeddings(tiny_ws):
    from core.vision.backbones import load_backbone

    base = _run(tiny_ws)
    init = torch.load(tiny_ws.runs_dir / str(base["id"]) / "checkpoint.pt", weights_only=True)["model"]
    cont = _run(tiny_ws, "--continual", "--init", str(base["id"]), "--epochs", "1")
    after = torch.load(tiny_ws.runs_dir / str(cont["id"]) / "checkpoint.pt", weights_only=True)["model"]
    bb = load_backbone("efficientnet-lite0@stage5", device="cpu")
    trunk = {f"trunk.{k}": v for k, v in bb._features.state_dict().items()}
    stem_ids = {id(p) for p in bb.stem_parameters()}
    stem = {f"trunk.{n}" for n, p in bb._features.named_parameters() if id(p) in stem_ids}
    tab = {f"{enc}.{n}" for enc in ("wound_encoder", "patient_encoder")
           for n in ("num_weight", "num_bias", "cat_table.weight", "missing", "field_embedding")}
    changed = set()
    for key, value in after.items():
        ref = trunk[key] if key.startswith("trunk.") else init[key]
        if not torch.equal(ref, value):
            changed.add(key)
    assert changed and changed <= stem | tab, f"unexpected changes: {sorted(changed - stem - tab)}"
    assert changed & stem and changed & tab


@pytest.mark.slow
def test_torchrun_two_processes_matches_single_process(tiny_ws):
    args = ["--workspace", str(tiny_ws.root), *COMMON]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
                    "-m", "core.train_slimp", *args], cwd=REPO, env=env, check=True, capture_output=True, timeout=600)
    ddp = tiny_ws.store.runs("slimp")[0]
    assert ddp["config"]["world_size"] == 2 and ddp["status"] == "done"
    single = _run(tiny_ws)
    assert single["config"]["world_size"] == 1
    np.testing.assert_allclose(ddp["metrics"]["loss"], single["metrics"]["loss"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ddp["metrics"]["inner"], single["metrics"]["inner"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ddp["metrics"]["outer"], single["metrics"]["outer"], rtol=1e-5, atol=1e-6)
