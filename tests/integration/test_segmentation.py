"""core.segmentation: training on tiny synthetic masks, suggestions, click-to-outline, checkpoints, the default
segmenter shipped with the package, the training job and ``core.segment``."""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from core import segment
from core import train_segmenter as job
from core.segmentation import (
    SamClicker,
    SamUnavailable,
    Segmenter,
    SegmenterError,
    load_segmenter,
    outline_from_click,
    suggest_outlines,
)
from core.segmentation.defaults import SegmenterConfig
from core.segmentation.interactive import SAM_PATCH_KEY, click_outline
from core.segmentation.metrics import boundary_f, dice, iou, match_wounds, vertices_to_move
from core.segmentation.model import RUN_KIND, default_path, encoder, load_default, new_net, inference_sizes
from core.segmentation.training import (
    CLOSE_UP,
    STRONG,
    augment,
    cache_features,
    fit_network,
    folder_samples,
    series_group,
    split_groups,
    train_segmenter,
)

REPO = Path(__file__).resolve().parents[2]

SIZE = 64


def _photo(rng: np.random.Generator, wounds: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """A skin-toned photo with red discs (cx, cy, r) and its label map."""
    img = np.empty((SIZE, SIZE, 3), np.uint8)
    img[:] = (224, 180, 150)
    img = np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
    labels = np.zeros((SIZE, SIZE), np.uint8)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    for k, (cx, cy, r) in enumerate(wounds, start=1):
        disc = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
        img[disc] = (170, 40, 40)
        labels[disc] = k
    return img, labels


def _dataset(root: Path, n: int, with_masks: bool = True) -> Path:
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(n):
        wounds = [(int(rng.integers(14, 50)), int(rng.integers(14, 50)), int(rng.integers(5, 12)))]
        img, labels = _photo(rng, wounds)
        Image.fromarray(img).save(root / "images" / f"p{i}.png")
        if with_masks:
            Image.fromarray(labels).save(root / "masks" / f"p{i}.png")
    return root


class MapSegmenter:
    """A stand-in segmenter whose probability map is fixed (tests the logic around the model)."""

    threshold = 0.5

    def __init__(self, prob: np.ndarray) -> None:
        self.prob = prob.astype(np.float32)

    def probability(self, image: Image.Image) -> np.ndarray:
        assert image.size == self.prob.shape[::-1]
        return self.prob


def _workspace(tmp_path: Path, n: int = 3, with_masks: bool = True) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, _dataset(tmp_path / "ds", n, with_masks))
    return ws


def test_metrics_on_known_masks():
    a = np.zeros((20, 20), bool)
    a[5:15, 5:15] = True
    b = np.zeros((20, 20), bool)
    b[5:15, 10:20] = True
    assert dice(a, b) == pytest.approx(0.5) and iou(a, b) == pytest.approx(50 / 150)
    assert dice(a, a) == 1 and boundary_f(a, a) == 1 and boundary_f(a, np.zeros_like(a)) == 0
    labels = np.zeros((20, 20), np.int32)
    labels[5:15, 5:15] = 1
    labels[0:3, 0:3] = 2
    matched = match_wounds(b, labels)
    assert (matched[1] == b).all() and not matched[2].any()
    assert vertices_to_move(a, a) == 0 and vertices_to_move(np.zeros_like(a), a) == 4


def test_series_groups_keep_near_duplicates_together():
    assert series_group("foot-ulcer-2-3") == series_group("foot-ulcer-2-1") == "foot-ulcer-2"
    assert series_group("foot-ulcer1-5") == "foot-ulcer1"
    assert series_group("foot-ulcer-0001") == "foot-ulcer-0001"


