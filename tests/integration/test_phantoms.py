"""Wound phantoms (core.phantoms): layout, counts, determinism, masks, latent truth and oracle;
phantom v2's planted distractors, decisive nodule, described-only attributes, text oracle and ceilings."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from core.phantoms import (
    CEILINGS,
    CONCEPTS,
    DESCRIBED_FEATURES,
    DISTRACTORS,
    LATENT_FEATURES,
    VISIBLE_FEATURES,
    PhantomTruth,
    build,
    calibrate_oracle,
    expert_rng,
    load_ceilings,
    load_text_oracle,
    load_truth,
    montage,
    read_description,
)
from core.phantoms.__main__ import main
from core.phantoms.descriptions import photo_text
from core.phantoms.render import render_photo
from core.phantoms.world import LATENT_WEIGHTS, counts_per_photo, sample_population, visible_columns, wound_features


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("phantoms_small") / "d"
    build(out, seed=3, photos=6, patients=3, wounds=14, triplets=40)
    return out


def test_default_counts_match_reference_study(demo_dataset: Path) -> None:
    images, wounds = _rows(demo_dataset / "images.csv"), _rows(demo_dataset / "wounds.csv")
    patients, triplets = _rows(demo_dataset / "patients.csv"), _rows(demo_dataset / "triplets.csv")
    assert len(images) == 53 and len(patients) == 21 and len(wounds) == 120 and len(triplets) == 513
    assert len(list((demo_dataset / "images").glob("*.png"))) == 53
    assert {r["patient_id"] for r in images} == {r["patient_id"] for r in patients}
    per_photo = np.bincount([int(r["image_id"][2:]) for r in wounds])[1:]
    assert per_photo.min() >= 1 and per_photo.max() == 16 and per_photo.sum() == 120
    meta = json.loads((demo_dataset / "dataset.json").read_text())
    assert meta["synthetic"] is True and "synthetic" in meta["name"] and meta["seed"] == 0
    assert list(triplets[0]) == ["anchor", "ref_j", "ref_k", "choice", "annotator", "latency_ms"]


def test_triplets_unique_distinct_and_skip_rate(demo_dataset: Path) -> None:
    trip = _rows(demo_dataset / "triplets.csv")
    keys = [(r["anchor"], r["ref_j"], r["ref_k"]) for r in trip]
    assert len(set(keys)) == len(keys)
    assert all(len(set(k)) == 3 for k in keys)
    assert {r["choice"] for r in trip} <= {"j", "k", "skip"}
    assert {r["annotator"] for r in trip} == {"phantom-expert"}
    skip = np.mean([r["choice"] == "skip" for r in trip])
    assert 0.02 <= skip <= 0.09


def test_masks_match_wounds_and_images(demo_dataset: Path) -> None:
    wounds = _rows(demo_dataset / "wounds.csv")
    by_image: dict[str, set[int]] = {}
    for r in wounds:
        by_image.setdefault(r["image_id"], set()).add(int(r["wound_index"]))
    for image_id, idx in by_image.items():
        img = Image.open(demo_dataset / "images" / f"{image_id}.png")
        mask_img = Image.open(demo_dataset / "masks" / f"{image_id}.png")
        assert img.mode == "RGB" and mask_img.mode == "L" and img.size == mask_img.size
        mask = np.asarray(mask_img)
        labels = set(np.unique(mask).tolist()) - {0}
        assert labels == idx == set(range(1, len(idx) + 1)), image_id
        counts = np.bincount(mask.ravel())
        assert counts[1:].min() >= 40, image_id
        for label in idx:  # one outline = one connected region (so binary-mask importers agree)
            assert ndimage.label(mask == label)[1] == 1, (image_id, label)


def test_images_look_like_photos_not_flat_fills(demo_dataset: Path) -> None:
    img = np.asarray(Image.open(demo_dataset / "images" / "ph001.png")).astype(float)
    mask = np.asarray(Image.open(demo_dataset / "masks" / "ph001.png"))
    sizes = {Image.open(p).size for p in (demo_dataset / "images").glob("*.png")}
    assert len(sizes) > 2  # varying photo sizes
    wound, skin = img[mask > 0], img[mask == 0]
    assert wound.std(axis=0).min() > 5 and skin.std(axis=0).min() > 3  # texture, lighting
    assert wound[:, 0].mean() - wound[:, 1].mean() > skin[:, 0].mean() - skin[:, 1].mean()  # wounds redder


def test_truth_agreement_of_perfect_embedding(demo_dataset: Path) -> None:
    truth_rows = _rows(demo_dataset / "truth" / "images.csv")
    ids = [r["image_id"] for r in truth_rows]
    Z = np.array([[float(r[f"z_{f}"]) for f in LATENT_FEATURES] for r in truth_rows])
    D = np.sqrt(((Z[:, None] - Z[None]) ** 2).sum(-1))
    pos = {im: n for n, im in enumerate(ids)}
    agree = [D[pos[r["anchor"]], pos[r["ref_j"]]] < D[pos[r["anchor"]], pos[r["ref_k"]]]
             if r["choice"] == "j" else D[pos[r["anchor"]], pos[r["ref_k"]]] < D[pos[r["anchor"]], pos[r["ref_j"]]]
             for r in _rows(demo_dataset / "triplets.csv") if r["choice"] != "skip"]
    assert abs(np.mean(agree) - 0.85) <= 0.04
    truth = load_truth(demo_dataset)
    assert np.allclose(truth.distance_matrix(), D)
    assert abs(truth.expected_agreement() - 0.85) < 0.01


def test_oracle_reproduces_expert_answers(demo_dataset: Path) -> None:
    truth = load_truth(demo_dataset / "truth")
    rng = expert_rng(truth.seed)
    trip = _rows(demo_dataset / "triplets.csv")
    assert [truth.answer(r["anchor"], r["ref_j"], r["ref_k"], rng) for r in trip] == [r["choice"] for r in trip]
    # Any new triplet is answered, deterministically per generator state.
    a = [truth.answer(0, 1, 2, np.random.default_rng(9)) for _ in range(3)]
    assert len(set(a)) == 1 and a[0] in {"j", "k", "skip"}
    with pytest.raises(ValueError):
        truth.answer("ph001", "ph001", "ph002", np.random.default_rng(0))
    with pytest.raises(KeyError):
        truth.answer("ph001", "nope", "ph002", np.random.default_rng(0))


def test_oracle_follows_latent_distance(demo_dataset: Path) -> None:
    truth = load_truth(demo_dataset)
    D = truth.distance_matrix()
    off = D + np.eye(len(D)) * 1e9
    i = 0
    near, far = int(np.argmin(off[i])), int(np.argmax(D[i]))
    p_skip, p_j = truth.probabilities(i, near, far)
    assert p_j > 0.95 and p_skip < 0.05
    assert truth.probabilities(i, far, near)[1] < 0.05


def test_calibration_hits_targets_on_random_latents() -> None:
    """Answers drawn from the calibrated expert agree with the latent order at the target rate
    and skip at the target rate, each inside a 99.9 % binomial interval (3.3 standard errors)."""
    latent = np.random.default_rng(1).normal(size=(40, 5))
    rng = np.random.default_rng(2)
    for target, skip in ((0.75, 0.05), (0.9, 0.15)):
        sigma, skip_scale = calibrate_oracle(latent, target_agreement=target, target_skip=skip)
        t = PhantomTruth([f"x{n}" for n in range(40)], latent, sigma, skip_scale, 0, [])
        trip = [rng.permutation(40)[:3] for _ in range(6000)]
        answers = np.array([t.answer(int(i), int(j), int(k), rng) for i, j, k in trip])
        d = np.linalg.norm(latent[:, None] - latent[None], axis=-1)
        near_j = np.array([d[i, j] < d[i, k] for i, j, k in trip])
        kept = answers != "skip"
        agree = ((answers == "j") == near_j)[kept]
        for observed, p, n in ((agree.mean(), target, kept.sum()), (1 - kept.mean(), skip, len(trip))):
            assert abs(observed - p) < 3.3 * np.sqrt(p * (1 - p) / n), (target, skip, observed, p, n)


def test_truth_concepts_and_fibrin_masks(demo_dataset: Path) -> None:
    concepts = _rows(demo_dataset / "truth" / "concepts.csv")
    truth_w = _rows(demo_dataset / "truth" / "wounds.csv")
    assert len(concepts) == len(truth_w) == 120
    assert set(concepts[0]) == {"image_id", "wound_index", *CONCEPTS}
    truth = load_truth(demo_dataset)
    assert [c["fibrin"] for c in truth.concepts()] == [int(c["fibrin"]) for c in concepts]
    for c, w in zip(concepts, truth_w):
        assert int(c["fibrin"]) == (float(w["fibrin"]) >= 0.08)
        mask = np.asarray(Image.open(demo_dataset / "masks" / f"{w['image_id']}.png"))
        fib = truth.fibrin_mask(w["image_id"])
        k = int(w["wound_index"])
        assert fib.shape == mask.shape and np.all(mask[fib == k] == k)
        share = (fib == k).sum() / (mask == k).sum()
        assert abs(share - float(w["fibrin"])) < 0.1, (w["image_id"], k)
    assert all(sum(int(c[k]) for c in concepts) > 5 for k in CONCEPTS)  # every concept occurs


def test_descriptions_follow_attributes(demo_dataset: Path) -> None:
    wounds = _rows(demo_dataset / "wounds.csv")
    concepts = _rows(demo_dataset / "truth" / "concepts.csv")
    texts = [r["description"] for r in wounds]
    assert len(set(texts)) == len(texts)
    for text, c in zip(texts, concepts):
        low = text.lower()
        if "hyperkeratotic" in low:
            assert c["hyperkeratotic_border"] == "1"
        if "deep" in low:
            assert c["deep"] == "1"
        if ("fibrin" in low or "slough" in low) and not any(n in low for n in ("no fibrin", "without fibrin",
                                                                              "free of slough", "no slough")):
            assert c["fibrin"] == "1", text
    assert any("no " in t.lower() or "without" in t.lower() for t in texts)  # negations occur
    assert sum("hemorrhagic" in t.lower() for t in texts) > 5 and sum("erythema" in t.lower() for t in texts) > 10


def test_metadata_has_realistic_missing_values(demo_dataset: Path) -> None:
    wounds = _rows(demo_dataset / "wounds.csv")
    patients = _rows(demo_dataset / "patients.csv")
    cells = [r[k] for r in wounds for k in ("anatomical_site", "size_cm", "duration_weeks")]
    cells += [r[k] for r in patients for k in ("age", "sex", "fitzpatrick")]
    missing = np.mean([c == "" for c in cells])
    assert 0.02 <= missing <= 0.12
    sizes = [float(r["size_cm"]) for r in wounds if r["size_cm"]]
    assert min(sizes) >= 0.3 and max(sizes) <= 14


def test_deterministic_per_seed(small: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    build(again, seed=3, photos=6, patients=3, wounds=14, triplets=40)
    files = sorted(p.relative_to(small) for p in small.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert all((small / f).read_bytes() == (again / f).read_bytes() for f in files)
    other = tmp_path / "other"
    build(other, seed=4, photos=6, patients=3, wounds=14, triplets=40)
    assert (other / "images" / "ph001.png").read_bytes() != (small / "images" / "ph001.png").read_bytes()


@pytest.mark.parametrize(("photos", "wounds"), [(53, 120), (4, 64), (5, 5), (20, 30)])
def test_wounds_per_photo_partition(photos: int, wounds: int) -> None:
    counts = counts_per_photo(np.random.default_rng(0), photos, wounds)
    assert len(counts) == photos and counts.sum() == wounds and counts.min() >= 1 and counts.max() <= 16
    assert (counts.max() == 16) == (wounds - photos >= 15)


def test_small_build_counts(small: Path) -> None:
    assert len(_rows(small / "wounds.csv")) == 14 and len(_rows(small / "triplets.csv")) == 40
    assert len(_rows(small / "patients.csv")) == 3 and len(list((small / "images").iterdir())) == 6


def test_montage_is_labelled_grid(small: Path) -> None:
    sheet = montage(small, n=12)
    assert sheet.mode == "RGB" and sheet.width > 600 and sheet.height > 200
    assert np.asarray(sheet)[:40].std() > 5  # caption strip holds text


def test_cli_rejects_bad_input(tmp_path: Path, capsys) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(foreign)])
    assert exc.value.code == 2 and "refusing to overwrite" in capsys.readouterr().err
    assert (foreign / "keep.txt").read_text() == "x" and not (foreign / "images").exists()
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x"), "--photos", "4", "--patients", "2", "--wounds", "5", "--triplets", "99"])
    assert exc.value.code == 2 and "triplets" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "y"), "--photos", "4", "--wounds", "80"])
    assert exc.value.code == 2


def test_patients_cluster_in_latent_space(demo_dataset: Path) -> None:
    truth = load_truth(demo_dataset)
    D = truth.distance_matrix()
    owner = {r["image_id"]: r["patient_id"] for r in _rows(demo_dataset / "images.csv")}
    pid = np.array([owner[i] for i in truth.image_ids])
    same = (pid[:, None] == pid[None]) & ~np.eye(len(pid), dtype=bool)
    assert same.any()
    assert D[same].mean() < 0.85 * D[pid[:, None] != pid[None]].mean()


def test_cli_builds_dataset_and_montage(tmp_path: Path, capsys) -> None:
    out, png = tmp_path / "demo", tmp_path / "docs" / "m.png"
    assert main(["--out", str(out), "--seed", "5", "--photos", "5", "--patients", "2", "--wounds", "7",
                 "--triplets", "12", "--montage", str(png)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["synthetic"] is True and summary["images"] == 5 and summary["wounds"] == 7
    assert Image.open(png).size[0] > 600
    # Rebuilding into an existing phantom folder replaces it (no stale files from a larger build).
    assert main(["--out", str(out), "--photos", "3", "--patients", "1", "--wounds", "3", "--triplets", "2"]) == 0
    assert sorted(p.name for p in (out / "images").iterdir()) == ["ph001.png", "ph002.png", "ph003.png"]


# --------------------------------------------------------------------------- phantom v2
def _world(seed: int = 0):
    return sample_population(np.random.default_rng([seed, 1]), 53, 21, 120)


def test_distractors_are_rendered_inside_wounds(demo_dataset: Path) -> None:
    truth_w = _rows(demo_dataset / "truth" / "wounds.csv")
    kinds = [set(filter(None, r["distractors"].split("+"))) for r in truth_w]
    assert all(sum(d in k for k in kinds) >= 10 for d in DISTRACTORS)  # every kind is planted often
    for r, k in zip(truth_w, kinds):
        assert (int(r["distractor_px"]) > 0) == bool(k) or int(r["area_px"]) < 400, r
    covered = [int(r["distractor_px"]) / int(r["area_px"]) for r, k in zip(truth_w, kinds) if k]
    assert np.median(covered) > 0.1  # large enough to move a mean-pooled feature
    planted = np.asarray(Image.open(demo_dataset / "truth" / "planted" / "ph001.png"))
    assert planted.shape == np.asarray(Image.open(demo_dataset / "masks" / "ph001.png")).shape


def test_expert_ignores_distractors_but_pixels_show_them() -> None:
    _, photos = _world()
    photo = next(p for p in photos if any(w.distractors for w in p.wounds))
    before = wound_features(photo.wounds)
    img, labels, _, planted, _ = render_photo(np.random.default_rng(5), photo, 3)
    for w in photo.wounds:
        w.distractors = ()
    plain, labels2, _, planted2, _ = render_photo(np.random.default_rng(5), photo, 3)
    assert np.array_equal(wound_features(photo.wounds), before)  # the expert's features do not move
    assert np.array_equal(labels, labels2) and (planted >= 2).any() and not (planted2 >= 2).any()
    assert np.abs(img.astype(int) - plain.astype(int))[labels > 0].mean() > 5  # the photo does


def test_nodule_is_small_decisive_and_visible(demo_dataset: Path) -> None:
    truth_w = _rows(demo_dataset / "truth" / "wounds.csv")
    with_nodule = [r for r in truth_w if float(r["nodule"]) > 0]
    assert 10 <= len(with_nodule) <= 60
    shares = [int(r["nodule_px"]) / int(r["area_px"]) for r in with_nodule]
    assert 0.03 < np.median(shares) < 0.25  # a small region of the bed
    assert all(int(r["nodule_px"]) == 0 for r in truth_w if float(r["nodule"]) == 0)
    weights = dict(zip(LATENT_FEATURES, LATENT_WEIGHTS))
    assert weights["nodule"] == max(weights.values())  # the expert's most decisive feature
    assert "nodule" in VISIBLE_FEATURES


def test_described_only_attributes_are_told_not_shown(demo_dataset: Path) -> None:
    _, photos = _world()
    photo = photos[3]
    img, *_ = render_photo(np.random.default_rng(2), photo, 2)
    before = wound_features(photo.wounds)
    for w in photo.wounds:
        w.pain, w.itch, w.bleeding, w.duration_weeks = 10 - w.pain, 10 - w.itch, "frequent", w.duration_weeks + 50
    again, *_ = render_photo(np.random.default_rng(2), photo, 2)
    assert np.array_equal(img, again)  # no pixel carries them
    changed = wound_features(photo.wounds) != before
    assert changed[:, [LATENT_FEATURES.index(f) for f in DESCRIBED_FEATURES]].any()  # the expert weighs them
    assert not changed[:, visible_columns()].any()
    wounds, truth_w = _rows(demo_dataset / "wounds.csv"), _rows(demo_dataset / "truth" / "wounds.csv")
    read = [read_description(r["description"]) for r in wounds]
    for name, col in (("pain", "pain"), ("itch", "itch"), ("log_duration", "duration_weeks")):
        stated = [(x[name], float(t[col])) for x, t in zip(read, truth_w) if not np.isnan(x[name])]
        assert len(stated) > 0.7 * len(wounds), name  # descriptions carry them
        want = [np.log(v) if name == "log_duration" else v for _, v in stated]
        assert np.allclose([s for s, _ in stated], want), name  # and read back exactly
    bleeding = [(x["bleeding"], t["bleeding"]) for x, t in zip(read, truth_w) if not np.isnan(x["bleeding"])]
    assert len(bleeding) > 0.7 * len(wounds)
    assert all(["none", "occasional", "frequent"][int(b)] == t for b, t in bleeding)


def test_text_oracle_reads_only_the_descriptions(demo_dataset: Path, tmp_path: Path) -> None:
    wounds = _rows(demo_dataset / "wounds.csv")
    by_photo: dict[str, list[str]] = {}
    for r in wounds:
        by_photo.setdefault(r["image_id"], []).append(r["description"])
    texts = {im: photo_text(d) for im, d in by_photo.items()}
    ids = sorted(texts)
    questions = [(ids[a], ids[(a + 5) % 53], ids[(a + 17) % 53]) for a in range(53)]
    oracle = load_text_oracle(demo_dataset)
    answers = [oracle.probabilities(texts[a], texts[j], texts[k]) for a, j, k in questions]
    # Spoil every hidden attribute: the oracle's answers stay the same.
    spoiled = tmp_path / "truth"
    spoiled.mkdir()
    (spoiled / "oracle.json").write_bytes((demo_dataset / "truth" / "oracle.json").read_bytes())
    again = load_text_oracle(spoiled)
    assert [again.probabilities(texts[a], texts[j], texts[k]) for a, j, k in questions] == answers
    # Its answers follow the texts: editing a told value moves them.
    a, j, k = next(q for q, (_, p) in zip(questions, answers) if 0.05 < p < 0.95)
    edited = texts[j].replace("10", "0") + " Pain 10/10 on dressing change. Frequent bleeding reported."
    assert oracle.probabilities(texts[a], edited, texts[k])[1] != oracle.probabilities(texts[a], texts[j], texts[k])[1]
    assert oracle.probabilities("", "", "")[1] == 0.5  # nothing said, nothing to choose by


def test_ceilings_stored_ordered_and_in_the_tables_metric(demo_dataset: Path) -> None:
    from core.eval.metrics import evaluate

    ceilings = load_ceilings(demo_dataset)
    truth = load_truth(demo_dataset)
    assert truth.ceilings() == ceilings and ceilings["synthetic"] is True
    bal = {k: ceilings[k]["balanced"] for k in CEILINGS}
    assert 0.6 < bal["vision"] < bal["fusion"] and 0.6 < bal["text"] < bal["fusion"] <= bal["expert"] + 0.01
    exp = {k: ceilings[k]["expected"] for k in CEILINGS}
    assert exp["vision"] < exp["fusion"] and exp["text"] < exp["fusion"] and exp["fusion"] < exp["expert"]
    # The vision ceiling is the tables' balanced agreement of the exact visible features.
    z = truth.latent * visible_columns()
    D = np.sqrt(((z[:, None] - z[None]) ** 2).sum(-1))
    rows = [dict(r, source="expert:phantom-expert") for r in _rows(demo_dataset / "triplets.csv")]
    assert evaluate(truth.image_ids, D, rows)["balanced"] == pytest.approx(bal["vision"])
    assert evaluate(truth.image_ids, truth.distance_matrix(), rows)["balanced"] == pytest.approx(bal["expert"])
