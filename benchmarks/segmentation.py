"""Wound segmentation: in-source folds and cross-source transfer of the segmenter's networks, from ImageNet.

    python -m benchmarks.segmentation [--fuseg ../shared/data/fuseg-dev] [--medetec ../shared/data/medetec]
                                      [--folds 2] [--fold-seeds 3] [--epochs 24] [--source-epochs 12] [--seed 0]
                                      [--part all|ablation|timing] [--section segmentation]

Every network is :mod:`core.segmentation`'s (EfficientNet-Lite0 with its stride-32 stages fine-tuned + FPN
decoder, trained on the 4 flips, scored with the product's test-time flips,
:data:`~core.segmentation.model.TEST_FLIPS`). Rows:

- **fuseg-dev k-fold by photo** (``--folds``; a file-name series stays in one fold), each fold's
  network trained from ImageNet on the other folds, ``--epochs`` epochs; the same
  predictions with 1, 2 and 4 test-time flips say what the flips add; the folds are trained again
  with ``--fold-seeds`` sets of seeds (the decoder's initial weights and the batch order), whose spread
  says how much of a difference between recipes the seed alone makes;
- **trained on Medetec → fuseg-dev**: from ImageNet on all Medetec photos (``--source-epochs``);
- red-channel Otsu (no training) on each set, for reference.
- ``--part ablation`` (its own section, ``segmentation_ablation``): what three steps add — the fuseg-dev
  fold networks (same folds and seeds) trained with the encoder frozen and at 256-px input (steps the
  recipe has), and with a strong random view per photo (a step it dropped), against the recipe, on
  held-out fuseg-dev photos and zero-shot on Medetec, paired over photo groups.
- ``--part timing`` (``segmentation_timing``): the shipped default's CPU inference of a 512-px photo.

The shipped default itself, nested on photos its networks never saw (fuseg-dev folds, Medetec zero-shot, a
clinic's 15-photo fine-tune, click-to-outline), is :mod:`benchmarks.segmentation_default`: since issue 48 the
default trains on Medetec too, so no Medetec figure of the shipped file is zero-shot, and this benchmark no longer
scores it.

Predictions are thresholded at 0.5, components below the minimum wound area (25 px) dropped, and
scored at the photo's resolution: Dice, IoU and boundary F (DAVIS tolerance) per photo, Dice per
wound, the share of wounds whose suggestion needs no edit (Dice ≥ 0.9); 95 % intervals are
percentile bootstraps that resample photo groups (patients/series where known), not photos.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

import cv2
import numpy as np
import torch
from PIL import Image
from scipy import ndimage
from tqdm.auto import tqdm

from annotations.infra.workspace import DEFAULT_MIN_WOUND_AREA
from annotations.io.readers import mask_to_labels
from benchmarks.results import RESULTS_DIR, command_line, render_tables, write_result
from core import cli
from core.eval.protocol import paired_claim
from core.eval.stats import mean_sd_ci, multiple_tests_note
from core.runtime import torch_threads
from core.segmentation.interactive import click_outline, wound_components
from core.segmentation.metrics import dice, photo_scores
from core.segmentation.model import (
    INPUT_SIZE,
    TEST_FLIPS,
    TEST_SCALES,
    THRESHOLD,
    TTA_FLIPS,
    Encoder,
    Segmenter,
    encoder,
    inference_sizes,
    load_default,
    new_net,
)
from core.segmentation.training import (
    AUGMENTED_VIEWS,
    ENCODER_LR_FACTOR,
    PRETRAIN_EPOCHS,
    FeatureCache,
    Sample,
    cache_features,
    cached_probability,
    fit_network,
    folder_samples,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TIMING_SIDE = 512
BOOTSTRAP = 2000


def group_folds(samples: list[Sample], k: int, seed: int) -> list[list[int]]:
    """``k`` test folds of sample indices; whole groups, largest first, each to the currently smallest fold."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.group, []).append(i)
    order = np.random.default_rng(seed).permutation(len(groups))
    names = sorted(groups)
    ranked = sorted((names[j] for j in order), key=lambda g: -len(groups[g]))
    folds: list[list[int]] = [[] for _ in range(k)]
    for g in ranked:
        min(folds, key=len).extend(groups[g])
    return [sorted(f) for f in folds]