def test_augmented_views_move_the_mask_with_the_photo():
    rng = np.random.default_rng(0)
    mask = np.zeros((40, 60), bool)
    mask[5:25, 10:30] = True
    mask[30:38, 45:58] = True
    img = np.where(mask[..., None], np.array([255, 0, 0], np.uint8), np.array([0, 0, 255], np.uint8))
    sizes = set()
    unrotated = replace(STRONG, rotation=0.0, blur=0.0)  # scale and colour only: the mask follows exactly
    for _ in range(20):
        photo, m = augment(Image.fromarray(img), mask, rng, unrotated)
        out = np.asarray(photo).astype(int)
        assert m.shape == out.shape[:2] and ((out[..., 0] > out[..., 2]) == m).all()
        sizes.add(m.shape[1] > 60 or m.shape[0] > 40)
    assert sizes == {True, False}  # both zoomed out (reflect-padded) and zoomed in
    turned = 0
    for _ in range(20):  # the strong views rotate and blur: the mask follows up to interpolated edge pixels
        photo, m = augment(Image.fromarray(img), mask, rng)
        out = np.asarray(photo).astype(int)
        assert m.shape == out.shape[:2] and ((out[..., 0] > out[..., 2]) == m).mean() > 0.93
        turned += not any(m.shape == s.shape and (m == s).all() for s in (mask, mask[::-1], mask[:, ::-1]))
    assert turned > 10


def test_close_up_views_hold_the_wound_and_zoom_in():
    """A close-up crop always holds part of a small wound (placed anywhere, a crop of a fifth of the side would
    mostly miss it), zooms out by at most the aspect jitter, and its mask follows the photo."""
    rng = np.random.default_rng(0)
    mask = np.zeros((200, 300), bool)
    mask[150:160, 250:262] = True  # 0.2 % of the photo, in a corner
    img = np.where(mask[..., None], np.array([255, 0, 0], np.uint8), np.array([0, 0, 255], np.uint8))
    shares = []
    for _ in range(40):
        photo, m = augment(Image.fromarray(img), mask, rng, replace(CLOSE_UP, colour=0.0, hue=0.0, gamma=0.0))
        out = np.asarray(photo).astype(int)
        assert m.any() and m.shape == out.shape[:2] and ((out[..., 0] > out[..., 2]) == m).all()
        assert m.shape[0] <= 200 * 1.06 and m.shape[1] <= 300 * 1.06  # at most the aspect jitter's e^0.05
        shares.append(m.mean())
    assert np.median(shares) > 3 * mask.mean()  # the wound fills more of a close-up than of the photo
    anywhere = sum(augment(Image.fromarray(img), mask, rng, replace(CLOSE_UP, on_wound=False))[1].any()
                   for _ in range(40))
    assert anywhere < 20  # the control: the same crops placed anywhere mostly miss the wound


def test_training_loss_decreases_and_the_model_finds_the_wounds(tmp_path):
    samples = folder_samples(_dataset(tmp_path / "ds", 6))
    train, val = split_groups(samples, 0.2, seed=0)
    assert val and not {samples[i].group for i in train} & {samples[i].group for i in val}
    enc = encoder("cpu")
    cache = cache_features(samples, enc, size=SIZE, progress=False)
    net, losses = fit_network(cache, list(range(len(samples))), new_net(enc), epochs=30, batch_size=2, lr=3e-3,
                              progress=False)
    assert losses[-1] < 0.7 * losses[0]
    start = new_net(enc).stages.state_dict()
    assert any(not torch.equal(v, start[k]) for k, v in net.stages.state_dict().items())  # the encoder stages learn
    seg = Segmenter(net, enc, input_size=SIZE)
    prob = seg.probability(samples[0].image)
    assert prob.shape == samples[0].mask.shape and prob.dtype == np.float32
    assert dice(prob >= 0.5, samples[0].mask) > 0.5


