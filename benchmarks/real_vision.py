"""Real wounds: TriDerm-V against its frozen backbone, scored on photos no training saw.

    python -m benchmarks.real_vision --data ../shared/data/azh-dev [--seeds 0 1 2] [--quick]

Any dataset folder in the product layout. Every seed draws one random patient-disjoint split into
``--folds`` (2) halves; a fold's model learns from the triplets that name no photo of the fold
(:mod:`core.vision.supervised`) and is scored under two protocols, pooled over folds and seeds:

- **strict** — all three photos of the triplet in the fold: no photo was seen by training (new
  patients; the headline of every row);
- **anchor unseen** — the anchor in the fold, both references photos training saw ("a new photo
  among the study's photos", the retrieval use case).

95 % CIs resample patients. Label-free rows fit what they fit (a centre, a self-supervised head)
on the training photos only. Rows: frozen EfficientNet-Lite0 (old and new tokens, mean pooling;
centred unit length with the centre of the training photos; centred on each photo batch's own
mean; averaged over the inference view and the photo's augmented views — test-time views; averaged
over two input sizes — multi-scale); TriDerm-V self-supervised (real-data default); the linear metric; TriDerm-V
``--supervise triplets``; the last stage + head of the backbone fine-tuned on the triplets
(:mod:`core.vision.finetune`); and **nested selection** — the method (frozen centred, linear metric,
metric head, fine-tuned last stage) and the weight of its fusion with the frozen centred distances chosen by an inner
patient-disjoint 2-fold CV on the training fold's own triplets (strict inner score), so the
outer fold that reports it is never used to choose. A second table trains on one fixed patient
half and scores strict on the other, both ways (cross-half transfer).

Paired tests compare rows over patients on the strict records (each patient's mean anchor
accuracy). Features are extracted once (the cache, seed 0's views) and shared by every seed.
Without triplets (e.g. Medetec) only the costs are measured. Writes ``results/<section>.json``.
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from benchmarks.results import RESULTS_DIR, write_result
from core import cli
from core.eval.distances import pairwise_euclidean
from core.eval.formatting import agreement_text
from core.eval.protocol import (
    PROTOCOLS,
    Fold,
    cross_validate,
    fold_rows,
    oriented_expert,
    patient_of,
    patient_paired_test,
    protocol_summary,
    score_folds,
    split_triplets,
)
from core.runtime import torch_threads
from core.vision.backbones import load_backbone
from core.vision.baseline import image_means, mean_pooled, normalized
from core.vision.features import FeatureCache, PhotoFeatures, TokenBank, workspace_wounds, wound_tokens
from core.vision.finetune import FineTuneConfig, LastStageTuner
from core.vision.pooling import MeanPooling
from core.vision.supervised import LinearMetric, fused_distances
from core.vision.triderm import TriDermTrainer
from core.vision.triderm_config import DEFAULT, TriDermConfig

SEARCH_LOG = Path(__file__).with_name("real_vision_search.md")
#: weights of the learned distances in the nested search's fusion with the frozen centred ones
FUSION_WEIGHTS = (0.25, 0.5, 0.75, 1.0)
#: the learned methods of the nested search (:meth:`Methods.distances`)
LEARNED = ("linear", "head", "finetune")
#: the fixed patient split of the cross-half table (a seed no seed of the folds uses by default)
CROSS_HALF_SEED = 1000
FROZEN = "frozen, new tokens, mean pooling, centred unit length (centre of the training photos)"
LINEAR = "linear metric on frozen new tokens"
NESTED = "nested selection: method × fusion weight chosen by inner CV on the training fold"
#: input sizes averaged by the multi-scale row (the backbone's own first)
SCALES = (224, 320)
VIEWS_ROW = "frozen, new tokens, mean over the inference view and the augmented views (test-time views), centred"
FINETUNE = ("last stage + head of the backbone fine-tuned on the triplets (stage 7 + conv head, augmented views; "
            "test-time views)")
SCALES_ROW = f"frozen, new tokens, mean over {' and '.join(map(str, SCALES))}-px inputs (multi-scale), centred"
LEGEND = "Cells read balanced % [95 % CI, resampling patients], records pooled over folds and seeds."


def peak_rss_mb() -> float:
    """The process's peak resident memory in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def configurations_tried() -> tuple[int, int]:
    """Configurations tried on real data before the defaults were frozen (the search log): the
    self-supervised recipe's (table rows) and the supervised mode's (bullets of its section and
    of every later section)."""
    text = SEARCH_LOG.read_text()
    recipe, _, supervised = text.partition("## Supervised mode")
    rows = sum(1 for line in recipe.splitlines() if line.startswith("| ") and "---" not in line) - 1
    return rows, sum(1 for line in supervised.splitlines() if line.startswith("- "))