def fold_seed(seed: int, seed_set: int, fold: int, folds: int) -> int:
    """The seed of fold ``fold``'s network in seed set ``seed_set``: ``seed + fold`` in the first set, and no two
    networks alike."""
    return seed + seed_set * folds + fold


def predict_mask(prob: np.ndarray, min_area: int = DEFAULT_MIN_WOUND_AREA) -> np.ndarray:
    """Thresholded probability with components below ``min_area`` dropped (what suggestions show)."""
    out = np.zeros(prob.shape, bool)
    for comp in wound_components(prob, min_area):
        out |= comp
    return out


def otsu_red(image: Image.Image) -> np.ndarray:
    """Otsu on the red channel; the minority side is the wound (as a 0/1 probability map)."""
    red = np.ascontiguousarray(np.asarray(image.convert("RGB"))[..., 0])
    _, above = cv2.threshold(red, 0, 1, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    above = above.astype(bool)
    return (above if above.mean() <= 0.5 else ~above).astype(np.float32)


class FixedMap:
    """A fold's precomputed probability map standing in for the segmenter in :func:`click_outline`."""

    def __init__(self, prob: np.ndarray, threshold: float = THRESHOLD) -> None:
        self.prob = prob
        self.threshold = threshold

    def probability(self, image: Image.Image) -> np.ndarray:
        """The precomputed map, whatever the image."""
        return self.prob


def deepest_points(mask: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """(x, y, wound) for each wound of a mask: the pixel farthest from the wound's boundary."""
    labels = mask_to_labels(mask.astype(np.uint8))
    out = []
    for k in range(1, int(labels.max()) + 1):
        wound = labels == k
        if wound.any():
            depth = ndimage.distance_transform_edt(np.pad(wound, 1))[1:-1, 1:-1]
            y, x = np.unravel_index(int(np.argmax(depth)), depth.shape)
            out.append((int(x), int(y), wound))
    return out


def click_scores(samples: list[Sample], probs: dict[int, np.ndarray], threshold: float = THRESHOLD) -> list[dict]:
    """Per-wound Dice and seconds of one click at each test wound, by GrabCut alone and by the segmenter (its map
    thresholded at ``threshold``)."""
    rows = []
    for i, prob in probs.items():
        for x, y, wound in deepest_points(samples[i].mask):
            for method, model in (("grabcut", None), ("segmenter", FixedMap(prob, threshold))):
                t0 = time.perf_counter()
                out = click_outline(samples[i].image, x, y, model)
                rows.append({"method": method, "group": samples[i].group, "dice": dice(out, wound),
                             "seconds": time.perf_counter() - t0})
    return rows


def inference_seconds(seg: Segmenter, threads: int, repeats: int = 5) -> float:
    """Median wall seconds of :meth:`Segmenter.probability` on a new 512-px photo each call (one warm-up)."""
    rng = np.random.default_rng(0)
    times = []
    with torch_threads(threads):
        for _ in range(repeats + 1):
            photo = Image.fromarray(rng.integers(0, 256, (TIMING_SIDE, TIMING_SIDE, 3), dtype=np.uint8))
            t0 = time.perf_counter()
            seg.probability(photo)
            times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def grouped_bootstrap(values: list[float], groups: list[str], seed: int = 0) -> dict[str, Any] | None:
    """``{"mean", "sd", "ci", "n"}``: mean and sd of ``values``, and a 95 % percentile interval of the mean from
    :data:`BOOTSTRAP` resamples of whole groups (photos of one patient/series move together)."""
    if not values:
        return None
    v = np.asarray(values, np.float64)
    names = sorted(set(groups))
    index = {g: i for i, g in enumerate(names)}
    g = np.array([index[x] for x in groups])
    sums, counts = np.bincount(g, v, len(names)), np.bincount(g, minlength=len(names)).astype(np.float64)
    draws = np.random.default_rng(seed).integers(0, len(names), (BOOTSTRAP, len(names)))
    means = sums[draws].sum(1) / counts[draws].sum(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if len(v) > 1 else None,
            "ci": [float(lo), float(hi)], "n": len(v)}


def evaluate(net: torch.nn.Module, cache: FeatureCache, samples: list[Sample], test: list[int],
             tta: int = TEST_FLIPS, device: str = "cpu") -> list[dict]:
    """Scores of ``net`` on the ``test`` samples from their cached flip views."""
    with torch_threads(1):
        probs = {i: cached_probability(net, cache, i, samples[i].mask.shape, device, tta=tta) for i in test}
    return score(probs, samples)


def score(probs: dict[int, np.ndarray], samples: list[Sample]) -> list[dict]:
    """Per-photo segmentation scores of the thresholded ``probs`` against the samples' masks."""
    rows = []
    for i, prob in probs.items():
        s = photo_scores(predict_mask(prob), mask_to_labels(samples[i].mask.astype(np.uint8)))
        rows.append({"photo": samples[i].key, "group": samples[i].group, **s})
    return rows


def train(cache: FeatureCache, subset: list[int], start: torch.nn.Module, epochs: int, seed: int,
          device: str = "cpu", encoder_lr_factor: float = ENCODER_LR_FACTOR) -> torch.nn.Module:
    """Fine-tune ``start`` on the cached features of ``subset`` (one thread, no progress bar)."""
    with torch_threads(1):
        net, _ = fit_network(cache, subset, start, epochs, seed=seed, device=device, progress=False,
                             encoder_lr_factor=encoder_lr_factor)
    return net


def summary(rows: list[dict], seed: int) -> list[Any]:
    """Table cells of a set of scored photos: Dice/photo [grouped CI], median, IoU, boundary F, Dice/wound,
    no-edit wounds % [grouped CI]."""
    groups = [r["group"] for r in rows]
    wounds = [(w, r["group"]) for r in rows for w in r["wounds"]]
    no_edit = grouped_bootstrap([100.0 * w["no_edit"] for w, _ in wounds], [g for _, g in wounds], seed)
    return [grouped_bootstrap([r["dice"] for r in rows], groups, seed), float(np.median([r["dice"] for r in rows])),
            grouped_bootstrap([r["iou"] for r in rows], groups, seed),
            grouped_bootstrap([r["boundary_f"] for r in rows], groups, seed),
            grouped_bootstrap([w["dice"] for w, _ in wounds], [g for _, g in wounds], seed), no_edit]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The fuseg-dev k-fold (with the test-time flip ablation), Medetec → fuseg-dev and Otsu on both sets: the
    features cached, the networks trained and scored; returns the records."""
    medetec = folder_samples(args.medetec)
    enc = encoder(args.device)
    with torch_threads(1):
        cache_m = cache_features(medetec, enc, seed=args.seed, progress=not args.quiet)
    fuseg = folder_samples(args.fuseg)
    with torch_threads(1):
        cache_f = cache_features(fuseg, enc, seed=args.seed, progress=not args.quiet)
    out: dict[str, Any] = {"n": {"medetec": len(medetec)}, "n_fuseg": len(fuseg)}
    folds = group_folds(fuseg, args.folds, args.seed)
    out["folds"] = [len(f) for f in folds]
    kfold: dict[int, list[dict]] = {1: [], 2: [], 4: []}  # the first seed set, by test-time flips
    by_seed: list[list[dict]] = [[] for _ in range(args.fold_seeds)]  # the product's flips, by seed set
    runs = [(s, f) for s in range(args.fold_seeds) for f in range(len(folds))]
    for s, f in tqdm(runs, desc="fuseg-dev folds × seeds", unit="network", disable=args.quiet):
        seed, held = fold_seed(args.seed, s, f, args.folds), set(folds[f])
        rest = [i for i in range(len(fuseg)) if i not in held]
        net = train(cache_f, rest, new_net(enc, seed=seed), args.epochs, seed, args.device)
        for tta in kfold if s == 0 else (TEST_FLIPS,):
            rows = evaluate(net, cache_f, fuseg, folds[f], tta, args.device)
            if s == 0:
                kfold[tta] += rows
            if tta == TEST_FLIPS:
                by_seed[s] += rows
    out["kfold"], out["kfold_seeds"] = kfold, by_seed
    out["otsu_fuseg"] = score({i: otsu_red(s.image) for i, s in enumerate(fuseg)}, fuseg)
    out["otsu_medetec"] = score({i: otsu_red(s.image) for i, s in enumerate(medetec)}, medetec)
    net = train(cache_m, list(range(len(medetec))), new_net(enc, seed=args.seed), args.source_epochs, args.seed,
                args.device)
    out["medetec_to_fuseg"] = evaluate(net, cache_f, fuseg, list(range(len(fuseg))), device=args.device)
    return out


class Variant(NamedTuple):
    """An ablation's network: strong random views cached per photo, the encoder's rate factor, the step it
    differs from the recipe by (``in_recipe``: the recipe has the step and the variant lacks it) and the
    input size."""

    views: int
    encoder_lr_factor: float
    step: str = ""
    in_recipe: bool = True
    size: int = INPUT_SIZE


#: the ablation's variants, the recipe first
ABLATION = {f"the recipe ({INPUT_SIZE} px, encoder stages 5–6 tuned, 4 flips)": Variant(AUGMENTED_VIEWS,
                                                                                        ENCODER_LR_FACTOR),
            "encoder frozen (decoder only)": Variant(AUGMENTED_VIEWS, 0.0, "tuning encoder stages 5–6"),
            "+ 1 strong random view per photo": Variant(AUGMENTED_VIEWS + 1, ENCODER_LR_FACTOR,
                                                        "a strong random view per photo", in_recipe=False),
            "256-px input": Variant(AUGMENTED_VIEWS, ENCODER_LR_FACTOR, f"{INPUT_SIZE}-px input (not 256)", size=256)}
#: test-time flips the ablation scores every variant with (all four; fixed when the product's went to 2)
ABLATION_FLIPS = len(TTA_FLIPS)
#: the ablation's test sets: key → what is scored
ABLATION_TARGETS = {"fuseg": "held-out fuseg-dev photos", "medetec": "Medetec photos (another source, zero-shot)"}


def ablation(args: argparse.Namespace) -> dict[str, Any]:
    """What three steps add: the fuseg-dev fold networks of :func:`sources` (same folds and seeds,
    ``--fold-seeds`` sets) trained as the recipe, with the encoder frozen, with a strong random view per photo
    and at 256 px; each scored on its held-out fuseg-dev fold and on every Medetec photo (another source,
    zero-shot)."""
    fuseg, medetec = folder_samples(args.fuseg), folder_samples(args.medetec)
    enc = encoder(args.device)
    caches: dict[tuple[int, int], FeatureCache] = {}
    medetec_caches: dict[int, FeatureCache] = {}
    with torch_threads(1):
        for views, size in sorted({(v.views, v.size) for v in ABLATION.values()}):
            caches[views, size] = cache_features(fuseg, enc, size, augmented=views, seed=args.seed,
                                                 progress=not args.quiet)
        for size in sorted({v.size for v in ABLATION.values()}):  # scored on its flips only
            medetec_caches[size] = cache_features(medetec, enc, size, augmented=0, progress=not args.quiet)
    folds = group_folds(fuseg, args.folds, args.seed)
    out: dict[str, dict[str, list[list[dict]]]] = {
        target: {name: [[] for _ in range(args.fold_seeds)] for name in ABLATION} for target in ABLATION_TARGETS}
    runs = [(name, s, f) for name in ABLATION for s in range(args.fold_seeds) for f in range(len(folds))]
    for name, s, f in tqdm(runs, desc="ablation networks", unit="network", disable=args.quiet):
        v = ABLATION[name]
        seed, held = fold_seed(args.seed, s, f, args.folds), set(folds[f])
        rest = [i for i in range(len(fuseg)) if i not in held]
        cache = caches[v.views, v.size]
        net = train(cache, rest, new_net(enc, seed=seed), args.epochs, seed, args.device, v.encoder_lr_factor)
        out["fuseg"][name][s] += evaluate(net, cache, fuseg, folds[f], ABLATION_FLIPS, args.device)
        out["medetec"][name][s] += evaluate(net, medetec_caches[v.size], medetec, list(range(len(medetec))),
                                            ABLATION_FLIPS, args.device)
    return {"ablation": out, "n_fuseg": len(fuseg), "n_medetec": len(medetec), "folds": [len(f) for f in folds]}


def ablation_report(args: argparse.Namespace, out: dict[str, Any]) -> tuple[list[dict], list[dict], list[str]]:
    """The ablation's tables (per test set, each variant's Dice over its seed sets), its claims (each variant's
    step adds Dice: one-sided paired t-test over photo groups, each group's Dice averaged over its photos,
    fold networks and seed sets) and notes."""
    seed, recipe = args.seed, next(iter(ABLATION))
    tables, claims = [], []
    for target, what in ABLATION_TARGETS.items():
        records = out["ablation"][target]

        def by_group(name: str) -> dict[str, float]:
            acc: dict[str, list[float]] = {}
            for r in (r for rows in records[name] for r in rows):
                acc.setdefault(r["group"], []).append(r["dice"])
            return {g: float(np.mean(v)) for g, v in acc.items()}

        rows = []
        for name, sets in records.items():
            means = [float(np.mean([r["dice"] for r in rows_])) for rows_ in sets]
            rows.append([name, len(sets[0]), *summary([r for rows_ in sets for r in rows_], seed)[:2],
                         mean_sd_ci(means), ", ".join(f"{m:.3f}" for m in means)])
            if name != recipe:
                step = ABLATION[name]
                with_, without = ((by_group(recipe), by_group(name)) if step.in_recipe
                                  else (by_group(name), by_group(recipe)))
                groups = sorted(with_)
                claims.append(paired_claim(f"{step.step} adds Dice on {what} (Dice/photo)",
                                           [with_[g] for g in groups], [without[g] for g in groups]))
        tables.append({"caption": f"What each recipe step adds, scored on {what}: the fuseg-dev {args.folds}-fold "
                                  f"networks, {args.fold_seeds} seed sets per variant (the same folds and seeds), "
                                  f"{args.epochs} epochs, {ABLATION_FLIPS} flips",
                       "columns": ["variant", "scores per seed set", "Dice/photo pooled over seed sets [grouped 95 % CI]",
                                   "median Dice/photo", "mean of the seed sets' means (sd, 95 % t interval)",
                                   "seed sets' means"], "rows": rows})
    notes = [f"Claims: one-sided paired t-test over photo groups, each group's Dice averaged over its photos, the "
             f"fold networks and the {args.fold_seeds} seed sets; on Medetec every photo is scored by both fold "
             f"networks of a seed set. {multiple_tests_note(claims)}",
             "Not ablated here: the test-time flips (the main section's flips table). Each network is scored at "
             "its own input size on both sets."]
    return tables, claims, notes


def inference_grid(default: Segmenter, enc: Encoder) -> dict[tuple[int, str, int], float]:
    """Seconds of ``default`` on a new photo for 1 and 2 torch threads × the training size alone and the product's
    test-time sizes (:data:`~core.segmentation.model.TEST_SCALES`) × 2 and 4 test-time flips (CPU)."""
    out = {}
    for scales in dict.fromkeys([(1.0,), tuple(TEST_SCALES)]):
        sizes = "+".join(map(str, inference_sizes(default.input_size, scales)))
        for t in (1, 2):
            for k in (2, 4):
                seg = Segmenter(default.net, enc, default.input_size, tta=k, scales=scales)
                out[t, sizes, k] = inference_seconds(seg, t)
    return out


def timing(args: argparse.Namespace) -> dict[str, Any]:
    """``--part timing``: the default's CPU inference grid alone, with the machine's load average before it."""
    load = os.getloadavg()[0]
    return {"timing": inference_grid(load_default("cpu"), encoder("cpu")), "load": load}


def timing_table(out: dict[str, Any]) -> dict[str, Any]:
    """The CPU inference table of a run's ``timing`` records."""
    return {"caption": f"CPU inference, one {TIMING_SIDE}-px photo (Segmenter.probability, median of 5)",
            "columns": ["torch threads", "test-time sizes (px)", "test-time flips", "seconds"],
            "rows": [[*key, sec] for key, sec in out["timing"].items()]}


def timing_report(args: argparse.Namespace, out: dict[str, Any]) -> tuple[list[dict], list[dict], list[str]]:
    """The result of ``--part timing``: its table and the load it ran under."""
    return [timing_table(out)], [], [f"Load average (1 min) just before timing: {out['load']:.2f} on "
                                     f"{os.cpu_count()} cores; nothing else of this benchmark ran beside it."]


def report(args: argparse.Namespace, out: dict[str, Any]) -> tuple[list[dict], list[dict], list[str]]:
    """The result tables, claims and notes from the records of :func:`run`."""
    n_f, n_m, seed = out.get("n_fuseg"), out["n"]["medetec"], args.seed
    columns = ["trained on → tested on", "photos", "Dice/photo [grouped 95 % CI]", "median Dice/photo", "IoU/photo",
               "boundary F", "Dice/wound", "no-edit wounds % (Dice ≥ 0.9)"]
    main_rows = []
    if "kfold" in out:
        main_rows += [
            [f"fuseg-dev {args.folds}-fold by photo (other folds, from ImageNet) → held-out fuseg-dev", n_f,
             *summary(out["kfold"][TEST_FLIPS], seed)],
            [f"Medetec, all {n_m} (from ImageNet) → fuseg-dev", n_f, *summary(out["medetec_to_fuseg"], seed)]]
    if "kfold" in out:
        main_rows += [["red-channel Otsu (no training) → fuseg-dev", n_f, *summary(out["otsu_fuseg"], seed)],
                      ["red-channel Otsu (no training) → Medetec", n_m, *summary(out["otsu_medetec"], seed)]]
    tables = [{"caption": "In-source folds and cross-source transfer (the product's recipe; 0.5 threshold)",
               "columns": columns, "rows": main_rows}]
    claims: list[dict] = []
    notes = [
        (f"Recipe: input {INPUT_SIZE} px; EfficientNet-Lite0 stem and stages 0–4 frozen (their "
         f"features cached), stages 5–6 (stride 32) fine-tuned at {ENCODER_LR_FACTOR}× the decoder's AdamW rate "
         f"1e-3 (cosine), FPN decoder; views: the 4 flips, {AUGMENTED_VIEWS} strong random view(s) per photo "
         f"(the ablation's variant: rotation ±45°, scale ×0.5–2, aspect, colour/hue/gamma jitter, blur); BCE + soft Dice; "
         f"{args.epochs} epochs in-source (the default: {PRETRAIN_EPOCHS}), {args.source_epochs} from Medetec's "
         f"{n_m} photos. {TEST_FLIPS}-flip test-time augmentation.")]
    if "kfold" in out:
        tables.append({"caption": f"Test-time flips on the fuseg-dev {args.folds}-fold predictions (same networks)",
                       "columns": ["flips averaged", "photos", "Dice/photo [grouped 95 % CI]", "median Dice/photo"],
                       "rows": [[f"{k} ({', '.join(TTA_FLIPS[:k])})", len(v), *summary(v, seed)[:2]]
                                for k, v in out["kfold"].items()]})
        seed_rows = []
        for s, rows in enumerate(out["kfold_seeds"]):
            seeds = ", ".join(str(fold_seed(seed, s, f, args.folds)) for f in range(args.folds))
            seed_rows.append([f"{seeds}{' (the rows above)' if s == 0 else ''}", len(rows), *summary(rows, seed)[:2]])
        means = [float(np.mean([r["dice"] for r in rows])) for rows in out["kfold_seeds"]]
        seed_rows.append([f"mean of the {len(means)} seed sets' means (sd, 95 % t interval)", n_f, mean_sd_ci(means),
                          None])
        tables.append({"caption": f"Training seeds of the fuseg-dev {args.folds}-fold networks (each fold's network "
                                  f"seeded as listed: decoder's initial weights and batch order; same folds, {TEST_FLIPS} flips)",
                       "columns": ["seeds of the fold networks", "photos", "Dice/photo [grouped 95 % CI]",
                                   "median Dice/photo"], "rows": seed_rows})
        notes.append(f"fuseg-dev folds: {', '.join(map(str, out['folds']))} test photos. The first table's k-fold row "
                     "and the flips table are the first seed set's networks.")
    notes.append(f"Intervals: {BOOTSTRAP} bootstrap resamples of photo groups.")
    return tables, claims, notes


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.segmentation`` benchmark; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.segmentation", description=__doc__.splitlines()[0])
    p.add_argument("--fuseg", type=Path, default=SHARED / "fuseg-dev", help="fuseg-dev folder (images/, masks/)")
    p.add_argument("--medetec", type=Path, default=SHARED / "medetec", help="Medetec folder (images/, masks/)")
    p.add_argument("--folds", type=int, default=2, help="fuseg-dev folds (default: 2)")
    p.add_argument("--fold-seeds", type=int, default=3,
                   help="seed sets the fuseg-dev folds are trained with (default: 3; the first gives the main rows)")
    cli.add_epochs(p, PRETRAIN_EPOCHS, help=f"epochs of the fuseg-dev fold networks (default: {PRETRAIN_EPOCHS})")
    p.add_argument("--source-epochs", type=int, default=12, help="epochs of the Medetec → fuseg-dev network")
    cli.add_seed(p)
    cli.add_device(p)
    p.add_argument("--part", choices=("all", "ablation", "timing"), default="all",
                   help="all (fuseg-dev folds, Medetec → fuseg-dev, Otsu); ablation (what encoder tuning and the "
                        "strong views add on the fuseg-dev folds); timing (the shipped default's CPU inference alone, "
                        "for a quiet machine)")
    p.add_argument("--section", default="segmentation")
    p.add_argument("--results", type=Path, default=RESULTS_DIR)
    p.add_argument("--quiet", action="store_true")
    args = cli.parse_args(p, argv)
    missing = [d for d in (args.fuseg, args.medetec) if not (d / "images").is_dir() and args.part != "timing"]
    if missing:
        p.error(f"{missing[0]}: no images/ folder")
    if args.folds < 2 or args.fold_seeds < 1:
        p.error(f"need --folds ≥ 2 and --fold-seeds ≥ 1 (got {args.folds} and {args.fold_seeds})")
    t0 = time.perf_counter()
    job, make_report = {"ablation": (ablation, ablation_report), "timing": (timing, timing_report)}.get(
        args.part, (run, report))
    out = job(args)
    tables, claims, notes = make_report(args, out)
    print(render_tables(tables))
    print("\n".join(notes))
    title = {"ablation": "Wound segmentation: what each recipe step adds",
             "timing": "Wound segmentation: CPU inference of the default"}.get(
        args.part, "Wound segmentation: in-source folds and cross-source transfer")
    path = write_result(args.section, title,
                        command_line("benchmarks.segmentation", argv), [args.seed], tables, claims, notes,
                        synthetic=False, seconds=time.perf_counter() - t0, results_dir=args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