def test_a_head_only_fine_tune_changes_the_decoders_head_and_nothing_else(tmp_path):
    samples = folder_samples(_dataset(tmp_path / "ds", 3))
    enc = encoder("cpu")
    cache = cache_features(samples, enc, size=SIZE, progress=False)
    start = new_net(enc)
    net, _ = fit_network(cache, list(range(len(samples))), start, epochs=3, batch_size=2, lr=3e-3, progress=False,
                         tune="head")
    before, after = start.state_dict(), net.state_dict()
    changed = {k for k, v in after.items() if not torch.equal(v, before[k])}
    assert changed and all(k.startswith("decoder.head.") for k in changed)  # batch-norm statistics included
    with pytest.raises(ValueError, match="tune must be one of"):
        fit_network(cache, [0], start, epochs=1, progress=False, tune="encoder")


def test_suggestions_respect_min_area_and_never_cover_existing_outlines(tmp_path):
    ws = _workspace(tmp_path)
    existing = ws.load_mask("p0") > 0
    prob = np.zeros(existing.shape, np.float32)
    prob[existing] = 0.9                       # the model finds the outlined wound again …
    prob[0:4, 0:4] = 0.9                       # … a 16-px speck (below min area 25) …
    prob[56:64, 0:10] = 0.8                    # … and a new 80-px wound
    ys, xs = np.nonzero(existing)
    prob[ys.min():ys.max() + 1, xs.max():xs.max() + 3] = 0.9  # a rim touching the outlined wound
    out = suggest_outlines(ws, "p0", segmenter=MapSegmenter(prob))
    assert all(m.sum() >= ws.min_wound_area for m in out)
    assert not any((m & existing).any() for m in out)
    assert any(m[60, 5] for m in out) and not any(m[1, 1] for m in out)
    ws.store.set_meta("min_wound_area", 100)
    assert not any(m[60, 5] for m in suggest_outlines(ws, "p0", segmenter=MapSegmenter(prob)))


def test_suggestions_skip_wounds_found_again_on_or_beside_existing_outlines(tmp_path):
    """The model finds an outlined wound again a little larger (3 px all round): that component is skipped
    whole, never trimmed into a rim around the outline; so is one 1 px beside an outline; a wound apart
    from every outline is still suggested, and the skipped ones are counted."""
    from scipy import ndimage

    from core.segmentation import suggest_outlines_by

    ws = _workspace(tmp_path)
    existing = ws.load_mask("p0") > 0
    ys, xs = np.nonzero(existing)
    assert ys.max() + 5 < 56
    far = np.zeros(existing.shape, np.float32)
    far[56:64, 40:50] = 0.8  # an 80-px wound away from the outline
    grown = ndimage.binary_dilation(existing, iterations=3)
    rim = grown & ~existing
    assert rim.sum() >= ws.min_wound_area  # what the old code proposed: a rim large enough to be shown
    beside = np.zeros(existing.shape, bool)
    beside[ys.max() + 2:ys.max() + 5, xs.min():xs.min() + 12] = True  # one skin row from the outline
    for found in (grown, beside):
        prob = np.maximum(far, np.where(found, np.float32(0.9), np.float32(0)))
        out, skipped = suggest_outlines_by(ws, "p0", segmenter=MapSegmenter(prob))
        assert [int(m.sum()) for m in out] == [80] and out[0][60, 45] and skipped == 1
        assert [int(m.sum()) for m in suggest_outlines(ws, "p0", segmenter=MapSegmenter(prob))] == [80]
    ws.store.set_meta("min_wound_area", 100)  # below the minimum: never shown, and not counted as skipped
    out, skipped = suggest_outlines_by(ws, "p0", segmenter=MapSegmenter(far))
    assert out == [] and skipped == 0


def test_a_new_workspace_suggests_with_the_default_segmenter(tmp_path):
    ws = _workspace(tmp_path)
    seg = load_segmenter(ws)
    assert seg.source == "default" and seg.run_id is None
    out = suggest_outlines(ws, "p0")
    assert isinstance(out, list) and all(m.shape == (SIZE, SIZE) and m.sum() >= ws.min_wound_area for m in out)