class Bench:
    """One dataset in a workspace: photos, triplets, patients, and every row's scored records."""

    def __init__(self, ws: Workspace, folds: int, progress: bool) -> None:
        self.ws, self.k, self.progress = ws, folds, progress
        self.image_ids, self.keys = workspace_wounds(ws)
        self.triplets = oriented_expert(ws, self.image_ids)
        self.patients = patient_of(ws.store.images())
        self.rows: dict[str, dict[str, Any]] = {}

    def split(self, seed: int, k: int | None = None) -> list[np.ndarray]:
        """One random patient-disjoint split into ``k`` (``--folds``) folds, as photo rows."""
        return fold_rows(self.image_ids, self.patients, k or self.k, seed)

    def record(self, name: str, fn: Callable[[], list[Fold] | None]) -> list[Fold] | None:
        """Time ``fn`` (its folds, or None without triplets) and keep its scored records."""
        t0 = time.perf_counter()
        folds = fn()
        row = self.rows.setdefault(name, {"records": {p: [] for p in PROTOCOLS}, "seconds": []})
        row["seconds"].append(time.perf_counter() - t0)
        row["peak_rss_mb"] = peak_rss_mb()
        if folds is not None:
            for p, rec in score_folds(self.triplets, folds).items():
                row["records"][p].append(rec)
        return folds

    def summary(self, name: str, protocol: str) -> dict[str, Any]:
        """The agreement summary of method ``name`` under ``protocol`` over its folds' records."""
        recs = self.rows[name]["records"][protocol]
        return protocol_summary(np.concatenate(recs) if recs else np.zeros((0, 2), np.int64), self.image_ids,
                                self.patients)

    def strict_table(self, data: Path, columns: list[str], rows: list[list]) -> dict[str, Any]:
        """The result table of ``rows`` (first two value columns strict and anchor unseen), captioned with the
        dataset's triplets, photos, patients and folds."""
        n_pat = len({self.patients[i] for i in self.image_ids})
        return {"caption": f"Balanced agreement (%) with the {len(self.triplets)} triplets of {Path(data).name}, "
                           f"{len(self.image_ids)} photos, {n_pat} patients; one random split into {self.k} "
                           "patient-disjoint folds per seed. strict: all three photos unseen by training (the "
                           "headline); anchor unseen: a new photo among photos training saw",
                "columns": columns, "rows": rows, "legend": LEGEND}


def frozen_bank(ws: Workspace, layer: str, keys: list, image_ids: list, views: int, progress: bool) -> TokenBank:
    """The frozen backbone's cached tokens (views drawn with seed 0, shared by every seed)."""
    backbone = load_backbone("efficientnet-lite0", layer=layer)
    photos = FeatureCache(ws, backbone, seed=0).build(image_ids, views, progress)
    with torch_threads(1):
        return TokenBank(photos, keys)


def stage6_photos(ws: Workspace, image_ids: list, views: int, progress: bool) -> list[PhotoFeatures]:
    """The frozen stage-6 features of the photos, in row order (the fine-tuned stage's input)."""
    photos = FeatureCache(ws, load_backbone("efficientnet-lite0", layer="stage6"), seed=0).build(
        image_ids, views, progress)
    return [photos[i] for i in image_ids]


def frozen_embedding(bank: TokenBank) -> np.ndarray:
    """The frozen backbone's embedding: each photo's mean of its wounds' mean tokens."""
    return mean_pooled(bank)[2]


def view_averaged(bank: TokenBank) -> np.ndarray:
    """Each photo's mean of its wounds' embeddings, a wound's the mean over its inference view and every
    augmented view it appears in (the cached views as test-time views)."""
    pool, wounds = MeanPooling(), torch.arange(len(bank))
    with torch.no_grad():
        total = pool(bank.eval_tokens, bank.eval_segment, len(bank))[0]
        count = torch.ones(len(bank), 1)
        for v in range(bank.n_views):
            present = wounds[bank.valid[:, v]]
            tokens, segment = bank.gather(present, torch.full_like(present, v))
            total[present] += pool(tokens, segment, len(present))[0]
            count[present] += 1
    return image_means(bank.wound_keys, (total / count).numpy())[1]


