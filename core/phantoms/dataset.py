"""Writes a phantom study in the dataset-folder layout, and a montage of its photos."""
from __future__ import annotations

import csv
import io
import json
import math
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from core.phantoms.descriptions import DescriptionReader, describe, photo_text
from core.phantoms.expert import (
    ANNOTATOR,
    ANSWER_STREAM,
    TARGET_AGREEMENT,
    TARGET_SKIP,
    PhantomTruth,
    balanced_agreement,
    calibrate_oracle,
    distances,
    expert_rng,
    sample_triplets,
)
from core.phantoms.render import font, render_photo
from core.phantoms.world import (
    CONCEPTS,
    DESCRIBED_FEATURES,
    DISTRACTORS,
    LATENT_FEATURES,
    LATENT_WEIGHTS,
    MAX_WOUNDS_PER_PHOTO,
    MISSING_RATE,
    NUMERIC_ATTRIBUTES,
    THRESHOLDS,
    Photo,
    concept_presence,
    sample_population,
    standardise,
    visible_columns,
    wound_features,
)

DATASET_NAME = "TriDerm wound phantoms (synthetic)"


# --------------------------------------------------------------------------- writing
def _maybe(rng: np.random.Generator, value: Any) -> Any:
    """``value`` or '' (missing) at MISSING_RATE."""
    return "" if rng.random() < MISSING_RATE else value


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")


def _save_png(path: Path, array: np.ndarray, mode: str) -> None:
    Image.fromarray(array, mode=mode).save(path, format="PNG", compress_level=1 if mode == "RGB" else 6)


#: photos below which rendering stays in this process (starting worker processes costs about a second)
PARALLEL_FROM = 16