def test_the_default_segmenter_ships_with_its_model_card():
    path = default_path()
    assert path.is_file() and path.stat().st_size <= 20 * 2**20
    seg = load_default("cpu")
    photo = Image.fromarray(_photo(np.random.default_rng(1), [(32, 32, 12)])[0])
    assert seg.probability(photo).shape == (SIZE, SIZE)
    card = (path.parent / "MODEL_CARD.md").read_text(encoding="utf-8")
    for needed in ("fuseg-dev", "Medetec", "licen", "seed", "Dice", "Intended use", "darker skin", "blister",
                   "dressing", "python -m core.train_segmenter --pretrain"):
        assert needed.lower() in card.lower(), needed
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    assert "default/*.safetensors" in data["core.segmentation"] and "default/*.md" in data["core.segmentation"]


def test_the_model_card_quotes_the_shipped_file_and_the_stored_results():
    """The card's SHA-256 is the shipped file's, its threshold the file's, and its metrics table quotes every row of
    results/segmentation_default.json's main table: retraining the default or regenerating the result makes this
    test name every figure of the card that has moved."""
    card = (default_path().parent / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert hashlib.sha256(default_path().read_bytes()).hexdigest() in card
    assert f"**Threshold {load_default('cpu').threshold:g}**" in card
    stored = json.loads((REPO / "results" / "segmentation_default.json").read_text(encoding="utf-8"))
    for row in stored["tables"][0]["rows"]:
        c = row[2]
        assert f"{c['mean']:.3f} ± {c['sd']:.3f} [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}]" in card, row[0]
        assert row[6] in card, (row[0], "area ratio")


def test_click_returns_the_clicked_component_and_exclude_removes_a_region(tmp_path):
    ws = _workspace(tmp_path)
    ws.save_mask("p1", np.zeros((SIZE, SIZE), np.uint8))  # no existing outline on p1
    prob = np.zeros((SIZE, SIZE), np.float32)
    prob[5:20, 5:20] = 0.9
    prob[40:60, 30:60] = 0.9
    seg = MapSegmenter(prob)
    out = outline_from_click(ws, "p1", 10, 10, segmenter=seg)
    assert (out == (prob > 0.5) & (np.arange(SIZE)[:, None] < 30)).all()
    both = outline_from_click(ws, "p1", 35, 50, segmenter=seg)
    assert both[50, 55] and not both[10, 10]
    trimmed = outline_from_click(ws, "p1", 32, 50, segmenter=seg, exclude=[(58, 50)])
    assert trimmed[50, 32] and not trimmed[50, 58] and trimmed.sum() < both.sum()
    with pytest.raises(ValueError, match="outside"):
        outline_from_click(ws, "p1", SIZE, 3, segmenter=seg)


def test_grabcut_fallback_outlines_the_clicked_wound(tmp_path):
    ws = _workspace(tmp_path, n=1)
    truth = ws.load_mask("p0") > 0
    ys, xs = np.nonzero(truth)
    ws.save_mask("p0", np.zeros_like(truth, np.uint8))
    out = click_outline(ws.load_image("p0"), int(xs.mean()), int(ys.mean()))  # no model → GrabCut
    assert dice(out, truth) > 0.8


def test_click_says_which_method_proposed_the_outline(tmp_path):
    from core.segmentation.interactive import BY_GRABCUT, BY_MODEL, outline_from_click_by

    ws = _workspace(tmp_path, n=2)
    ws.save_mask("p1", np.zeros((SIZE, SIZE), np.uint8))
    prob = np.zeros((SIZE, SIZE), np.float32)
    prob[5:20, 5:20] = 0.9
    assert outline_from_click_by(ws, "p1", 10, 10, segmenter=MapSegmenter(prob))[1] == BY_MODEL
    # the model sees no wound under this click: GrabCut proposes, and says so
    assert outline_from_click_by(ws, "p1", 40, 40, segmenter=MapSegmenter(prob))[1] == BY_GRABCUT
    assert outline_from_click_by(ws, "p1", 40, 40)[1] == BY_GRABCUT  # no model trained
    assert "not a wound model" in BY_GRABCUT


def test_click_on_an_existing_outline_proposes_nothing(tmp_path):
    ws = _workspace(tmp_path, n=1)
    ys, xs = np.nonzero(ws.load_mask("p0"))
    assert not outline_from_click(ws, "p0", int(xs[0]), int(ys[0]), segmenter=MapSegmenter(np.ones((SIZE, SIZE)))).any()


def test_job_trains_records_and_loads_the_segmenter(tmp_path, capsys):
    ws = _workspace(tmp_path, n=4)
    assert load_segmenter(ws).source == "default"
    assert job.main(["--workspace", str(ws.root), "--epochs", "2", "--device", "cpu", "--val-fraction", "0.25"]) == 0
    out = capsys.readouterr().out
    run = ws.store.runs(kind=RUN_KIND)[0]
    assert run["status"] == "done" and len(run["metrics"]["loss"]) == 2 and 0 <= run["metrics"]["dice"] <= 1
    before = run["metrics"]["dice_start"]  # the default it fine-tuned, on the same held-out photos
    assert 0 <= before <= 1 and f"held-out Dice {run['metrics']['dice']:.3f} on 1 photos (the segmenter it started " \
        f"from: {before:.3f} on the same photos)" in out
    assert ("warning: the fine-tune outlines" in out) == (run["metrics"]["dice"] < before)
    assert run["config"]["start"] == "default" and run["config"]["tune"] == "head"  # the head alone (issue 48)
    seg = load_segmenter(ws)
    start, tuned = load_default("cpu").net.state_dict(), seg.net.state_dict()
    changed = {k for k in start if not torch.equal(start[k], tuned[k])}
    assert changed and all(k.startswith("decoder.head.") for k in changed)
    assert seg.run_id == run["id"] and seg.source == f"run {run['id']}"
    assert len(outline_from_click(ws, "p0", 0, 0, segmenter=seg).shape) == 2


def test_a_workspace_run_fine_tunes_the_default_and_pretrain_starts_from_imagenet(tmp_path, capsys):
    ws = _workspace(tmp_path, n=3)
    assert job.main(["--workspace", str(ws.root), "--epochs", "1", "--lr", "1e-12", "--device", "cpu",
                     "--val-fraction", "0"]) == 0
    tuned = load_segmenter(ws).net.state_dict()
    default = load_default("cpu").net.state_dict()
    weights = [k for k in default if "running" not in k and "num_batches" not in k]
    assert all(torch.allclose(tuned[k], default[k], atol=1e-6) for k in weights)  # a vanishing step: still the default
    imagenet = new_net(encoder("cpu")).stages.state_dict()
    assert not all(torch.allclose(v, imagenet[k]) for k, v in load_default("cpu").net.stages.state_dict().items())
    with pytest.raises(SystemExit) as exit_:
        job.main(["--workspace", str(ws.root), "--pretrain", "--epochs", "1"])
    assert exit_.value.code == 2 and "--pretrain trains on dataset folders only" in capsys.readouterr().err
    assert len(ws.store.runs(kind=RUN_KIND)) == 1


def test_a_pretrain_run_is_the_same_for_the_same_seed(tmp_path):
    """The fresh decoder's weights come from the run's seed, not from the process's random state."""
    data = _dataset(tmp_path / "ds", 3)
    weights = []
    for name in ("a", "b"):
        torch.manual_seed(len(weights))  # whatever the global state, the seed decides
        ws = Workspace(tmp_path / name)  # the function, not the job: the job installs its model as the default
        train_segmenter(ws, [data], SegmenterConfig(epochs=1, seed=3, val_fraction=0, pretrain=True), progress=False)
        weights.append(load_segmenter(ws).net.state_dict())
    assert all(torch.equal(v, weights[1][k]) for k, v in weights[0].items())
    state = torch.random.get_rng_state()
    enc = encoder("cpu")
    fresh = [new_net(enc, seed=s).decoder.state_dict() for s in (0, 0, 1)]
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(v, fresh[1][k]) for k, v in fresh[0].items())
    assert not all(torch.equal(v, fresh[2][k]) for k, v in fresh[0].items())


