"""The default segmenter's recipe on photos it never saw, area first: fuseg-dev k-fold by photo (nested), Medetec
zero-shot, Medetec fine-tuned with a clinic's first photos, click-to-outline and CPU inference.

    python -m benchmarks.segmentation_default [--part all|features|fold|score|curve|learning|report] [--fold F]
                                              [--folds 5] [--encoder lite0] [--work DIR] [--seed 0]

Every network is what ``python -m core.train_segmenter --pretrain`` makes (:func:`core.segmentation.model.new_net`
with its output bias at the wound prior, :data:`~core.segmentation.defaults.PRETRAIN_EPOCHS` epochs, the 4 flips
and one close-up cached once per photo), trained without the photos it is scored on:

- **fuseg-dev, ``--folds`` folds by photo** (a file-name series stays in one fold): each fold's network is trained
  on the other folds, and its threshold is chosen as the command chooses the default's — a network trained
  without an inner fifth of those photos (whole series), the threshold of
  :data:`~core.segmentation.defaults.THRESHOLD_GRID` with the best mean Dice on that inner fifth
  (:func:`core.segmentation.training.choose_threshold`) — so no reported photo chose anything. Scored at that
  threshold and, for reference, at 0.5;
- **Medetec zero-shot**: every fold network (trained on fuseg-dev alone) on all Medetec photos, at its threshold;
  the row is the mean over the networks per photo;
- **Medetec fine-tuned with 15 photos** (a clinic's first outlines): fold ``F``'s network fine-tuned as a
  workspace's run does (``--clinic-epochs``, default :data:`~core.segmentation.defaults.EPOCHS`, from it; its
  threshold kept) on 15 Medetec photos drawn by series with seed ``F``, scored on the other Medetec photos beside
  the same network before fine-tuning (paired); ``--part learning``: the same at 5, 10, 15 and 20 photos (nested
  draws), every size scored on the same photos, a clinic's learning curve;
- **click-to-outline on Medetec**: one click at each wound's deepest point, fold 0's network's map (zero-shot);
- **CPU inference** of a 512-px photo (2 flips at each test-time size, 1 and 2 threads) with fold 0's network.

Every photo is scored as the product outlines it (:meth:`~core.segmentation.model.Segmenter.probability`: 2 flips
at each of the :data:`~core.segmentation.model.TEST_SCALES` sizes); the fold networks are also scored at the
training size alone (a paired comparison of the test-time sizes; ``--part score`` re-scores saved fold networks).
Per photo at the photo's resolution, outlines as suggestions show them (holes filled, components < 25 px dropped):
Dice, IoU, boundary F (2 px) and the area ratio = predicted / expert wound pixels (median, interquartile, share
within ±10 % and ±20 %, share over 1.5×); 95 % intervals resample photo series. ``--encoder`` picks the frozen
encoder (:data:`core.segmentation.model.ENCODERS`) to compare backbones on the same folds, ``--augmented`` the random
views cached per fuseg-dev photo (0: the flips alone) and ``--views`` their kind (a strong random view, or the
default's close-up of the wound). Parts can run as
separate processes (``--part fold --fold F``, one per fold); ``--work`` keeps their outputs.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from annotations.infra.workspace import DEFAULT_MIN_WOUND_AREA
from benchmarks.results import RESULTS_DIR, command_line, paired_claim, render_tables, write_result
from benchmarks.segmentation import (
    SHARED,
    click_scores,
    fold_seed,
    group_folds,
    grouped_bootstrap,
    inference_seconds,
)
from benchmarks.segmentation_diagnosis import load_cache, save_cache
from core import cli
from core.runtime import torch_threads
from core.segmentation.defaults import (
    EPOCHS,
    FINE_TUNE,
    INNER_FRACTION,
    PRETRAIN_EPOCHS,
    THRESHOLD,
    TUNED_PARTS,
    SegmenterConfig,
)
from core.segmentation.interactive import wound_components
from core.segmentation.metrics import BAND_FRACTION, band_recall, boundary_f, dice, iou
from core.segmentation.model import ENCODERS, INPUT_SIZE, Segmenter, SegNet, encoder, new_net, inference_sizes
from core.segmentation.training import (
    AUGMENTATIONS,
    AUGMENTED_VIEWS,
    PRETRAIN_AUGMENTATION,
    PRETRAIN_AUGMENTED_VIEWS,
    FeatureCache,
    Sample,
    cache_features,
    fit_network,
    folder_samples,
    choose_threshold,
    inner_threshold,
    split_groups,
)

SETS = ("fuseg", "medetec")
#: A clinic's first outlined photos (issue 48: "fine-tuned with 15 Medetec photos").
CLINIC_PHOTOS = 15
BOUNDARY_PX = 2
#: A workspace run's fine-tuning rate (``SegmenterConfig.lr``), and the rates a clinic's curve compares (it, a tenth).
CLINIC_LR = f"{SegmenterConfig().lr:g}"
CLINIC_LR_CHOICES = (CLINIC_LR, f"{SegmenterConfig().lr / 10:g}")
#: A clinic's learning curve: the numbers of its first outlined photos a fine-tune is scored at (issue 48 §6).
LEARNING_SIZES = (5, 10, 15, 20)
#: What each ``--clinic-tune`` trains, in words.
TUNE_LABELS = {"head": "the decoder's head alone", "all": "every trained part"}


def samples_of(args: argparse.Namespace, name: str) -> list[Sample]:
    """The photos (with at least one wound) of set ``name``."""
    return folder_samples(args.fuseg if name == "fuseg" else args.medetec)


def recipe(args: argparse.Namespace) -> str:
    """The configuration's name in file names and tables: ``--encoder``, and the views when not the default's
    (``-flips`` for none, ``-aN`` for N strong views, ``-closeN`` for N close-ups)."""
    if (args.augmented, args.views) == (PRETRAIN_AUGMENTED_VIEWS, PRETRAIN_AUGMENTATION):
        return args.encoder
    if not args.augmented:
        return args.encoder + "-flips"
    return args.encoder + (f"-a{args.augmented}" if args.views == "strong" else f"-{args.views}{args.augmented}")


def cache_file(args: argparse.Namespace, name: str) -> Path:
    """Where set ``name``'s feature cache for ``--encoder`` (and fuseg-dev's for ``--augmented``) lives."""
    return args.work / f"features-{name}-{recipe(args) if name == 'fuseg' else args.encoder}.pt"


def features(args: argparse.Namespace) -> dict[str, Any]:
    """Cache the frozen encoder's features of every photo's four flips (and fuseg-dev's ``--augmented`` random views,
    the networks' training set), once per set."""
    enc = encoder("cpu", args.encoder)
    args.work.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in SETS:
        samples = samples_of(args, name)
        t0 = time.perf_counter()
        augmented = args.augmented if name == "fuseg" else 0  # Medetec: scored on its flips, fine-tuned as a clinic's
        save_cache(cache_file(args, name), cache_features(samples, enc, INPUT_SIZE, augmented=augmented,
                                                          seed=args.seed, progress=not args.quiet,
                                                          aug=AUGMENTATIONS[args.views]), samples)
        out[name] = {"photos": len(samples), "seconds": time.perf_counter() - t0}
        print(f"{name}: {len(samples)} photos cached in {out[name]['seconds']:.0f} s", flush=True)
    return out


def photo_row(sample: Sample, prob: np.ndarray, threshold: float) -> dict[str, Any]:
    """One photo's scores at ``threshold`` (outlines as suggestions show them)."""
    comps = wound_components(prob, DEFAULT_MIN_WOUND_AREA, threshold=threshold)
    pred = np.logical_or.reduce(comps) if comps else np.zeros(sample.mask.shape, bool)
    band, core = band_recall(pred, sample.mask)
    return {"photo": sample.key, "group": sample.group, "dice": dice(pred, sample.mask), "iou": iou(pred, sample.mask),
            "boundary_f": boundary_f(pred, sample.mask, BOUNDARY_PX),
            "ratio": float(pred.sum() / max(1, int(sample.mask.sum()))), "band_recall": band, "core_recall": core}


def scored(seg: Segmenter, samples: list[Sample], idx: list[int] | range,
           thresholds: dict[str, float]) -> dict[str, list[dict]]:
    """Rows of the ``idx`` photos at each named threshold, from ``seg``'s probability maps."""
    probs = {i: seg.probability(samples[i].image) for i in idx}
    return {name: [photo_row(samples[i], probs[i], t) for i in idx] for name, t in thresholds.items()}


def fold_scores(args: argparse.Namespace, f: int, net: SegNet, threshold: float) -> dict[str, dict[str, list[dict]]]:
    """Fold ``f``'s network on its held-out fuseg-dev photos and on every Medetec photo: at its threshold and at 0.5
    with the test-time sizes, and at its threshold with the training size alone (``one size``)."""
    enc = encoder("cpu", args.encoder)
    fuseg, medetec = samples_of(args, "fuseg"), samples_of(args, "medetec")
    out: dict[str, dict[str, list[dict]]] = {}
    for name, samples, idx in (("fuseg", fuseg, group_folds(fuseg, args.folds, args.seed)[f]),
                               ("medetec", medetec, list(range(len(medetec))))):
        out[name] = {**scored(Segmenter(net, enc, INPUT_SIZE), samples, idx, {"chosen": threshold, "0.5": 0.5}),
                     "one size": scored(Segmenter(net, enc, INPUT_SIZE, scales=(1.0,)), samples, idx,
                                        {"chosen": threshold})["chosen"]}
    return out


def fold_file(args: argparse.Namespace, part: str, fold: int) -> Path:
    """Where ``part`` (fold, curve) of fold ``fold`` keeps its scores."""
    return args.work / f"{part}{fold}-of{args.folds}-{recipe(args)}-s{args.seed}.json"


def net_file(args: argparse.Namespace, fold: int) -> Path:
    """Where fold ``fold``'s network and threshold are kept."""
    return args.work / f"fold{fold}-of{args.folds}-{recipe(args)}-s{args.seed}.pt"


def fold(args: argparse.Namespace, f: int) -> dict[str, Any]:
    """Fold ``f``: the inner split's threshold, the network on the other folds, its scores (fuseg-dev fold f and
    Medetec zero-shot)."""
    enc = encoder("cpu", args.encoder)
    fuseg = samples_of(args, "fuseg")
    cache_f = load_cache(cache_file(args, "fuseg"), fuseg)
    test = group_folds(fuseg, args.folds, args.seed)[f]
    train = [i for i in range(len(fuseg)) if i not in set(test)]
    seed = fold_seed(args.seed, 0, f, args.folds)
    start = new_net(enc, seed=seed)
    t0 = time.perf_counter()
    threshold = THRESHOLD
    inner: dict[str, Any] = {"n_train": 0, "n_held_out": 0, "loss": [], "dice_by_threshold": {}}
    if not args.no_inner:
        chosen = inner_threshold(cache_f, fuseg, train, start, args.epochs, DEFAULT_MIN_WOUND_AREA, seed=seed,
                                 progress=not args.quiet)
        assert chosen is not None, "fuseg-dev's training folds hold more than one series"
        threshold, inner = chosen
    net, loss = fit_network(cache_f, train, start, args.epochs, seed=seed, progress=not args.quiet)
    seconds = time.perf_counter() - t0
    torch.save({"state": net.state_dict(), "threshold": threshold}, net_file(args, f))
    out = {"fold": f, "threshold": threshold, "dice_by_threshold": inner["dice_by_threshold"],
           "inner": [inner["n_train"], inner["n_held_out"]], "loss": loss, "inner_loss": inner["loss"],
           "train_seconds": seconds, "n_train": len(train),
           **fold_scores(args, f, net.eval(), threshold)}
    fold_file(args, "fold", f).write_text(json.dumps(out))
    print(f"fold {f}: threshold {threshold:g}, {seconds:.0f} s, Dice "
          f"{np.mean([r['dice'] for r in out['fuseg']['chosen']]):.3f}, area ratio "
          f"{np.median([r['ratio'] for r in out['fuseg']['chosen']]):.2f}", flush=True)
    return out


def rescore(args: argparse.Namespace, f: int) -> dict[str, Any]:
    """Fold ``f``'s saved network scored again (its training record kept): after a change of test-time views."""
    out = json.loads(fold_file(args, "fold", f).read_text())
    out.update(fold_scores(args, f, *load_fold_net(args, f)))
    fold_file(args, "fold", f).write_text(json.dumps(out))
    return out


def load_fold_net(args: argparse.Namespace, f: int) -> tuple[SegNet, float]:
    """Fold ``f``'s network (eval mode) and its threshold."""
    saved = torch.load(net_file(args, f))
    net = new_net(encoder("cpu", args.encoder))
    net.load_state_dict(saved["state"])
    return net.eval(), float(saved["threshold"])


def clinic_cache(args: argparse.Namespace, samples: list[Sample]) -> FeatureCache:
    """The ``--clinic-set``'s features for a clinic's fine-tune: the flips, and ``--clinic-views`` close-ups per photo
    when asked (cached once in ``--work``)."""
    if not args.clinic_views:
        flips = argparse.Namespace(**{**vars(args), "augmented": 0})
        path = cache_file(flips, args.clinic_set)
        if args.clinic_set == "fuseg" and not path.is_file():
            save_cache(path, cache_features(samples, encoder("cpu", args.encoder), INPUT_SIZE, seed=args.seed,
                                            progress=not args.quiet), samples)
        return load_cache(path, samples)
    path = args.work / f"features-{args.clinic_set}-{args.encoder}-close{args.clinic_views}.pt"
    if not path.is_file():
        save_cache(path, cache_features(samples, encoder("cpu", args.encoder), INPUT_SIZE, augmented=args.clinic_views,
                                        seed=args.seed, progress=not args.quiet, aug=AUGMENTATIONS["close"]), samples)
    return load_cache(path, samples)


def curve_file(args: argparse.Namespace, f: int, kind: str = "curve") -> Path:
    """Where fold ``f``'s clinic curve (``kind="learning"``: its learning curve) keeps its scores (``-clinicN`` when
    the clinic caches N close-ups, ``-fuseg`` for fuseg-dev's clinic, ``-inner`` when the clinic's threshold comes from
    an inner split, ``-lrR`` for another rate, ``-all`` when every trained part is fine-tuned)."""
    clinic = f"-clinic{args.clinic_views}" if args.clinic_views != AUGMENTED_VIEWS else ""
    clinic += "-fuseg" if args.clinic_set == "fuseg" else ""
    clinic += "-inner" if args.clinic_threshold == "inner" else ""
    clinic += f"-lr{args.clinic_lr}" if args.clinic_lr != CLINIC_LR else ""
    clinic += f"-{args.clinic_tune}" if args.clinic_tune != FINE_TUNE else ""
    return args.work / f"{kind}{f}-of{args.folds}-{recipe(args)}{clinic}-s{args.seed}.json"


def pooled_draws(files: list[dict], key: str, size: str | None = None) -> list[dict]:
    """The photo rows under ``key`` (under ``key`` and ``size`` in a learning file) of every fold's curve file,
    pooled, each photo series labelled by its draw (the fold) so that a paired test or a bootstrap keeps draws apart."""
    return [{**r, "group": f"{o['fold']}:{r['group']}"} for o in files
            for r in (o[key] if size is None else o[key][size])]


def inner_choice(cache: FeatureCache, samples: list[Sample], train: list[int], start: SegNet, epochs: int,
                 candidates: dict[str, float], threshold: float, seed: int,
                 quiet: bool) -> tuple[str, dict[str, Any]] | None:
    """The learning rate of ``candidates`` (name → rate) whose network, fine-tuned from ``start`` without
    :data:`~core.segmentation.defaults.INNER_FRACTION` of ``train`` (whole series), has the best mean Dice per photo on
    that share at ``threshold`` (ties go to the first); with each candidate's Dice. None for a single series."""
    inner, held = split_groups([samples[i] for i in train], INNER_FRACTION, seed)
    if not held:
        return None
    scores = {}
    for name, lr in candidates.items():
        net, _ = fit_network(cache, [train[i] for i in inner], start, epochs, lr=lr, seed=seed, progress=not quiet)
        scores[name] = choose_threshold(net, cache, samples, [train[i] for i in held], DEFAULT_MIN_WOUND_AREA,
                                        grid=(threshold,))[1][f"{threshold:g}"]
    best = max(candidates, key=lambda name: round(scores[name], 6))
    return best, {"n_train": len(inner), "n_held_out": len(held), "dice": scores}


def clinic_pool(args: argparse.Namespace, samples: list[Sample], f: int) -> list[int]:
    """The photos fold ``f``'s clinic draws from: every Medetec photo, or fuseg-dev's fold ``f`` (which the fold's
    network never saw)."""
    return group_folds(samples, args.folds, args.seed)[f] if args.clinic_set == "fuseg" else list(range(len(samples)))


def clinic_photos(args: argparse.Namespace, samples: list[Sample], pool: list[int], f: int, n: int) -> list[int]:
    """A clinic's first ``n`` outlined photos for fold ``f``: whole series of ``pool`` in an order drawn with seed
    ``--seed`` + ``f``, until they hold at least ``n`` photos (so a larger ``n`` adds series to a smaller one's)."""
    order = np.random.default_rng(args.seed + f).permutation(sorted({samples[i].group for i in pool}))
    clinic: list[int] = []
    for g in order:
        if len(clinic) >= n:
            break
        clinic += [i for i in pool if samples[i].group == g]
    return clinic


def learning(args: argparse.Namespace, f: int) -> dict[str, Any]:
    """Fold ``f``'s learning curve: its network fine-tuned as a workspace run does on a clinic's first ``n`` photos for
    each ``n`` of ``--learning-sizes`` (default :data:`LEARNING_SIZES`; nested draws, :func:`clinic_photos`), every
    fine-tune and the network before it scored on the same photos, the pool's photos outside the largest draw."""
    samples = samples_of(args, args.clinic_set)
    pool = clinic_pool(args, samples, f)
    cache = clinic_cache(args, samples)
    start, threshold = load_fold_net(args, f)
    enc = encoder("cpu", args.encoder)
    draws = {n: clinic_photos(args, samples, pool, f, n) for n in args.learning_sizes}
    largest = set(draws[max(args.learning_sizes)])
    rest = [i for i in pool if i not in largest]
    if not rest:
        raise ValueError(f"fold {f}: a clinic's first {max(args.learning_sizes)} photos take every photo of the "
                         f"{args.clinic_set} pool ({len(pool)}); nothing is left to score (--learning-sizes)")
    at = {"chosen": threshold}
    out: dict[str, Any] = {"fold": f, "tune": args.clinic_tune, "lr": args.clinic_lr, "scored": len(rest),
                           "clinic": {str(n): [samples[i].key for i in c] for n, c in draws.items()},
                           "start": scored(Segmenter(start, enc), samples, rest, at)["chosen"], "tuned": {}}
    for n, clinic in draws.items():
        net, _ = fit_network(cache, clinic, start, args.clinic_epochs, lr=float(args.clinic_lr), seed=args.seed + f,
                             progress=not args.quiet, tune=args.clinic_tune)
        out["tuned"][str(n)] = scored(Segmenter(net.eval(), enc), samples, rest, at)["chosen"]
    curve_file(args, f, "learning").write_text(json.dumps(out))
    return out


def learning_table(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """The learning curve of a clinic's fine-tune on each clinic set whose files exist, with each size's claim that
    it adds Dice over the networks before it (paired over draw × photo series)."""
    rows, claims = [], []
    for name, where in (("medetec", "Medetec"), ("fuseg", "fuseg-dev, held-out fold")):
        ns = argparse.Namespace(**{**vars(args), "clinic_set": name})
        if not all(curve_file(ns, f, "learning").is_file() for f in range(args.folds)):
            continue
        files = [json.loads(curve_file(ns, f, "learning").read_text()) for f in range(args.folds)]

        sizes = list(files[0]["tuned"])
        if any(list(o["tuned"]) != sizes for o in files):
            raise ValueError(f"the {name} learning files in {args.work} were made with different --learning-sizes")
        before = pooled_draws(files, "start")
        rows.append([where, 0, 0, *area_cells(before)])
        for n in sizes:
            tuned = pooled_draws(files, "tuned", n)
            rows.append([where, int(n), round(float(np.mean([len(o["clinic"][n]) for o in files])), 1),
                         *area_cells(tuned)])
            claims.append(paired_claim(f"a fine-tune on a clinic's first {n} photos adds Dice over the networks before "
                                       f"it on {where} (paired over draw × photo series)", *group_means(tuned, before)))
    if not rows:
        return [], []
    return [{"caption": f"A clinic's learning curve: a fine-tune of {TUNE_LABELS[args.clinic_tune]} at lr "
                        f"{args.clinic_lr} on its first n outlined photos (whole series, nested draws, {args.folds} "
                        "draws), all scored on the same photos: those outside the largest draw (on Medetec, another outlining convention; "
                        "on fuseg-dev's held-out fold, the default's own)",
             "columns": ["clinic set", "n", "photos outlined (mean)", *COLUMNS[1:]], "rows": rows}], claims


def curve(args: argparse.Namespace, f: int) -> dict[str, Any]:
    """Fold ``f``'s network fine-tuned on ``--clinic`` photos of the ``--clinic-set`` (series drawn with seed ``f``:
    from every Medetec photo, or from fuseg-dev's fold ``f``, which the network never saw), scored on the rest; with
    ``--clinic-threshold inner`` also at the threshold an inner split of those photos chooses; ``--clinic-tune head``
    trains the decoder's head alone."""
    samples = samples_of(args, args.clinic_set)
    pool = clinic_pool(args, samples, f)
    cache = clinic_cache(args, samples)
    start, threshold = load_fold_net(args, f)
    clinic = clinic_photos(args, samples, pool, f, args.clinic)
    rest = [i for i in pool if i not in set(clinic)]
    lr, lr_choice = args.clinic_lr, None
    if lr == "inner":
        rates = {rate: float(rate) for rate in CLINIC_LR_CHOICES}
        lr_choice = inner_choice(cache, samples, clinic, start, args.clinic_epochs, rates, threshold, args.seed + f,
                                 args.quiet)
        lr = CLINIC_LR if lr_choice is None else lr_choice[0]
    at, inner = {"chosen": threshold}, None
    if args.clinic_threshold == "inner":
        chosen = inner_threshold(cache, samples, clinic, start, args.clinic_epochs, DEFAULT_MIN_WOUND_AREA,
                                 seed=args.seed + f, progress=not args.quiet)
        if chosen is not None:
            at["inner"], inner = chosen
    net, _ = fit_network(cache, clinic, start, args.clinic_epochs, lr=float(lr), seed=args.seed + f,
                         progress=not args.quiet, tune=args.clinic_tune)
    enc = encoder("cpu", args.encoder)
    tuned = scored(Segmenter(net.eval(), enc), samples, rest, at)
    out = {"fold": f, "clinic": len(clinic), "threshold": at, "inner": inner, "lr": lr, "lr_choice": lr_choice,
           "tune": args.clinic_tune,
           "zero_shot": scored(Segmenter(start, enc), samples, rest, {"chosen": threshold})["chosen"],
           "fine_tuned": tuned["chosen"], **({"fine_tuned_inner": tuned["inner"]} if "inner" in tuned else {})}
    curve_file(args, f).write_text(json.dumps(out))
    return out


def area_cells(rows: list[dict]) -> list[Any]:
    """Dice [CI], median Dice, IoU, boundary F, area ratio median [IQR], % within ±10 / ±20 %, % over 1.5×."""
    groups = [r["group"] for r in rows]
    r = np.array([x["ratio"] for x in rows])
    q1, med, q3 = np.percentile(r, [25, 50, 75])
    return [len(rows), grouped_bootstrap([x["dice"] for x in rows], groups, 0),
            round(float(np.median([x["dice"] for x in rows])), 3),
            grouped_bootstrap([x["iou"] for x in rows], groups, 0),
            grouped_bootstrap([x["boundary_f"] for x in rows], groups, 0),
            f"{med:.2f} [{q1:.2f}, {q3:.2f}]", round(100 * float(np.mean(np.abs(r - 1) <= 0.1)), 1),
            round(100 * float(np.mean(np.abs(r - 1) <= 0.2)), 1), round(100 * float(np.mean(r > 1.5)), 1)]


COLUMNS = ["scored on", "photos", "Dice/photo [95 % CI]", "median Dice", "IoU", "boundary F (2 px)",
           "area ratio median [IQR]", "% within ±10 %", "% within ±20 %", "% over 1.5×"]


def group_means(a: list[dict], b: list[dict]) -> tuple[list[float], list[float]]:
    """Mean Dice per photo series of two scorings of the same photos (for a test paired over series)."""
    groups = sorted({r["group"] for r in a})
    return tuple([float(np.mean([r["dice"] for r in rows if r["group"] == g])) for g in groups]
                 for rows in (a, b))  # type: ignore[return-value]


def mean_over_networks(per_fold: list[list[dict]]) -> list[dict]:
    """Each photo's scores averaged over the fold networks (the same photos in the same order in each)."""
    out = []
    for rows in zip(*per_fold):
        out.append({"photo": rows[0]["photo"], "group": rows[0]["group"],
                    **{k: float(np.mean([r[k] for r in rows])) for k in ("dice", "iou", "boundary_f")},
                    "ratio": float(np.median([r["ratio"] for r in rows])),
                    **{k: None if rows[0][k] is None else float(np.mean([r[k] for r in rows]))
                       for k in ("band_recall", "core_recall") if k in rows[0]}})
    return out


def misses_table(sets: list[tuple[str, list[dict]]]) -> list[dict]:
    """Where the networks miss the expert's wound (its outer band or its core), for each (label, photo rows) of the
    main table given; none when some photo was scored before the fields existed."""
    if not all("band_recall" in r for _, rows in sets for r in rows):
        return []

    def recall(rows: list[dict], key: str) -> Any:
        kept = [r for r in rows if r[key] is not None]
        return grouped_bootstrap([r[key] for r in kept], [r["group"] for r in kept], 0)
    return [{"caption": f"Where the expert's wound is missed: recall of its pixels in each wound's outer band (within "
                        f"{100 * BAND_FRACTION:.0f} % of its equivalent radius of the outline) and in its core",
             "columns": ["scored on", "photos", "recall in the outer band", "recall in the core",
                         "area ratio median"],
             "rows": [[label, len(rows), recall(rows, "band_recall"), recall(rows, "core_recall"),
                       round(float(np.median([r["ratio"] for r in rows])), 2)] for label, rows in sets]}]


def clinic_variants_table(args: argparse.Namespace) -> tuple[list[dict], list[dict], list[str]]:
    """A clinic's fine-tune as a workspace run does it (the decoder's head alone) against its variants (every trained
    part, at the same rate, at a tenth of it, or with a threshold or a rate chosen on an inner split of the clinic's
    photos), on each clinic set whose curves exist: Medetec (another outlining convention) and fuseg-dev's held-out
    fold (the default's own). Each variant's claim: it adds Dice over the same networks before fine-tuning (paired
    over draw × photo series). Also the curve files it read."""
    every = {"clinic_tune": "all"}
    variants = [("before fine-tuning", {}, "zero_shot"),
                (f"the decoder's head alone, lr {CLINIC_LR}, threshold kept: a workspace run's", {}, "fine_tuned"),
                (f"every trained part, lr {CLINIC_LR}, threshold kept: a workspace run's before stop 69",
                 {**every, "clinic_threshold": "inner"}, "fine_tuned"),
                (f"every trained part, lr {CLINIC_LR}, threshold from an inner split",
                 {**every, "clinic_threshold": "inner"}, "fine_tuned_inner"),
                *((f"every trained part, lr {rate}, threshold kept", {**every, "clinic_lr": rate}, "fine_tuned")
                  for rate in CLINIC_LR_CHOICES if rate != CLINIC_LR),
                ("every trained part, lr from an inner split, threshold kept", {**every, "clinic_lr": "inner"},
                 "fine_tuned")]
    rows, claims, read, found = [], [], set(), set()
    for name, where in (("medetec", "Medetec, the rest"), ("fuseg", "fuseg-dev, the rest of the fold")):
        scores = {}
        for label, change, key in variants:
            ns = argparse.Namespace(**{**vars(args), "clinic_set": name, **change})
            if all(curve_file(ns, f).is_file() for f in range(args.folds)):
                curves = [json.loads(curve_file(ns, f).read_text()) for f in range(args.folds)]
                read |= {curve_file(ns, f).name for f in range(args.folds)}
                scores[label] = pooled_draws(curves, key)
                chosen = " ".join(str(c["lr"]) for c in curves) if change.get("clinic_lr") == "inner" else ""
                rows.append([where, label, chosen, *area_cells(scores[label])])
                found.add(label)
        before = scores.pop(variants[0][0], None)
        claims += [paired_claim(f"a {args.clinic} photos' fine-tune ({label}) adds Dice over the networks before it on "
                                f"{where} (paired over draw × photo series)", *group_means(rows_, before))
                   for label, rows_ in scores.items() if before is not None]
    if not found - {label for label, _, _ in variants[:2]}:  # the main table has those two
        return [], [], []
    note = (f"The fine-tune variants' table read from {args.work} (`--part curve` with `--clinic-set`, "
            f"`--clinic-threshold`, `--clinic-lr` or `--clinic-tune`): " + ", ".join(sorted(read)) + ".")
    return [{"caption": f"A clinic's {args.clinic} photos' fine-tune and its variants, on another outlining convention "
                        "(Medetec) and on the default's own (fuseg-dev's held-out fold): the same fold networks and "
                        "draws, all draws pooled",
             "columns": ["scored on", "fine-tune", "rate chosen per fold", *COLUMNS[1:]], "rows": rows}], claims, [note]


def alternatives(args: argparse.Namespace) -> list[tuple[argparse.Namespace, str]]:
    """The configurations a report compares with its own where their fold files exist: each other encoder (same
    augmented views), and the flips alone or one or two random views of each kind of
    :data:`~core.segmentation.training.AUGMENTATIONS` per photo."""
    out = [(argparse.Namespace(**{**vars(args), "encoder": e}), "encoders") for e in ENCODERS if e != args.encoder]
    views = [argparse.Namespace(**{**vars(args), "augmented": n, "views": v})
             for n, v in [(0, args.views), *((n, v) for n in (1, 2) for v in AUGMENTATIONS)]]
    return out + [(ns, "augmented views per photo") for ns in views if recipe(ns) != recipe(args)]


def report(args: argparse.Namespace) -> tuple[list[dict], list[dict], list[str]]:
    """Tables, the fine-tune's paired claim and notes from every fold's and curve's saved scores."""
    folds = [json.loads(fold_file(args, "fold", f).read_text()) for f in range(args.folds)]
    curves = [json.loads(curve_file(args, f).read_text()) for f in range(args.folds)]
    fuseg = {k: [r for o in folds for r in o["fuseg"][k]] for k in ("chosen", "0.5")}
    medetec = {k: mean_over_networks([o["medetec"][k] for o in folds]) for k in ("chosen", "0.5")}
    sets = [("fuseg-dev, held-out folds, nested threshold", fuseg["chosen"]),
            ("fuseg-dev, held-out folds, threshold 0.5", fuseg["0.5"]),
            ("Medetec zero-shot (mean of the fold networks), nested threshold", medetec["chosen"]),
            ("Medetec zero-shot, threshold 0.5", medetec["0.5"]),
            (f"Medetec, {args.clinic} photos' fine-tune, on the rest (all draws)",
             [r for c in curves for r in c["fine_tuned"]]),
            ("Medetec, the same networks before fine-tuning, same photos", [r for c in curves for r in c["zero_shot"]])]
    rows = [[label, *area_cells(scores)] for label, scores in sets]
    tables = [{"caption": f"The default's recipe ({recipe(args)}) on photos its networks never saw "
                          f"({args.folds} fuseg-dev folds by photo series, seed {args.seed})",
               "columns": COLUMNS, "rows": rows}]
    tables += misses_table([sets[i] for i in (0, 2, 5, 4)])  # nested thresholds; before, then after the fine-tune
    tables.append({"caption": "Per fold: the threshold its inner split chose (inner photos trained / held out), "
                              "training time, last training loss",
                   "columns": ["fold", "threshold", "inner split", "held-out mean Dice at 0.3 … 0.7", "seconds",
                               "last loss"],
                   "rows": [[o["fold"], o["threshold"], f"{o['inner'][0]} / {o['inner'][1]}",
                             " ".join(f"{v:.3f}" for v in o["dice_by_threshold"].values()),
                             round(o["train_seconds"]), round(o["loss"][-1], 4)] for o in folds]})
    claims = [paired_claim(f"{args.clinic} Medetec photos' fine-tune adds Dice on the other Medetec photos (paired "
                           "over draw × photo series)",
                           *group_means(pooled_draws(curves, "fine_tuned"), pooled_draws(curves, "zero_shot")))]
    sizes = "+".join(map(str, inference_sizes(INPUT_SIZE)))
    one = {"fuseg-dev held-out": (fuseg["chosen"], [r for o in folds for r in o["fuseg"]["one size"]]),
           "Medetec zero-shot": (medetec["chosen"], mean_over_networks([o["medetec"]["one size"] for o in folds]))}
    tables.append({"caption": f"Test-time sizes: {sizes} px against {INPUT_SIZE} px alone (the same fold networks, 2 "
                              "flips at each size, each fold's nested threshold)",
                   "columns": ["test-time sizes", *COLUMNS],
                   "rows": [[label, where, *area_cells(pair[k])] for where, pair in one.items()
                            for k, label in ((0, sizes), (1, str(INPUT_SIZE)))]})
    claims += [paired_claim(f"test-time sizes {sizes} add Dice over {INPUT_SIZE} alone on {where} photos (paired over "
                            "photo series)", *group_means(*pair)) for where, pair in one.items()]
    other = argparse.Namespace(**{**vars(args), "clinic_views": 0 if args.clinic_views else 1})
    if all(curve_file(other, f).is_file() for f in range(args.folds)):
        theirs_c = [json.loads(curve_file(other, f).read_text()) for f in range(args.folds)]
        tuned = {n: pooled_draws(cs, "fine_tuned")
                 for n, cs in ((args.clinic_views, curves), (other.clinic_views, theirs_c))}
        tables.append({"caption": f"A clinic's {args.clinic} photos' fine-tune: the flips alone against one close-up per "
                                  "photo besides them (the same fold networks, draws and epochs; on the other Medetec "
                                  "photos)",
                       "columns": ["close-ups per clinic photo", *COLUMNS],
                       "rows": [[n, "Medetec, the rest (all draws)", *area_cells(rows)] for n, rows in sorted(tuned.items())]})
        claims.append(paired_claim(f"one close-up per clinic photo adds Dice over the flips alone to the {args.clinic} "
                                   "photos' fine-tune (paired over draw × photo series)", *group_means(tuned[1], tuned[0])))
    tables_t, claims_t, variant_notes = clinic_variants_table(args)
    tables_l, claims_l = learning_table(args)
    tables, claims = tables + tables_t + tables_l, claims + claims_t + claims_l
    timing: dict[str, float] = {}  # CPU s of a 512-px photo per recipe (fold networks differ, not their cost)
    for them, what in alternatives(args):
        done = [f for f in range(args.folds) if fold_file(them, "fold", f).is_file()]
        if not done:
            continue
        theirs = [json.loads(fold_file(them, "fold", f).read_text()) for f in done]
        ours = [folds[f] for f in done]
        a = [r for o in ours for r in o["fuseg"]["chosen"]]
        b = [r for o in theirs for r in o["fuseg"]["chosen"]]
        assert [r["photo"] for r in a] == [r["photo"] for r in b]
        med_a, med_b = (mean_over_networks([o["medetec"]["chosen"] for o in os_]) for os_ in (ours, theirs))
        for ns in (ns for ns in (args, them) if recipe(ns) not in timing):
            net, _ = load_fold_net(ns, done[0])
            timing[recipe(ns)] = inference_seconds(Segmenter(net, encoder("cpu", ns.encoder), INPUT_SIZE), 2)
        tables.append({"caption": f"{what.capitalize()} on the same held-out fuseg-dev folds "
                                  f"({', '.join(map(str, done))}) and zero-shot on Medetec (mean of those folds' "
                                  "networks), same epochs, each fold network's nested threshold (0.5 without an inner "
                                  "split)",
                       "columns": ["recipe", *COLUMNS, "training s / fold", "CPU s / 512-px photo (2 threads)"],
                       "rows": [[recipe(ns), where, *area_cells(rows),
                                 round(float(np.mean([o["train_seconds"] for o in os_]))), round(timing[recipe(ns)], 3)]
                                for where, pair in (("fuseg-dev held-out", (a, b)), ("Medetec zero-shot", (med_a, med_b)))
                                for ns, rows, os_ in ((args, pair[0], ours), (them, pair[1], theirs))]})
        claims += [paired_claim(f"{recipe(args)} adds Dice over {recipe(them)} on held-out fuseg-dev photos (paired "
                                "over photo series)", *group_means(a, b)),
                   paired_claim(f"{recipe(args)} adds Dice over {recipe(them)} on Medetec zero-shot (paired over "
                                "photo series)", *group_means(med_a, med_b))]
    notes = [f"Training per fold (inner network + fold network, {args.epochs} epochs each): "
             f"{np.mean([o['train_seconds'] for o in folds]) / 60:.1f} min on average, 1 torch thread.", *variant_notes]
    if args.click:
        net, threshold = load_fold_net(args, 0)
        enc = encoder("cpu", args.encoder)
        seg = Segmenter(net, enc, INPUT_SIZE, threshold=threshold)
        medetec_s = samples_of(args, "medetec")
        probs = {i: seg.probability(s.image) for i, s in enumerate(medetec_s)}
        clicks = click_scores(medetec_s, probs, threshold)
        for method in ("segmenter", "grabcut"):
            rs = [c for c in clicks if c["method"] == method]
            notes.append(f"Click-to-outline on Medetec ({method}, fold 0's network, zero-shot): Dice per wound "
                         f"{np.mean([c['dice'] for c in rs]):.3f} over {len(rs)} wounds.")
        notes.append(f"CPU inference of a 512-px photo (2 flips at {sizes} px): {inference_seconds(seg, 1):.3f} s on 1 "
                     f"thread, {inference_seconds(seg, 2):.3f} s on 2.")
    return tables, claims, notes


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.segmentation_default`` job; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.segmentation_default", description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("all", "features", "fold", "score", "curve", "learning", "report"),
                   default="all",
                   help="score: re-score the saved fold networks in --work (test-time views changed, no training); "
                        "learning: a clinic's learning curve (--learning-sizes)")
    p.add_argument("--fuseg", type=Path, default=SHARED / "fuseg-dev")
    p.add_argument("--medetec", type=Path, default=SHARED / "medetec")
    p.add_argument("--work", type=Path, default=Path("/tmp/segmentation-default"),
                   help="folder for feature caches, fold networks and scores (outside the repository)")
    p.add_argument("--encoder", default="lite0", help="the frozen encoder (core.segmentation.model.ENCODERS)")
    p.add_argument("--augmented", type=int, default=PRETRAIN_AUGMENTED_VIEWS,
                   help=f"random views cached per fuseg-dev photo besides its 4 flips, the networks' training views "
                        f"(default {PRETRAIN_AUGMENTED_VIEWS}, the default's; 0: the flips alone)")
    p.add_argument("--views", choices=sorted(AUGMENTATIONS), default=PRETRAIN_AUGMENTATION,
                   help=f"the kind of --augmented views (default {PRETRAIN_AUGMENTATION}, the default's): strong (the "
                        "fuseg-dev ablation's rotated, scaled, colour-jittered crop) or close (a close-up crop holding "
                        "part of the wound)")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--fold", type=int, default=None, help="fold/curve: this fold only (default: every fold)")
    cli.add_epochs(p, PRETRAIN_EPOCHS)
    cli.add_seed(p)
    p.add_argument("--clinic", type=int, default=CLINIC_PHOTOS,
                   help=f"curve: Medetec photos a clinic fine-tunes on (default {CLINIC_PHOTOS})")
    p.add_argument("--clinic-views", type=int, default=AUGMENTED_VIEWS,
                   help=f"curve: close-ups cached per clinic photo besides its flips (default {AUGMENTED_VIEWS}, a "
                        "workspace run's)")
    p.add_argument("--clinic-set", choices=SETS, default="medetec",
                   help="curve: the clinic's photos, Medetec (default) or fuseg-dev's held-out fold (the default's "
                        "own outlining convention)")
    p.add_argument("--clinic-threshold", choices=("kept", "inner"), default="kept",
                   help="curve: kept (the fold network's, as a workspace run does; default) or also the one an inner "
                        "split of the clinic's photos chooses")
    p.add_argument("--clinic-lr", choices=(*CLINIC_LR_CHOICES, "inner"), default=CLINIC_LR,
                   help=f"curve: the clinic's fine-tune's learning rate (default {CLINIC_LR}, a workspace run's), or "
                        f"the one of {', '.join(CLINIC_LR_CHOICES)} an inner split of the clinic's photos chooses")
    p.add_argument("--clinic-tune", choices=TUNED_PARTS, default=FINE_TUNE,
                   help=f"curve: what the clinic's fine-tune trains: the decoder's head alone or the tuned stages and "
                        f"the whole decoder (all) (default {FINE_TUNE}, a workspace run's)")
    p.add_argument("--learning-sizes", type=int, nargs="+", default=list(LEARNING_SIZES),
                   help=f"learning: a clinic's numbers of photos (default {' '.join(map(str, LEARNING_SIZES))})")
    p.add_argument("--clinic-epochs", type=int, default=EPOCHS,
                   help=f"curve: epochs of the clinic's fine-tune (default {EPOCHS}, a workspace run's)")
    p.add_argument("--no-inner", action="store_true",
                   help="fold: no inner network, threshold 0.5 (the encoder comparison, half the training)")
    p.add_argument("--no-click", dest="click", action="store_false", help="report: skip clicks and timing")
    p.add_argument("--section", default="segmentation_default")
    p.add_argument("--results", type=Path, default=RESULTS_DIR)
    p.add_argument("--quiet", action="store_true")
    args = cli.parse_args(p, argv)
    for d in (args.fuseg, args.medetec):
        if not (d / "images").is_dir():
            p.error(f"{d}: no images/ folder")
    fixed = "inner" not in (args.clinic_lr, args.clinic_threshold)  # the learning curve's own setting
    if args.part == "learning" and not fixed:
        p.error("--part learning fine-tunes at a fixed rate and the kept threshold: leave --clinic-lr and "
                "--clinic-threshold at their defaults")
    folds = [args.fold] if args.fold is not None else list(range(args.folds))
    t0 = time.perf_counter()
    reused: list[str] = []

    def needed(path: Path) -> bool:  # ``all`` keeps what a ``--part`` process already wrote in --work
        if args.part == "all" and path.is_file():
            reused.append(path.name)
            return False
        return True

    with torch_threads(1):
        if args.part == "features" or (args.part == "all" and any([needed(cache_file(args, n)) for n in SETS])):
            features(args)
        for f in folds if args.part in ("all", "fold") else []:
            if needed(fold_file(args, "fold", f)):
                fold(args, f)
        for f in folds if args.part == "score" else []:
            rescore(args, f)
        for f in folds if args.part in ("all", "curve") else []:
            if needed(curve_file(args, f)):
                curve(args, f)
        for f in folds if args.part == "learning" or (args.part == "all" and fixed) else []:
            if needed(curve_file(args, f, "learning")):
                learning(args, f)
        if args.part not in ("all", "report"):
            return 0
        tables, claims, notes = report(args)
    if reused:
        notes.append(f"Reused from {args.work} (written by `--part features|fold|curve` processes, run in parallel): "
                     + ", ".join(sorted(reused)) + ".")
    print(render_tables(tables))
    print("\n".join(notes))
    path = write_result(args.section, "Wound segmentation: the default's recipe on photos it never saw",
                        command_line("benchmarks.segmentation_default", argv), [args.seed], tables, claims, notes,
                        synthetic=False, seconds=time.perf_counter() - t0, results_dir=args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
