"""Why the default segmenter over-segments (issue 48): each suspected cause measured per photo.

    python -m benchmarks.segmentation_diagnosis --part ceiling|features|default|train|report
        [--fuseg ../shared/data/fuseg-dev] [--medetec ../shared/data/medetec] [--work /tmp/seg-diagnosis]
        [--epochs 6] [--dice-weight 1.0] [--head-prior P] [--folds 2] [--fold F] [--seed 0]

Parts (each cheap on its own; ``features`` is the slow one, run once; the others reuse its cache):

- ``ceiling``: no network. Each expert mask is reduced to the training target (the wound fraction of every
  stride-4 cell, :func:`core.segmentation.training._target`) and brought back as inference does (the cell values
  as logits, :func:`core.segmentation.model.probability_map`: bilinear, sigmoid) or as probabilities (bilinear),
  then thresholded like a suggestion (:func:`benchmarks.segmentation.predict_mask`): what the output
  representation alone costs in Dice and area.
- ``features``: the frozen encoder's features of every photo's four flips (:func:`cache_features`, the product's
  own), saved under ``--work`` for the other parts.
- ``default``: the shipped default's logits on each photo's four flips: Medetec (never trained on, zero-shot)
  and fuseg-dev (its own training photos: in-sample).
- ``train``: the fuseg-dev ``--folds``-fold networks of the product's recipe (:func:`fit_network`, the folds
  and seeds of ``benchmarks.segmentation``'s first seed set) for ``--epochs`` epochs with the soft-Dice term
  weighted ``--dice-weight`` (1: the recipe; 0: cross-entropy alone), optionally with the head's bias started at a
  wound prior (``--head-prior``): the held-out photos' logits and each network's training loss per epoch.
- ``report``: every saved set of logits scored per photo at thresholds 0.3–0.9, with 1, 2 and 4 test-time
  flips, upsampling logits (the product) or probabilities: Dice, IoU and predicted/expert area; calibration of
  the stride-4 probabilities against the cell fractions: ``--work``/NAME.md (tables) and NAME.json (every
  photo's Dice, IoU and area ratio; ``--name``, default ``report``). The figures go into results/segmentation_search.md by hand: a diagnosis,
  not a result section of docs/RESULTS.md.

Scores are per photo at the photo's resolution (components under the minimum wound area dropped, holes
filled, as suggestions are). Choosing a threshold on these photos would be tuning on reported photos: the
threshold sweep is diagnosis only.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from annotations.infra.fileio import atomic_write
from benchmarks.results import command_line, render_tables
from benchmarks.segmentation import SHARED, fold_seed, group_folds, predict_mask
from core import cli
from core.runtime import torch_threads
from core.segmentation.defaults import PRETRAIN_EPOCHS, THRESHOLD
from core.segmentation.metrics import dice, iou
from core.segmentation.model import INPUT_SIZE, TTA_FLIPS, encoder, flip, load_default, new_net
from core.segmentation.training import FeatureCache, Sample, _target, cache_features, fit_network, folder_samples

THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
FLIPS = (1, 2, 4)
UPSAMPLING = ("logits", "probabilities")
#: clamp of the ceiling's cell fractions before they become logits (a fraction of 0 or 1 is an infinite logit)
CEILING_EPS = 1e-3
#: calibration bins of the stride-4 probabilities
BINS = np.linspace(0.0, 1.0, 11)
SETS = ("fuseg", "medetec")


def upsample(logits: torch.Tensor, shape: tuple[int, int], views: tuple[str, ...], mode: str) -> np.ndarray:
    """Probability map at ``shape`` from the views' logits (V×1×h×w, view ``k`` flipped by ``views[k]``): the
    mean logit flipped back, bilinearly upsampled as logits then squashed (the product,
    :func:`~core.segmentation.model.probability_map`) or squashed then upsampled as probabilities."""
    mean = torch.stack([flip(logits[k:k + 1], v) for k, v in enumerate(views)]).mean(0).float()
    if mode == "logits":
        up = torch.sigmoid(F.interpolate(mean, size=shape, mode="bilinear", align_corners=False))
    else:
        up = F.interpolate(torch.sigmoid(mean), size=shape, mode="bilinear", align_corners=False)
    return up[0, 0].numpy()


#: distances (px) from the expert's wound within which the extra predicted pixels are counted
HALO = (4, 8, 16)


def photo_row(pred: np.ndarray, truth: np.ndarray, dist: np.ndarray | None = None) -> dict[str, float]:
    """Dice, IoU and predicted/expert area of one photo; with ``dist`` (each pixel's distance to the expert's
    wound), the share of the false-positive pixels lying within each :data:`HALO` distance of it."""
    row = {"dice": dice(pred, truth), "iou": iou(pred, truth), "ratio": float(pred.sum() / max(1, truth.sum()))}
    if dist is not None:
        fp = dist[pred & ~truth]
        row.update({f"fp_within{h}": float((fp <= h).mean()) if fp.size else None for h in HALO})
    return row


def summarise(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Per-photo summary: Dice median/mean, IoU mean, area ratio median [IQR], shares within ±10/±20 % and > 1.5×."""
    d = np.array([r["dice"] for r in rows])
    r = np.array([r["ratio"] for r in rows])
    q1, med, q3 = np.percentile(r, [25, 50, 75])
    return {"n": len(rows), "dice_median": float(np.median(d)), "dice_mean": float(d.mean()),
            "iou_mean": float(np.mean([x["iou"] for x in rows])), "ratio_median": float(med),
            "ratio_iqr": [float(q1), float(q3)], "within10": float(np.mean(np.abs(r - 1) <= 0.1)),
            "within20": float(np.mean(np.abs(r - 1) <= 0.2)), "over15": float(np.mean(r > 1.5)),
            "under_08": float(np.mean(r < 0.8))}