def test_no_masks_is_one_clear_error_and_nothing_is_written(tmp_path, capsys):
    ws = _workspace(tmp_path, with_masks=False)
    with pytest.raises(SystemExit) as exit_:
        job.main(["--workspace", str(ws.root), "--epochs", "1"])
    assert exit_.value.code == 2
    assert "no wound masks to train on" in capsys.readouterr().err
    assert ws.store.runs() == [] and not any(ws.runs_dir.iterdir())


def test_a_checkpoint_from_another_backbone_is_refused(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    enc = encoder("cpu")
    path = Segmenter(new_net(enc), enc).save(tmp_path / "seg.safetensors")
    assert isinstance(Segmenter.load(path, device="cpu"), Segmenter)
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
    save_file(load_file(str(path)), str(tmp_path / "other.safetensors"), {**meta, "backbone": "dermlip:hub-dermlip"})
    with pytest.raises(SegmenterError, match="trained over backbone 'dermlip"):
        Segmenter.load(tmp_path / "other.safetensors", device="cpu")
    torch.save({"triderm_backbone": "efficientnet-lite0", "state_dict": {}}, tmp_path / "bb.pt")
    with pytest.raises(SegmenterError, match="not a TriDerm segmenter checkpoint"):
        Segmenter.load(tmp_path / "bb.pt")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "any.safetensors"), {"format": "other"})
    with pytest.raises(SegmenterError, match="not a TriDerm segmenter checkpoint"):
        Segmenter.load(tmp_path / "any.safetensors")