def scaled_embedding(ws: Workspace, keys: list[tuple[str, int]], image_ids: list[str], size: int) -> np.ndarray:
    """Each photo's mean of its wounds' mean tokens, the photo resized to ``size`` × ``size`` px (the frozen
    backbone is fully convolutional: a larger input gives a finer token grid)."""
    backbone = load_backbone("efficientnet-lite0", layer="full")
    wounds: dict[str, list[int]] = {}
    for image_id, w in keys:
        wounds.setdefault(image_id, []).append(w)
    out = []
    with torch.no_grad(), torch_threads(1):
        for image_id in image_ids:
            photo = np.asarray(ws.load_image(image_id).convert("RGB").resize((size, size), resample=2))
            x = torch.from_numpy(photo.copy()).permute(2, 0, 1).float()[None] / 255.0
            feat = backbone(backbone.normalize(x))[0]
            grid = (feat.shape[-2], feat.shape[-1])
            tokens = wound_tokens(ws.load_mask(image_id), wounds[image_id], grid)
            out.append(torch.stack([feat.flatten(1)[:, t].mean(1) for t in tokens]).mean(0).numpy())
    return np.stack(out)


def batch_centred(emb: np.ndarray, test_rows: np.ndarray) -> np.ndarray:
    """Unit-length rows, the training photos centred on their mean and the fold's new photos on
    theirs (a new batch of photos centred on itself when it is embedded)."""
    z = emb.copy()
    train = np.setdiff1d(np.arange(len(emb)), test_rows)
    for rows in (train, test_rows):
        z[rows] -= z[rows].mean(0)
    return z / np.linalg.norm(z, axis=1, keepdims=True).clip(min=1e-12)