def _render_and_save(out: Path, seed: int, index: int, photo: Photo, fitzpatrick: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Render photo ``index`` (its own random stream, so the order of rendering changes nothing), write its photo
    and masks, and return the per-wound pixel counts (area, fibrin, nodule, distractor) and its nuisances."""
    img, labels, fib, planted, nuis = render_photo(np.random.default_rng([seed, 2, index]), photo, fitzpatrick)
    _save_png(out / "images" / f"{photo.image_id}.png", img, "RGB")
    _save_png(out / "masks" / f"{photo.image_id}.png", labels, "L")
    _save_png(out / "truth" / "fibrin" / f"{photo.image_id}.png", fib, "L")
    _save_png(out / "truth" / "planted" / f"{photo.image_id}.png", planted, "L")
    n = len(photo.wounds) + 1
    return (np.bincount(labels.ravel(), minlength=n), np.bincount(fib.ravel(), minlength=n),
            np.bincount(labels[planted == 1].ravel(), minlength=n),
            np.bincount(labels[planted >= 2].ravel(), minlength=n), nuis)


def _rendered(out: Path, seed: int, photos: list[Photo], fitzpatrick: list[int]
              ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]]:
    """:func:`_render_and_save` of every photo, in order: on every available core (spawned workers: safe beside
    threads) from :data:`PARALLEL_FROM` photos, else here."""
    workers = min(len(os.sched_getaffinity(0)), len(photos))
    args = ([out] * len(photos), [seed] * len(photos), range(len(photos)), photos, fitzpatrick)
    if workers < 2 or len(photos) < PARALLEL_FROM:
        yield from map(_render_and_save, *args)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from pool.map(_render_and_save, *args)


def build(out: str | Path, seed: int = 0, photos: int = 53, patients: int = 21, wounds: int = 120,
          triplets: int = 513, progress: bool = False) -> dict[str, Any]:
    """Write a phantom dataset to ``out``; return a summary (counts, agreement, timing)."""
    if not photos >= 3:
        raise ValueError(f"--photos must be at least 3, got {photos}")
    if not 1 <= patients <= photos:
        raise ValueError(f"--patients must be in [1, photos={photos}], got {patients}")
    if not photos <= wounds <= MAX_WOUNDS_PER_PHOTO * photos or wounds > 255 * photos:
        raise ValueError(f"--wounds must be in [photos={photos}, {MAX_WOUNDS_PER_PHOTO * photos}], got {wounds}")
    capacity = photos * (photos - 1) * (photos - 2) // 2
    if not 0 <= triplets <= capacity:
        raise ValueError(f"--triplets must be in [0, {capacity}] (distinct triplets of {photos} photos), "
                         f"got {triplets}")
    t0 = time.perf_counter()
    out = Path(out)
    rng = np.random.default_rng([seed, 1])
    pats, phs = sample_population(rng, photos, patients, wounds)
    all_wounds = [w for p in phs for w in p.wounds]
    zw, mean, std = standardise(wound_features(all_wounds))
    latent, row = [], 0
    for p in phs:
        latent.append(zw[row:row + len(p.wounds)].mean(axis=0))
        row += len(p.wounds)
    latent_arr = np.array(latent)
    sigma, skip_scale = calibrate_oracle(latent_arr, seed=seed)

    for sub in ("images", "masks", "truth"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    for sub in ("images", "masks", "truth/fibrin", "truth/planted"):
        (out / sub).mkdir(parents=True, exist_ok=True)

    meta_rng = np.random.default_rng([seed, 3])
    text_rng = np.random.default_rng([seed, 5])
    wound_rows, truth_wounds, concept_rows, image_rows, truth_images = [], [], [], [], []
    photo_texts: list[str] = []
    row = 0
    rendered = _rendered(out, seed, phs, [pats[p.patient]["fitzpatrick"] for p in phs])
    for pi, p in enumerate(tqdm(phs, desc="phantoms", unit="photo", disable=not progress)):
        pat = pats[p.patient]
        areas, fib_areas, nodule_px, distractor_px, nuis = next(rendered)
        texts = []
        image_rows.append([p.image_id, pat["patient_id"], _maybe(meta_rng, p.region), _maybe(meta_rng, p.camera),
                           _maybe(meta_rng, "flash" if nuis["flash"] else "ambient")])
        truth_images.append([p.image_id, pat["patient_id"], len(p.wounds)]
                            + [f"{v:.6f}" for v in latent_arr[pi]]
                            + [nuis[k] for k in ("width", "height", "px_per_cm", "flash", "blur_sigma", "wb_red",
                                                 "wb_blue", "background", "ruler", "light_azimuth")])
        for wi, wd in enumerate(p.wounds, start=1):
            texts.append(describe(wd, text_rng))
            wound_rows.append([p.image_id, wi, texts[-1], _maybe(meta_rng, wd.site),
                               _maybe(meta_rng, wd.size_cm), _maybe(meta_rng, wd.duration_weeks)])
            truth_wounds.append([p.image_id, wi] + [f"{wd.attrs[a]:.4f}" for a in NUMERIC_ATTRIBUTES]
                                + [wd.border, wd.size_cm, wd.width_cm, wd.duration_weeks, wd.site,
                                   int(areas[wi]), int(fib_areas[wi]), f"{wd.nodule:.4f}", int(nodule_px[wi]),
                                   wd.pain, wd.itch, wd.bleeding, "+".join(wd.distractors), int(distractor_px[wi])]
                                + [f"{v:.6f}" for v in zw[row]])
            concept_rows.append([p.image_id, wi] + list(concept_presence(wd.attrs, wd.border).values()))
            row += 1
        photo_texts.append(photo_text(texts))

    _write_csv(out / "wounds.csv", ["image_id", "wound_index", "description", "anatomical_site", "size_cm",
                                    "duration_weeks"], wound_rows)
    _write_csv(out / "images.csv", ["image_id", "patient_id", "body_region", "camera", "lighting"], image_rows)
    _write_csv(out / "patients.csv", ["patient_id", "age", "sex", "fitzpatrick", "rdeb_subtype"],
               [[p["patient_id"], _maybe(meta_rng, p["age"]), _maybe(meta_rng, p["sex"]),
                 _maybe(meta_rng, p["fitzpatrick"]), _maybe(meta_rng, p["subtype"])] for p in pats])

    truth = PhantomTruth([p.image_id for p in phs], latent_arr, sigma, skip_scale, seed, [])
    trip = sample_triplets(np.random.default_rng([seed, 6]), photos, triplets)
    ans_rng, lat_rng = expert_rng(seed), np.random.default_rng([seed, 8])
    trip_rows, choices = [], []
    for i, j, k in trip:
        choice = truth.answer(int(i), int(j), int(k), ans_rng)
        choices.append(choice)
        p_j = truth.probabilities(int(i), int(j), int(k))[1]  # harder triplets take longer
        latency = int(round(math.exp(8.0 + 0.6 * (1 - abs(2 * p_j - 1)) + 0.35 * lat_rng.standard_normal())))
        trip_rows.append([phs[i].image_id, phs[j].image_id, phs[k].image_id, choice, ANNOTATOR, latency])
    _write_csv(out / "triplets.csv", ["anchor", "ref_j", "ref_k", "choice", "annotator", "latency_ms"], trip_rows)

    _write_csv(out / "truth" / "wounds.csv",
               ["image_id", "wound_index", *NUMERIC_ATTRIBUTES, "border", "size_cm", "width_cm", "duration_weeks",
                "anatomical_site", "area_px", "fibrin_px", "nodule", "nodule_px", "pain", "itch", "bleeding",
                "distractors", "distractor_px", *[f"z_{f}" for f in LATENT_FEATURES]], truth_wounds)
    _write_csv(out / "truth" / "images.csv",
               ["image_id", "patient_id", "n_wounds", *[f"z_{f}" for f in LATENT_FEATURES], "width", "height",
                "px_per_cm", "flash", "blur_sigma", "wb_red", "wb_blue", "background", "ruler", "light_azimuth"],
               truth_images)
    _write_csv(out / "truth" / "patients.csv", ["patient_id", "severity", "age", "sex", "fitzpatrick", "rdeb_subtype"],
               [[p["patient_id"], f"{p['severity']:.4f}", p["age"], p["sex"], p["fitzpatrick"], p["subtype"]]
                for p in pats])
    _write_csv(out / "truth" / "concepts.csv", ["image_id", "wound_index", *CONCEPTS], concept_rows)

    answered = np.array([c != "skip" for c in choices], bool)
    agree = None
    if answered.any():
        D = truth.distance_matrix()
        t = trip[answered]
        chose_j = np.array([c == "j" for c in choices])[answered]
        dj, dk = D[t[:, 0], t[:, 1]], D[t[:, 0], t[:, 2]]
        agree = float(np.mean(np.where(chose_j, dj < dk, dk < dj)))

    reader = DescriptionReader.fit([r[2] for r in wound_rows])
    text_latent = np.array([reader.photo_vector(t) for t in photo_texts])
    text_sigma, text_skip = calibrate_oracle(text_latent, seed=seed)
    ceilings = planted_ceilings(truth, text_latent, trip, choices)
    oracle = {
        "synthetic": True,
        "model": "P(skip) = min(skip_scale * exp(-(delta/sigma)^2 / 2), 0.5); P(j | answered) = Phi(delta / sigma); "
                 "delta = d(i,k) - d(i,j), Euclidean distance of the photos' latent vectors (truth/images.csv z_*)",
        "answer_stream": f"numpy default_rng([seed, {ANSWER_STREAM}]); per triplet in triplets.csv order: "
                         "one uniform for skip, one for the choice",
        "sigma": sigma, "skip_scale": skip_scale, "seed": seed,
        "target_agreement": TARGET_AGREEMENT, "target_skip": TARGET_SKIP,
        "expected_agreement": truth.expected_agreement(), "sample_agreement": agree,
        "sample_skip_rate": float(1 - answered.mean()) if len(choices) else None,
        "latent_features": list(LATENT_FEATURES), "latent_weights": list(LATENT_WEIGHTS),
        "feature_mean": mean.tolist(), "feature_std": std.tolist(),
        "concepts": list(CONCEPTS), "concept_thresholds": THRESHOLDS,
        "fibrin_masks": "truth/fibrin/<image_id>.png: wound index where planted fibrin is visible, 0 elsewhere",
        "planted_masks": "truth/planted/<image_id>.png: 1 = decisive nodule, 2 + i = distractor DISTRACTORS[i], "
                         "0 elsewhere",
        "distractors": list(DISTRACTORS), "visible_features": [f for f, v in zip(LATENT_FEATURES, visible_columns()) if v],
        "described_features": list(DESCRIBED_FEATURES),
        "text_oracle": {
            "model": "reads each wound's description (core.phantoms.descriptions.read_description), standardises "
                     "the stated values with mean/std (computed from the descriptions alone; unstated = mean), "
                     "weights them as the expert does, averages a photo's wounds; then the expert's noise model "
                     "with its own sigma/skip_scale calibrated to target_agreement on these text vectors",
            "mean": reader.mean.tolist(), "std": reader.std.tolist(), "sigma": text_sigma, "skip_scale": text_skip},
    }
    (out / "truth" / "oracle.json").write_text(json.dumps(oracle, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (out / "truth" / "ceilings.json").write_text(json.dumps(ceilings, indent=1, sort_keys=True) + "\n",
                                                 encoding="utf-8")
    (out / "dataset.json").write_text(json.dumps({
        "name": DATASET_NAME, "synthetic": True, "seed": seed, "generator": "core.phantoms",
        "counts": {"images": photos, "patients": patients, "wounds": wounds, "triplets": triplets},
    }, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return {"out": str(out), "synthetic": True, "seed": seed, "images": photos, "patients": patients,
            "wounds": wounds, "triplets": triplets, "skips": int((~answered).sum()),
            "truth_agreement": agree, "sigma": sigma,
            "ceilings": {k: ceilings[k]["balanced"] for k in ("vision", "text", "fusion", "expert")},
            "seconds": round(time.perf_counter() - t0, 2)}


def planted_ceilings(truth: PhantomTruth, text_latent: np.ndarray, triplets: np.ndarray,
                     choices: list[str]) -> dict[str, Any]:
    """The best agreement reachable from what each modality carries, in the tables' metric.

    vision: the exact visible part of the expert's latent (described-only features zeroed);
    text: the photos' descriptions as the text oracle reads them; fusion: the exact visible part
    plus the described-only part as read from the descriptions; expert: the whole latent (the
    expert's own noise ceiling). ``balanced``: balanced agreement with the expert's triplets
    (triplets.csv, skips dropped); ``expected``: expected agreement over all triplets and the
    expert's noise (micro)."""
    visible = visible_columns()
    fused = np.where(visible, truth.latent, text_latent)
    latents = {"vision": truth.latent * visible, "text": text_latent, "fusion": fused, "expert": truth.latent}
    out: dict[str, Any] = {
        "synthetic": True,
        "metric": "balanced: balanced (anchor) agreement with the expert's triplets in triplets.csv, skips dropped "
                  "(the tables' metric); expected: expected agreement over all triplets and the expert's noise",
        "definitions": {
            "vision": "exact visible features of the expert's latent, described-only features left out",
            "text": "the photos' descriptions as the phantom text oracle reads them (descriptions only)",
            "fusion": "exact visible features + described-only features as read from the descriptions",
            "expert": "the expert's whole latent (its own noise ceiling)"},
    }
    for name, z in latents.items():
        D = distances(z)
        out[name] = {"balanced": balanced_agreement(D, triplets, choices),
                     "expected": truth.expected_agreement(D=D)}
    return out


# --------------------------------------------------------------------------- montage


def montage(dataset_dir: str | Path, n: int = 12, cols: int = 4, tile: tuple[int, int] = (320, 240),
            outlines: bool = True) -> Image.Image:
    """Grid of ``n`` phantoms spread evenly over the dataset (thin wound outlines optional),
    captioned SYNTHETIC."""
    root = Path(dataset_dir)
    every = sorted((root / "images").glob("*.png"))
    if not every:
        raise FileNotFoundError(f"no images in {root / 'images'}")
    paths = [every[int(i)] for i in np.unique(np.linspace(0, len(every) - 1, min(n, len(every))).round())]
    rows = math.ceil(len(paths) / cols)
    tw, th = tile
    pad, top = 6, 44
    from scipy import ndimage  # here, not at import: --help stays fast

    sheet = Image.new("RGB", (cols * (tw + pad) + pad, top + rows * (th + pad) + pad), (250, 250, 250))
    draw = ImageDraw.Draw(sheet)
    draw.text((pad + 2, 10), "SYNTHETIC wound phantoms - procedurally rendered RDEB-like wounds "
              "(TriDerm Studio demo data, not patients)", fill=(150, 20, 20), font=font(17))
    for idx, path in enumerate(paths):
        img = Image.open(path).convert("RGB")
        if outlines and (root / "masks" / path.name).is_file():
            lab = np.asarray(Image.open(root / "masks" / path.name))
            edge = (lab > 0) & (ndimage.grey_erosion(lab, size=3) != lab)
            arr = np.asarray(img).copy()
            arr[edge] = (arr[edge] * 0.45 + np.array([0, 230, 255]) * 0.55).astype(np.uint8)
            img = Image.fromarray(arr)
        img.thumbnail((tw, th), Image.Resampling.LANCZOS)
        x = pad + (idx % cols) * (tw + pad) + (tw - img.width) // 2
        y = top + (idx // cols) * (th + pad) + (th - img.height) // 2
        sheet.paste(img, (x, y))
        label = f"{path.stem}  SYNTHETIC"
        draw.rectangle((x, y, x + 8 * len(label) + 6, y + 16), fill=(0, 0, 0))
        draw.text((x + 3, y + 1), label, fill=(255, 255, 255), font=font(12))
    return sheet