def test_sam_without_the_package_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "segment_anything", None)  # makes the import fail
    with pytest.raises(SamUnavailable, match="pip install segment-anything"):
        SamClicker(tmp_path / "sam_vit_b.pth")
    assert not any(tmp_path.iterdir())


def test_sam_reports_a_missing_or_unloadable_checkpoint(tmp_path):
    pytest.importorskip("segment_anything")
    with pytest.raises(SamUnavailable, match="not found"):
        SamClicker(tmp_path / "sam_vit_b.pth")
    (tmp_path / "garbage.pth").write_bytes(b"not a checkpoint")
    enc = encoder("cpu")
    torch.save(new_net(enc).state_dict(), tmp_path / "segmenter.pt")  # a checkpoint, but not SAM's
    torch.save({SAM_PATCH_KEY: torch.zeros(768, 3, 16, 16)}, tmp_path / "sam_vit_b_cut.pth")  # vit_b width only
    before = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in tmp_path.iterdir())
    for name, says in (("garbage.pth", "not a loadable Segment Anything checkpoint"),
                       ("segmenter.pt", f"no {SAM_PATCH_KEY}"),
                       ("sam_vit_b_cut.pth", "not a loadable Segment Anything vit_b checkpoint")):
        with pytest.raises(SamUnavailable, match=says):
            SamClicker(tmp_path / name)
    assert sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in tmp_path.iterdir()) == before