class Methods:
    """The supervised methods' distances for a set of training triplets and photos, memoised (the
    nested search's final fit of a method is the fixed row's fit of the same fold)."""

    def __init__(self, b: Bench, bank: TokenBank, frozen: np.ndarray, supervised: TriDermConfig,
                 tuner: LastStageTuner | None) -> None:
        self.b, self.bank, self.frozen, self.supervised, self.tuner = b, bank, frozen, supervised, tuner
        self.cache: dict[tuple, np.ndarray] = {}
        self.chosen: list[str] = []
        self.scored = 0

    def distances(self, method: str, triplets: np.ndarray, fit_rows: np.ndarray, seed: int) -> np.ndarray:
        """n×n distances of ``method`` (``frozen``, ``linear``, ``head``, ``finetune``; ``finetune-inference``: the
        same fit's inference view alone) fitted on ``triplets`` and the photos ``fit_rows`` only."""
        if method == "frozen":
            return pairwise_euclidean(normalized(self.frozen, "center-l2", fit_rows)[0])
        key = (method, seed, triplets.tobytes(), fit_rows.tobytes())
        if key not in self.cache:
            if method == "linear":
                z = LinearMetric(random_state=seed).fit(self.frozen, triplets).transform(self.frozen)
            elif method in ("finetune", "finetune-inference"):  # one fit gives both embeddings
                assert self.tuner is not None  # rows with triplets only
                fitted = self.tuner.fit(triplets, fit_rows, seed)
                for name, views in (("finetune", None), ("finetune-inference", False)):
                    self.cache[(name, *key[1:])] = pairwise_euclidean(fitted.transform(views))
                return self.cache[key]
            else:
                trainer = TriDermTrainer(self.bank, replace(self.supervised, seed=seed), torch.device("cpu"),
                                         self.b.image_ids)
                z = trainer.embed(trainer.fit(fit_rows, triplets)[0], fit_rows)[1]
            self.cache[key] = pairwise_euclidean(z)
        return self.cache[key]

    def fixed(self, method: str, seed: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """``fit_fold`` of one method with its fixed recipe."""
        return lambda train, test_rows: self.distances(method, train, self.others(test_rows), seed)

    def others(self, rows: np.ndarray) -> np.ndarray:
        """The photos not in ``rows``."""
        return np.setdiff1d(np.arange(len(self.b.image_ids)), rows)

    def nested(self, seed: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """``fit_fold`` of the nested search: on the training fold alone, an inner patient-disjoint
        2-fold split scores every candidate (frozen centred; linear metric, metric head or fine-tuned last
        stage fused with the frozen centred distances at each weight of :data:`FUSION_WEIGHTS`) on its strict inner
        triplets; the best is refitted on the whole training fold. An inner fold without training
        triplets (tiny data) leaves the frozen candidate only."""
        def fit_fold(train: np.ndarray, test_rows: np.ndarray) -> np.ndarray:
            fit_rows = self.others(test_rows)
            inner = fold_rows(self.b.image_ids, self.b.patients, 2, seed + 1, among=fit_rows)
            learnable = all(split_triplets(train, rows)[0].any() for rows in inner)  # else: frozen only
            learned = LEARNED if learnable else ()
            candidates = [("frozen", 0.0)] + [(m, w) for m in learned for w in FUSION_WEIGHTS]
            per_method = {m: cross_validate([inner], train, lambda tr, rows, m=m: self.distances(
                m, tr, np.setdiff1d(fit_rows, rows), seed)) for m in ("frozen", *learned)}
            scores = []
            for m, w in candidates:
                folds = [(rows, fused_distances(frozen_d, learned, w, np.setdiff1d(fit_rows, rows)))
                         for (rows, frozen_d), (_, learned) in zip(per_method["frozen"], per_method[m])]
                rec = score_folds(train, folds)["strict"]
                scores.append(protocol_summary(rec, self.b.image_ids, self.b.patients, n_boot=1)["balanced"] or 0.0)
            self.scored += len(candidates)
            m, w = candidates[int(np.argmax(scores))]  # ties: the first, the simpler
            self.chosen.append(f"{m} {w:g}")
            return fused_distances(self.distances("frozen", train, fit_rows, seed),
                                   self.distances(m, train, fit_rows, seed), w, fit_rows)

        return fit_fold


def run(args: argparse.Namespace, ws: Workspace) -> dict[str, Any]:
    """Run every method on the workspace's folds; returns the bench and its records."""
    b = Bench(ws, args.folds, not args.quiet)
    has_triplets = len(b.triplets) > 0
    ssl = replace(DEFAULT, **({"epochs": 5} if args.quick else {}))
    supervised = replace(DEFAULT, supervise="triplets", **({"supervise_steps": 30} if args.quick else {}))
    skipped: dict[str, str] = {}
    if not has_triplets:
        skipped["agreement and supervised rows"] = (f"{args.data} has no triplets: nothing to agree with, and no "
                                                    "judgments to learn from; only costs are measured")
    stage5 = frozen_bank(ws, "stage5", b.keys, b.image_ids, 0, b.progress)
    full = frozen_bank(ws, "full", b.keys, b.image_ids, args.views, b.progress)
    image_order, frozen = mean_pooled(full)[1:]
    if image_order != b.image_ids:  # every row's embedding is indexed by the bench's photo rows
        raise RuntimeError("the token bank's photo order differs from the workspace's")
    views_emb = view_averaged(full)
    scales_emb = np.mean([frozen if size == SCALES[0] else scaled_embedding(ws, b.keys, b.image_ids, size)
                          for size in SCALES], axis=0)
    tune = FineTuneConfig(steps=10) if args.quick else FineTuneConfig()
    tuner = (LastStageTuner(load_backbone("efficientnet-lite0", layer="stage6"),
                            stage6_photos(ws, b.image_ids, args.views, b.progress), tune) if has_triplets else None)
    methods = Methods(b, full, frozen, supervised, tuner)

    heads = supervised.supervise_heads
    head_name = f"TriDerm-V --supervise triplets ({heads} metric head{'s' * (heads > 1)}, mean pooling, augmented views)"
    ssl_name = "TriDerm-V self-supervised, real-data default (trained on the training photos, no labels)"
    for seed in tqdm(args.seeds, desc="seeds", unit="seed", disable=args.quiet):
        split = [b.split(seed)]

        def cv(fit_fold: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> list[Fold] | None:
            return cross_validate(split, b.triplets, fit_fold) if has_triplets else None

        def constant(D: np.ndarray) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
            return lambda train, rows: D

        def ssl_fold(train: np.ndarray, rows: np.ndarray) -> np.ndarray:
            trainer = TriDermTrainer(full, replace(ssl, seed=seed), torch.device("cpu"), b.image_ids)
            fit_rows = methods.others(rows)
            return pairwise_euclidean(trainer.embed(trainer.fit(fit_rows)[0], fit_rows)[1])

        b.record("frozen, old tokens (stage 5), mean pooling", lambda: cv(constant(pairwise_euclidean(
            frozen_embedding(stage5)))))
        b.record("frozen, new tokens (full, OS 16), mean pooling", lambda: cv(constant(pairwise_euclidean(frozen))))
        b.record(FROZEN, lambda: cv(methods.fixed("frozen", seed)))
        b.record("frozen, new tokens, each photo batch centred on its own mean, unit length",
                 lambda: cv(lambda train, rows: pairwise_euclidean(batch_centred(frozen, rows))))
        for name, emb in ((VIEWS_ROW, views_emb), (SCALES_ROW, scales_emb)):
            b.record(name, lambda emb=emb: cv(lambda train, rows: pairwise_euclidean(
                normalized(emb, "center-l2", methods.others(rows))[0])))

        def ssl_row() -> list[Fold] | None:
            if has_triplets:
                return cv(ssl_fold)
            ssl_fold(b.triplets, np.arange(0))  # no triplets: the cost of training on every photo only
            return None

        b.record(ssl_name, ssl_row)
        if not has_triplets:
            continue
        b.record(LINEAR, lambda: cv(methods.fixed("linear", seed)))
        b.record(head_name, lambda: cv(methods.fixed("head", seed)))
        b.record(FINETUNE, lambda: cv(methods.fixed("finetune", seed)))
        b.record(NESTED, lambda: cv(methods.nested(seed)))
    cross: dict[str, list[Fold]] = {}
    if has_triplets:
        halves = b.split(CROSS_HALF_SEED, 2)
        seed = args.seeds[0]
        for name, fit_fold in ((FROZEN, methods.fixed("frozen", seed)), (LINEAR, methods.fixed("linear", seed)),
                               (head_name, methods.fixed("head", seed)), (FINETUNE, methods.fixed("finetune", seed)),
                               (NESTED, methods.nested(seed))):
            cross[name] = cross_validate([halves], b.triplets, fit_fold)
    return {"bench": b, "skipped": skipped, "cross": cross, "methods": methods, "head_name": head_name, "tune": tune}


def cell(s: dict[str, Any]) -> dict[str, Any] | None:
    """A table cell: balanced % with its patient-bootstrap 95 % CI (no sd: one pooled estimate)."""
    if s["balanced"] is None:
        return None
    return {"mean": 100 * s["balanced"], "sd": None, "ci": [100 * s["ci"][0], 100 * s["ci"][1]]}


def compare(b: Bench, a: str, base: str, claim: str) -> dict[str, Any] | None:
    """Paired test over patients on the strict records of rows ``a`` and ``base``."""
    if a not in b.rows or base not in b.rows or not b.rows[a]["records"]["strict"]:
        return None
    return patient_claim(b.summary(a, "strict"), b.summary(base, "strict"), b.patients, claim)


def patient_claim(sa: dict[str, Any], sb: dict[str, Any], patients: dict[str, str], claim: str) -> dict[str, Any]:
    """Claim "a > b" judged by a paired t-test over patients on two strict summaries (:func:`protocol_summary`)."""
    t = patient_paired_test([{"anchor": k, "accuracy": v} for k, v in sa["per_anchor"].items()],
                            [{"anchor": k, "accuracy": v} for k, v in sb["per_anchor"].items()], patients)
    p = t["t_p"] if np.isfinite(t["t_p"]) else 1.0  # identical per-patient figures: no difference
    holds = t["mean_diff"] > 0 and p < 0.05
    return {"claim": claim, "test": f"strict, mean difference {100 * t['mean_diff']:+.1f} pp; paired t-test over "
                                    f"{t['n_patients']} patients, Wilcoxon p = {t['wilcoxon_p']:.2g}",
            "p": p, "holds": bool(holds)}


def report(args: argparse.Namespace, out: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The result record: tables and claims from the bench's records, with the time taken."""
    b: Bench = out["bench"]
    rows = []
    for name, r in b.rows.items():
        strict, anchor = b.summary(name, "strict"), b.summary(name, "anchor_unseen")
        rows.append([name, cell(strict), cell(anchor), strict["n"], round(float(np.mean(r["seconds"])), 1),
                     round(r["peak_rss_mb"])])
    head_name = out["head_name"]
    claims = [c for c in (
        compare(b, NESTED, FROZEN, "nested selection beats the frozen centred embedding (strict)"),
        compare(b, head_name, FROZEN, "the supervised mode beats the frozen centred embedding (strict)"),
        compare(b, LINEAR, FROZEN, "the linear metric beats the frozen centred embedding (strict)"),
        compare(b, head_name, LINEAR, "the supervised mode beats the linear metric (strict)"),
        compare(b, "TriDerm-V self-supervised, real-data default (trained on the training photos, no labels)",
                FROZEN, "the self-supervised default beats the frozen centred embedding (strict)"),
        compare(b, "frozen, new tokens, each photo batch centred on its own mean, unit length", FROZEN,
                "centring new photos on their own batch beats the training photos' centre (strict)"),
        compare(b, FINETUNE, FROZEN, "fine-tuning the last stage beats the frozen centred embedding (strict)"),
        compare(b, FINETUNE, LINEAR, "fine-tuning the last stage beats the linear metric (strict)"),
        compare(b, FINETUNE, head_name, "fine-tuning the last stage beats the supervised mode (strict)"),
        compare(b, VIEWS_ROW, FROZEN, "test-time views beat the inference view alone (frozen centred, strict)"),
        compare(b, SCALES_ROW, FROZEN, "multi-scale inputs beat the backbone's own size (frozen centred, strict)"),
    ) if c is not None]
    cross_rows = []
    for name, folds in out["cross"].items():
        for (rows_, D), direction in zip(folds, ("half A → half B", "half B → half A")):
            rec = score_folds(b.triplets, [(rows_, D)])["strict"]
            s = protocol_summary(rec, b.image_ids, b.patients)
            cross_rows.append([name, direction, cell(s), s["n"]])
    methods: Methods = out["methods"]
    recipe, supervised = configurations_tried()
    notes = [f"{recipe} self-supervised recipe configurations and {supervised} supervised-mode configurations were "
             f"tried on azh-dev by hand before these defaults were frozen ({SEARCH_LOG.name}, which counts them); the "
             "rows above are the frozen defaults' final run."]
    if methods.chosen:
        counts = {c: methods.chosen.count(c) for c in sorted(set(methods.chosen))}
        notes.append(f"nested selection scored {methods.scored} candidate configurations on inner folds (frozen "
                     f"centred, and each of {', '.join(LEARNED)} fused at weights "
                     f"{', '.join(map(str, FUSION_WEIGHTS))}: up to {1 + len(LEARNED) * len(FUSION_WEIGHTS)} per "
                     "outer fold, never on the outer test fold) and chose: "
                     + ", ".join(f"{c} ({n}×)" for c, n in counts.items())
                     + " (method and weight of the learned distances in the fusion with the frozen centred ones)")
        notes.append(f"with {args.folds} patient folds only ~1/{args.folds ** 2} of the triplets have all three "
                     "photos in one fold: few, large folds keep the strict set big; each seed is one more random "
                     "patient split, and the records of every fold and seed are pooled per anchor")
    if FINETUNE in b.rows:
        tune = out["tune"]
        notes.append(f"fine-tuning (one fixed configuration, chosen before it was run, not searched): {tune.steps} "
                     f"AdamW steps at {tune.lr:g} (cosine), hinge margin {tune.margin:g} on unit-length centred "
                     f"embeddings, {tune.batch_triplets} training triplets per step, every training photo through a "
                     "random cached view at each step; batch-norm statistics stay ImageNet's")
    notes += [f"skipped {k}: {v}" for k, v in out["skipped"].items()]
    if args.quick:
        notes.append(f"--quick: 5 training epochs, 30 metric-head steps, {FineTuneConfig(steps=10).steps} "
                     "fine-tuning steps, 4 views, one seed; not a result")
    elif args.views != DEFAULT.views:
        notes.append(f"--views {args.views}: the metric head and the self-supervised head drew their augmented views "
                     f"from {args.views} cached views per photo, not the product's {DEFAULT.views} (the CPU "
                     "budget of this run)")
    command = " ".join(["python -m benchmarks.real_vision --data", str(args.data),
                        *([f"--seeds {' '.join(map(str, args.seeds))}"] if args.seeds != [0, 1, 2] else []),
                        *([f"--views {args.views}"] if args.views != DEFAULT.views and not args.quick else []),
                        *([f"--section {args.section}"] if args.section != "real_vision" else []),
                        *(["--quick"] if args.quick else [])])
    tables = [b.strict_table(args.data, ["row", "strict %", "anchor unseen %", "strict triplets scored",
                                         "seconds / seed", "peak RSS MB"], rows)]
    if cross_rows:
        tables.append({"caption": "Cross-half transfer: trained on one fixed patient half, scored strict on the "
                                  "other (first seed)", "columns": ["row", "direction", "strict %", "triplets"],
                       "rows": cross_rows, "legend": LEGEND})
    return {"section": args.section, "title": f"Real wounds: TriDerm-V vs its frozen backbone ({Path(args.data).name})",
            "command": command, "seeds": list(args.seeds), "tables": tables, "claims": claims, "notes": notes,
            "synthetic": False, "seconds": seconds}


def print_report(res: dict[str, Any]) -> None:
    """Print the result's tables as text."""
    for table in res["tables"]:
        print(f"\n{table['caption']}")
        for row in table["rows"]:
            cells = []
            for c in row:
                if isinstance(c, dict):
                    cells.append(agreement_text(c["mean"], c["ci"], scale=1))
                else:
                    cells.append("n/a" if c is None else str(c))
            print("  " + " | ".join(cells))
    for c in res["claims"]:
        verdict = "holds" if c["holds"] else "does not hold"
        print(f"- {c['claim']}: {verdict} (p = {c['p']:.3g}; {c['test']})")
    for n in res["notes"]:
        print(f"note: {n}")
    print(f"{res['seconds']:.0f} s wall")


def add_dataset_options(p: argparse.ArgumentParser, section: str | None) -> None:
    """The options every real-data benchmark shares after its own: --folds, --workspace, --section, --results,
    --quiet (``--data`` comes first, from the caller; a None section is the caller's to choose after parsing)."""
    p.add_argument("--folds", type=int, default=2, help="patient-disjoint folds per random split (default 2)")
    cli.add_workspace(p, type=Path, help="reuse this workspace (and its feature cache)")
    p.add_argument("--section", default=section)
    p.add_argument("--results", type=Path, default=RESULTS_DIR)
    p.add_argument("--quiet", action="store_true")


@contextmanager
def dataset_workspace(args: argparse.Namespace, prefix: str) -> Iterator[Workspace]:
    """``--workspace``, or a temporary one (removed on exit), holding ``--data`` imported when it has no photo yet."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        ws = Workspace(args.workspace or Path(tmp) / "ws")
        if not ws.store.images():
            import_dataset(ws, args.data)
        yield ws


def check_dataset(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (exit 2) a --data folder without images/ and fewer than 2 --folds."""
    if not (args.data / "images").is_dir():
        p.error(f"--data {args.data}: no images/ folder (expected the product's dataset layout)")
    if args.folds < 2:
        p.error(f"--folds must be at least 2, got {args.folds}")


def run_on_dataset(p: argparse.ArgumentParser, args: argparse.Namespace, prefix: str,
                   run: Callable[[argparse.Namespace, Workspace], dict[str, Any]],
                   report: Callable[[argparse.Namespace, dict[str, Any], float], dict[str, Any]]) -> int:
    """Run a real-data benchmark on ``--data`` (:func:`dataset_workspace`; refused without wounds) on one thread,
    print its report and write its result file; returns the exit status."""
    t0 = time.perf_counter()
    with dataset_workspace(args, prefix) as ws:
        if not workspace_wounds(ws)[1]:
            p.error(f"--data {args.data}: no wounds")
        # many small ops: one thread is fastest on a CPU (and does not spin against a shared machine's load)
        with torch_threads(1):
            res = report(args, run(args, ws), time.perf_counter() - t0)
    print_report(res)
    print(f"→ {write_result(results_dir=args.results, **res)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.real_vision`` benchmark; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_vision", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="a dataset folder in the product layout")
    cli.add_seeds(p)
    cli.add_device(p)
    p.add_argument("--views", type=int, default=DEFAULT.views)
    p.add_argument("--quick", action="store_true",
                   help="5 epochs, 30 metric-head steps, 4 views, one seed (a smoke run)")
    add_dataset_options(p, "real_vision")
    args = cli.parse_args(p, argv)
    check_dataset(p, args)
    if args.quick:
        args.seeds, args.views = args.seeds[:1], 4
    return run_on_dataset(p, args, "real-vision-", run, report)


if __name__ == "__main__":
    raise SystemExit(main())