def samples_of(args: argparse.Namespace, name: str) -> list[Sample]:
    """The photos (with at least one wound) of set ``name``."""
    return folder_samples(args.fuseg if name == "fuseg" else args.medetec)


# --- ceiling ---------------------------------------------------------------------------------------------------

def ceiling(args: argparse.Namespace) -> dict[str, Any]:
    """The expert masks through the stride-4 cell-fraction target and back (no network)."""
    grid = (INPUT_SIZE // 4, INPUT_SIZE // 4)
    out: dict[str, Any] = {}
    for name in SETS:
        rows: dict[str, list[dict[str, float]]] = {m: [] for m in UPSAMPLING}
        for s in samples_of(args, name):
            frac = _target(s.mask, grid).float()
            logit = torch.logit(frac, eps=CEILING_EPS)
            for mode in UPSAMPLING:
                prob = upsample(logit, s.mask.shape, ("identity",), mode)
                rows[mode].append({"photo": s.key, **photo_row(predict_mask(prob), s.mask)})
        out[name] = rows
    return out


# --- features, default, train ------------------------------------------------------------------------------------

def cache_path(args: argparse.Namespace, name: str) -> Path:
    """Where set ``name``'s feature cache lives."""
    return args.work / f"features-{name}.pt"


def save_cache(path: Path, cache: FeatureCache, samples: list[Sample]) -> None:
    """Write a feature cache with the keys of the photos it holds (atomically: a process reading it meanwhile, as
    parallel ``--part`` processes do, sees the old file or the new one)."""
    with atomic_write(path, "wb", suffix=".pt") as fh:
        torch.save({"levels": cache.levels, "targets": cache.targets, "views": cache.views, "size": cache.size,
                    "keys": [s.key for s in samples]}, fh)


def load_cache(path: Path, samples: list[Sample]) -> FeatureCache:
    """Read a feature cache written for exactly ``samples``."""
    d = torch.load(path)
    if d["keys"] != [s.key for s in samples]:
        raise ValueError(f"{path}: cached for other photos; rerun --part features")
    return FeatureCache(d["levels"], d["targets"], d["views"], d["size"])


def features(args: argparse.Namespace) -> dict[str, Any]:
    """Cache the frozen encoder's features of every photo's four flips (the recipe's views), once per set."""
    enc = encoder("cpu")
    args.work.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in SETS:
        samples = samples_of(args, name)
        t0 = time.perf_counter()
        cache = cache_features(samples, enc, INPUT_SIZE, augmented=0, seed=args.seed, progress=not args.quiet)
        save_cache(cache_path(args, name), cache, samples)
        out[name] = {"photos": len(samples), "seconds": time.perf_counter() - t0}
        print(f"{name}: {len(samples)} photos cached in {out[name]['seconds']:.0f} s", flush=True)
    return out


@torch.no_grad()
def view_logits(net: torch.nn.Module, cache: FeatureCache, sample: int) -> torch.Tensor:
    """The network's logits on a sample's four cached flip views (4×1×h×w, float16)."""
    rows = slice(cache.row(sample, 0), cache.row(sample, len(TTA_FLIPS)))
    return net.eval()([level[rows].float() for level in cache.levels]).half()


def save_logits(args: argparse.Namespace, tag: str, name: str, cache: FeatureCache, samples: list[Sample],
                logits: dict[int, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Logits of the scored photos of one set, with their identity-view cell targets, under ``--work``."""
    path = args.work / f"logits-{tag}-{name}.pt"
    torch.save({"meta": meta, "keys": [samples[i].key for i in logits], "index": list(logits),
                "logits": [logits[i] for i in logits],
                "targets": [cache.targets[cache.row(i, 0)] for i in logits]}, path)
    return path


def default(args: argparse.Namespace) -> dict[str, Any]:
    """The shipped default's logits on every photo of both sets (fuseg-dev is its training set: in-sample)."""
    net = load_default("cpu").net
    out = {}
    for name in SETS:
        samples = samples_of(args, name)
        cache = load_cache(cache_path(args, name), samples)
        logits = {i: view_logits(net, cache, i) for i in range(len(samples))}
        what = "in-sample (its training photos)" if name == "fuseg" else "zero-shot (never trained on)"
        out[name] = str(save_logits(args, "default", name, cache, samples, logits, {"model": "default", "set": what}))
    return out


def train(args: argparse.Namespace) -> dict[str, Any]:
    """The fuseg-dev fold networks of the recipe (``--epochs``, ``--dice-weight``): held-out logits and losses."""
    samples = samples_of(args, "fuseg")
    cache = load_cache(cache_path(args, "fuseg"), samples)
    enc = encoder("cpu")
    folds = group_folds(samples, args.folds, args.seed)
    logits: dict[int, torch.Tensor] = {}
    losses, seconds = [], []
    for f, test in enumerate(folds):
        if args.fold is not None and f != args.fold:
            continue
        seed, held = fold_seed(args.seed, 0, f, args.folds), set(test)
        rest = [i for i in range(len(samples)) if i not in held]
        start = new_net(enc, seed=seed)
        if args.head_prior is not None:  # the last convolution's bias at the wound prior (RetinaNet's init)
            start.decoder.head[-1].bias.data.fill_(float(np.log(args.head_prior / (1 - args.head_prior))))
        t0 = time.perf_counter()
        net, loss = fit_network(cache, rest, start, args.epochs, seed=seed, progress=not args.quiet,
                                dice_weight=args.dice_weight)
        seconds.append(time.perf_counter() - t0)
        losses.append(loss)
        print(f"fold {f}: {len(rest)} photos, {args.epochs} epochs in {seconds[-1]:.0f} s, loss "
              + " ".join(f"{x:.4f}" for x in loss), flush=True)
        logits.update({i: view_logits(net, cache, i) for i in test})
    tag = train_tag(args)
    which = f"{args.folds}-fold" if args.fold is None else f"fold {args.fold} of {args.folds}"
    prior = "" if args.head_prior is None else f", head bias at prior {args.head_prior:g}"
    meta = {"model": f"{which}, {args.epochs} epochs, dice weight {args.dice_weight:g}{prior}",
            "set": "held-out fuseg-dev", "losses": losses, "seconds": seconds, "epochs": args.epochs,
            "dice_weight": args.dice_weight}
    return {"logits": str(save_logits(args, tag, "fuseg", cache, samples, logits, meta)), "losses": losses}


def train_tag(args: argparse.Namespace) -> str:
    """The file tag of a ``train`` configuration."""
    only = "" if args.fold is None else f"-fold{args.fold}"
    prior = "" if args.head_prior is None else f"-prior{args.head_prior:g}"
    return f"folds{args.folds}{only}-e{args.epochs}-dice{args.dice_weight:g}{prior}"


# --- report --------------------------------------------------------------------------------------------------------

def score_logits(saved: dict[str, Any], samples: dict[str, Sample]) -> dict[tuple[str, int, float], list[dict]]:
    """Per-photo rows of one saved set of logits: (upsampling, flips, threshold) → rows."""
    out: dict[tuple[str, int, float], list[dict]] = {}
    for key, logit in zip(saved["keys"], saved["logits"]):
        s = samples[key]
        dist = ndimage.distance_transform_edt(~s.mask)
        for mode in UPSAMPLING:
            for k in FLIPS:
                if mode == "probabilities" and k != 2:
                    continue  # the upsampling comparison at the product's flips only
                prob = upsample(logit[:k], s.mask.shape, TTA_FLIPS[:k], mode)
                for t in THRESHOLDS:
                    if (mode, k) != ("logits", 2) and t != THRESHOLD:
                        continue  # the threshold sweep at the product's flips and upsampling only
                    out.setdefault((mode, k, t), []).append(
                        {"photo": key, **photo_row(predict_mask_at(prob, t), s.mask, dist)})
    return out


def predict_mask_at(prob: np.ndarray, threshold: float) -> np.ndarray:
    """:func:`predict_mask` at another threshold (the map shifted so ``threshold`` falls on the product's 0.5)."""
    return predict_mask(prob - threshold + THRESHOLD)


def calibration(saved: dict[str, Any], flips: int = 2) -> dict[str, Any]:
    """Stride-4 probabilities (``flips`` views) against the cells' wound fractions: reliability bins; the mean
    probability in wound cells (fraction 1), border cells (0 < fraction < 1), the background ring within 3 cells
    of the wound and the far background; expected area (sum of probabilities / sum of fractions)."""
    p_all, t_all, ring_p, far_p, expected = [], [], [], [], []
    for logit, target in zip(saved["logits"], saved["targets"]):
        mean = torch.stack([flip(logit[k:k + 1].float(), v) for k, v in enumerate(TTA_FLIPS[:flips])]).mean(0)
        p = torch.sigmoid(mean)[0, 0].numpy()
        t = target.float()[0].numpy()
        near = ndimage.binary_dilation(t > 0, iterations=3) & (t == 0)
        ring_p.append(p[near])
        far_p.append(p[(t == 0) & ~near])
        p_all.append(p.ravel())
        t_all.append(t.ravel())
        expected.append(p.sum() / max(t.sum(), 1e-6))
    p, t = np.concatenate(p_all), np.concatenate(t_all)
    idx = np.clip(np.digitize(p, BINS) - 1, 0, len(BINS) - 2)
    bins = [{"bin": f"{BINS[b]:.1f}–{BINS[b + 1]:.1f}", "cells": int((idx == b).sum()),
             "mean_p": float(p[idx == b].mean()) if (idx == b).any() else None,
             "wound_fraction": float(t[idx == b].mean()) if (idx == b).any() else None} for b in range(len(BINS) - 1)]
    ring, far = np.concatenate(ring_p), np.concatenate(far_p)
    q1, med, q3 = np.percentile(expected, [25, 50, 75])
    return {"bins": bins, "p_wound": float(p[t >= 1].mean()), "p_border": float(p[(t > 0) & (t < 1)].mean()),
            "t_border": float(t[(t > 0) & (t < 1)].mean()), "p_ring": float(ring.mean()),
            "ring_over_05": float((ring >= 0.5).mean()), "p_far": float(far.mean()),
            "far_over_05": float((far >= 0.5).mean()), "expected_ratio_median": float(med),
            "expected_ratio_iqr": [float(q1), float(q3)],
            "ece": float(sum(abs(b["mean_p"] - b["wound_fraction"]) * b["cells"] for b in bins if b["cells"]) / len(p))}


def halo_share(rows: list[dict], h: int) -> float | None:
    """Median over photos (with a false positive) of the share of false-positive pixels within ``h`` px."""
    v = [r[f"fp_within{h}"] for r in rows if r.get(f"fp_within{h}") is not None]
    return round(float(np.median(v)), 3) if v else None


def summary_row(label: str, rows: list[dict]) -> list[Any]:
    """A table row of :func:`summarise`'s figures."""
    s = summarise(rows)
    return [label, s["n"], round(s["dice_median"], 3), round(s["dice_mean"], 3), round(s["iou_mean"], 3),
            f"{s['ratio_median']:.2f} [{s['ratio_iqr'][0]:.2f}, {s['ratio_iqr'][1]:.2f}]",
            round(100 * s["within10"], 1), round(100 * s["within20"], 1), round(100 * s["over15"], 1)]


SUMMARY_COLUMNS = ["variant", "photos", "median Dice/photo", "mean Dice/photo", "mean IoU/photo",
                   "area ratio median [IQR]", "% within ±10 %", "% within ±20 %", "% > 1.5×"]


def report(args: argparse.Namespace) -> dict[str, Any]:
    """Score every saved set of logits under ``--work`` (and the ceiling) into tables; per-photo rows to JSON."""
    samples = {s.key: s for name in SETS for s in samples_of(args, name)}
    tables, per_photo = [], {}
    ceil = ceiling(args)
    tables.append({"caption": "Ceiling of the output representation: expert mask → stride-4 cell fractions → "
                              "upsampled → 0.5 (no network)", "columns": SUMMARY_COLUMNS,
                   "rows": [summary_row(f"{name}, upsampling {mode}", rows)
                            for name in SETS for mode, rows in ceil[name].items()]})
    per_photo["ceiling"] = ceil
    calib_rows, halo_rows = [], []
    for path in sorted(args.work.glob(args.logits)):
        saved = torch.load(path)
        label = f"{saved['meta']['model']} → {saved['meta']['set']}"
        scored = score_logits(saved, samples)
        per_photo[path.stem] = {f"{m}/{k}/{t}": rows for (m, k, t), rows in scored.items()}
        rows = [summary_row(f"{m}, {k} flip(s), threshold {t}", r) for (m, k, t), r in scored.items()]
        tables.append({"caption": label, "columns": SUMMARY_COLUMNS, "rows": rows})
        halo_rows.append([label, *[halo_share(scored["logits", 2, THRESHOLD], h) for h in HALO]])
        c = calibration(saved)
        calib_rows.append([label, round(c["p_wound"], 3), f"{c['p_border']:.3f} (fraction {c['t_border']:.3f})",
                           round(c["p_ring"], 3), round(100 * c["ring_over_05"], 1), round(c["p_far"], 4),
                           round(100 * c["far_over_05"], 2),
                           f"{c['expected_ratio_median']:.2f} [{c['expected_ratio_iqr'][0]:.2f}, "
                           f"{c['expected_ratio_iqr'][1]:.2f}]", round(c["ece"], 4)])
        tables.append({"caption": f"Reliability, stride-4 cells, 2 flips: {label}",
                       "columns": ["bin of p", "cells", "mean p", "wound fraction"],
                       "rows": [[b["bin"], b["cells"], b["mean_p"], b["wound_fraction"]] for b in c["bins"]]})
        if "losses" in saved["meta"]:
            per_photo[path.stem]["losses"] = saved["meta"]["losses"]
    tables.append({"caption": "Calibration of the stride-4 probabilities (2 flips) against the cells' wound fractions",
                   "columns": ["logits", "mean p, wound cells", "mean p, border cells", "mean p, ring ≤ 3 cells out",
                               "% ring cells ≥ 0.5", "mean p, far background", "% far cells ≥ 0.5",
                               "Σp / Σfraction per photo, median [IQR]", "ECE"], "rows": calib_rows})
    tables.append({"caption": "Where the extra pixels lie (2 flips, threshold 0.5): median over photos of the share of "
                              "false-positive pixels within d px of the expert's wound",
                   "columns": ["logits", *[f"≤ {h} px" for h in HALO]], "rows": halo_rows})
    args.work.joinpath(f"{args.name}.json").write_text(json.dumps(per_photo))
    return {"tables": tables}


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.segmentation_diagnosis`` job; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.segmentation_diagnosis",
                                description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("ceiling", "features", "default", "train", "report"), required=True)
    p.add_argument("--fuseg", type=Path, default=SHARED / "fuseg-dev", help="fuseg-dev folder (images/, masks/)")
    p.add_argument("--medetec", type=Path, default=SHARED / "medetec", help="Medetec folder (images/, masks/)")
    p.add_argument("--work", type=Path, default=Path("/tmp/seg-diagnosis"),
                   help="folder for the feature caches and logits (outside the repository)")
    cli.add_epochs(p, PRETRAIN_EPOCHS)
    p.add_argument("--dice-weight", type=float, default=1.0, help="weight of the soft-Dice term (1: the recipe)")
    p.add_argument("--head-prior", type=float, default=None,
                   help="start the head's bias at this wound prior, e.g. 0.01 (default: PyTorch's init, as the recipe)")
    p.add_argument("--folds", type=int, default=2)
    p.add_argument("--fold", type=int, default=None, help="train and score this fold only (default: every fold)")
    cli.add_seed(p)
    p.add_argument("--logits", default="logits-*.pt", help="report: the saved logits (a pattern under --work) to score")
    p.add_argument("--name", default="report", help="report: writes --work/NAME.md (tables) and NAME.json (per photo)")
    p.add_argument("--quiet", action="store_true")
    args = cli.parse_args(p, argv)
    t0 = time.perf_counter()
    with torch_threads(1):
        if args.part == "ceiling":
            out = ceiling(args)
            print(render_tables([{"caption": "ceiling", "columns": SUMMARY_COLUMNS,
                                  "rows": [summary_row(f"{n}, {m}", r) for n in SETS for m, r in out[n].items()]}]))
            return 0
        if args.part != "report":
            out = {"features": features, "default": default, "train": train}[args.part](args)
            print(json.dumps({k: v for k, v in out.items() if k != "losses"}, indent=1))
            return 0
        out = report(args)
    text = render_tables(out["tables"])
    args.work.joinpath(f"{args.name}.md").write_text(
        f"Command: `{command_line('benchmarks.segmentation_diagnosis', argv)}` ({time.perf_counter() - t0:.0f} s)\n\n"
        + text, encoding="utf-8")
    print(text)
    print(f"wrote {args.work / args.name}.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