@pytest.mark.slow
def test_sam_loads_a_local_checkpoint_and_answers_a_click(tmp_path):
    """A real vit_b checkpoint (random weights: no download here) goes through the product's loading path."""
    sam = pytest.importorskip("segment_anything")
    torch.manual_seed(0)
    torch.save(sam.sam_model_registry["vit_b"](checkpoint=None).state_dict(), tmp_path / "any_name.pth")
    clicker = SamClicker(tmp_path / "any_name.pth", device="cpu")
    assert clicker.model_type == "vit_b"
    ws = _workspace(tmp_path, n=1)
    existing = ws.load_mask("p0") > 0
    photo = ws.load_image("p0")
    raw = clicker.outline(photo, 3, 3)
    assert raw.shape == existing.shape and raw.dtype == bool
    ys, xs = np.nonzero(~existing)
    out = outline_from_click(ws, "p0", int(xs[0]), int(ys[0]), segmenter=clicker)
    assert out.shape == existing.shape and out.dtype == bool and not (out & existing).any()


def test_probability_maps_are_reused_for_the_same_photo():
    enc = encoder("cpu")
    seg = Segmenter(new_net(enc), enc, input_size=SIZE)
    photo = Image.fromarray(np.full((20, 30, 3), 120, np.uint8))
    first = seg.probability(photo)
    assert first.shape == (20, 30) and seg.probability(photo.copy()) is first
    assert seg.probability(Image.fromarray(np.full((20, 30, 3), 121, np.uint8))) is not first


def test_test_time_sizes_average_the_logits_of_each_size():
    """Two sizes: the sigmoid of the mean of each size's logit map (as one-size segmenters give them)."""
    enc = encoder("cpu")
    net = new_net(enc, seed=3, prior=None)
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8))
    assert inference_sizes(512) == [512, 640] and inference_sizes(SIZE, (1.0, 1.25)) == [SIZE, SIZE + 32]
    both = Segmenter(net, enc, input_size=SIZE, scales=(1.0, 1.25))
    assert both.sizes == [SIZE, SIZE + 32]
    logit = [np.log(p / (1 - p)) for p in (Segmenter(net, enc, input_size=s, scales=(1.0,)).probability(photo)
                                           for s in both.sizes)]
    assert not np.allclose(logit[0], logit[1], atol=1e-3)  # the sizes see the photo differently
    assert np.allclose(both.probability(photo), 1 / (1 + np.exp(-(logit[0] + logit[1]) / 2)), atol=1e-5)
    with pytest.raises(SegmenterError, match="scales"):
        Segmenter(net, enc, input_size=SIZE, scales=())


def test_benchmark_folds_keep_photo_series_together():
    from benchmarks.segmentation import group_folds, otsu_red
    from core.segmentation.training import Sample

    names = ["a-0001", "a-0002", "a-0003", "s-2-1", "s-2-2", "s-2-3", "t1-1", "t1-2", "b-0004", "b-0005"]
    photo = Image.fromarray(np.zeros((4, 4, 3), np.uint8))
    samples = [Sample(n, series_group(n), photo, np.zeros((4, 4), bool)) for n in names]
    folds = group_folds(samples, 3, seed=0)
    assert sorted(i for f in folds for i in f) == list(range(len(names)))
    for series in ("s-2", "t1"):
        assert sum(any(samples[i].group == series for i in f) for f in folds) == 1
    assert max(map(len, folds)) - min(map(len, folds)) <= 2
    img = np.full((10, 10, 3), 200, np.uint8)
    img[2:5, 2:5, 0] = 60
    assert otsu_red(Image.fromarray(img)).sum() == 9


def _folder(root: Path, n: int) -> Path:
    rng = np.random.default_rng(2)
    root.mkdir(parents=True)
    for i in range(n):
        Image.fromarray(_photo(rng, [(20, 20, 9), (48, 46, 8)])[0]).save(root / f"photo-{i}.png")
    return root


def test_segment_writes_label_maps_in_the_dataset_layout(tmp_path, capsys):
    images = _folder(tmp_path / "images", 2)
    enc = encoder("cpu")
    seg = Segmenter(new_net(enc), enc, input_size=SIZE)
    nn = seg.net.decoder.head[-1]
    torch.nn.init.zeros_(nn.weight)
    torch.nn.init.constant_(nn.bias, 5.0)  # a network sure everything is wound: one wound per photo
    model = seg.save(tmp_path / "model.safetensors")
    out = tmp_path / "out"
    assert segment.main(["--images", str(images), "--out", str(out), "--model", str(model), "--device", "cpu"]) == 0
    assert "2 photos segmented" in capsys.readouterr().out
    for i in range(2):
        labels = np.asarray(Image.open(out / "masks" / f"photo-{i}.png"))
        assert labels.shape == (SIZE, SIZE) and set(np.unique(labels)) == {1}
    record = json.loads((out / "segment.json").read_text())
    assert record["photos"] == 2 and record["wounds"] == 2 and record["checkpoint"] == str(model)
    ws = Workspace(tmp_path / "ws")  # the output imports like any dataset
    shutil.copytree(images, out / "images")
    import_dataset(ws, out)
    assert len(ws.store.wounds()) == 2


def test_segment_with_the_default_on_real_looking_photos(tmp_path):
    images = _folder(tmp_path / "images", 1)
    assert segment.main(["--images", str(images), "--out", str(tmp_path / "out"), "--device", "cpu"]) == 0
    labels = np.asarray(Image.open(tmp_path / "out" / "masks" / "photo-0.png"))
    assert labels.shape == (SIZE, SIZE) and labels.dtype == np.uint8
    assert json.loads((tmp_path / "out" / "segment.json").read_text())["model"] == "default"


@pytest.mark.parametrize("case, says", [("empty", "no photos"), ("unreadable", "bad.png: cannot be read as a PNG image"),
                                        ("full", "the output folder is not empty"),
                                        ("threshold", "--threshold must lie strictly between 0 and 1"),
                                        ("run", "no finished segmenter run 7")])
def test_segment_bad_input_is_one_clear_error_and_writes_nothing(tmp_path, capsys, case, says):
    images = _folder(tmp_path / "images", 0 if case == "empty" else 2)
    out = tmp_path / "out"
    argv = ["--images", str(images), "--out", str(out), "--device", "cpu"]
    if case == "unreadable":
        (images / "bad.png").write_bytes(b"not a png")
    if case == "full":
        out.mkdir()
        (out / "keep.txt").write_text("x")
    argv += {"threshold": ["--threshold", "1.5"], "run": ["--model", "7", "--workspace", str(tmp_path / "ws")]
             }.get(case, [])
    with pytest.raises(SystemExit) as exit_:
        segment.main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err
    assert (sorted(p.name for p in out.iterdir()) == ["keep.txt"]) if case == "full" else not out.exists()


def test_band_recall_splits_the_missed_wound_into_its_outline_band_and_its_core():
    """A suggestion that stops 2 px inside a 20-px square misses its band (within 15 % of the equivalent radius,
    1.7 px, of the outline) and keeps the core but its outer ring; each wound gets its own band width."""
    from core.segmentation.metrics import band_recall
    truth = np.zeros((60, 60), bool)
    truth[5:25, 5:25] = True
    assert band_recall(truth, truth) == (1.0, 1.0) and band_recall(~truth, truth) == (0.0, 0.0)
    inner = np.zeros_like(truth)
    inner[7:23, 7:23] = True
    band, core = band_recall(inner, truth)
    assert band == 0.0 and core == pytest.approx(16 * 16 / (18 * 18))
    big = truth.copy()
    big[30:60, 30:60] = True  # touches the border: the border counts as outside, r = 16.9 → band 2.5 px
    band, core = band_recall(big, big)
    assert (band, core) == (1.0, 1.0)
    band_only = big & ~np.pad(np.ones((26, 26), bool), ((32, 2), (32, 2)))  # the big wound's ring of 2 px
    assert band_recall(band_only, big)[1] < band_recall(band_only, big)[0]
    assert band_recall(np.zeros_like(truth), np.zeros_like(truth)) == (None, None)
