"""The evaluation protocol: how every learned embedding is scored against the expert (one home for it).

**Patients.** Photos of one patient are not independent: :func:`patient_of` maps a photo to its
``patient_id``, or to ``photo:<image_id>`` (its own patient) when it has none. Every split, interval
and test below goes by patient.

**Oriented triplets.** A store row (anchor, ref_j, ref_k, choice) becomes ``[anchor, chosen, other]``
row indices (:func:`oriented_triplets`; skips and rows naming a photo outside the index dropped);
:func:`oriented_expert` does so for the expert's rows.

**Patient-disjoint folds.** The patients are dealt into K folds (:func:`patient_folds`), repeated over
several random splits (:func:`repeated_folds`). A fold's model trains on the triplets that name no photo
of the fold (:func:`cross_validate`) and is scored (:func:`split_triplets`, :func:`score_folds`) on

- *strict* — triplets whose three photos are all in the fold: no photo was seen by training, the
  headline figure of every learned embedding (new patients);
- *anchor unseen* — the anchor in the fold, both references outside it (photos training saw):
  "a new photo among the study's photos", the retrieval use case, reported as its own row.

Triplets with one reference in the fold are in neither. With K folds only about 1/K² of the triplets
are strict, so the defaults use few, large folds (2) repeated over random splits.

**Patient bootstrap.** Balanced agreement pools every fold's records per anchor
(:func:`protocol_summary`); its 95 % CI resamples *patients* with replacement, each keeping all its
anchors (:func:`patient_bootstrap_ci`): resampling anchors would make the interval too narrow.

**Paired tests.** Two methods on the same folds are compared over patients
(:func:`patient_paired_test`: each patient's mean anchor accuracy, paired t and Wilcoxon signed-rank on
the differences); :func:`versus_frozen` pairs a run with the frozen centred embedding that way, and
:func:`strict_cv_metrics` is what a trained run records. Claims over matched runs (seeds) use the
one-sided paired t-test of :func:`paired_claim`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from annotations.infra.workspace import Workspace

def patient_of(images: Sequence[dict[str, Any]]) -> dict[str, str]:
    """image_id → patient (the photo itself when it has no ``patient_id``)."""
    return {im["image_id"]: im.get("patient_id") or f"photo:{im['image_id']}" for im in images}


def oriented_triplets(rows: Iterable[Mapping[str, Any]], index: Mapping[str, int]) -> np.ndarray:
    """(m, 3) ``[anchor, chosen, other]`` index triplets of store rows (``index``: image id → row), in the rows'
    order; skips and rows naming a photo outside ``index`` dropped."""
    out = []
    for r in rows:
        if r["choice"] not in ("j", "k") or not {r["anchor"], r["ref_j"], r["ref_k"]} <= index.keys():
            continue
        chosen, other = (r["ref_j"], r["ref_k"]) if r["choice"] == "j" else (r["ref_k"], r["ref_j"])
        out.append((index[r["anchor"]], index[chosen], index[other]))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def oriented_expert(ws: Workspace, image_ids: Sequence[str]) -> np.ndarray:
    """The expert's non-skip triplets over ``image_ids`` as rows ``[i, chosen, other]`` (:func:`oriented_triplets`)."""
    return oriented_triplets(ws.store.expert_triplets(), {i: n for n, i in enumerate(image_ids)})


def patient_folds(image_ids: Sequence[str], patients: dict[str, str], k: int, seed: int = 0) -> list[list[str]]:
    """Deal the patients of ``image_ids`` into ``k`` folds of about equal photo counts (largest
    patients first, each to the currently smallest fold, ties broken by a seeded shuffle)."""
    groups: dict[str, list[str]] = {}
    for i in image_ids:
        groups.setdefault(patients[i], []).append(i)
    if k < 2:
        raise ValueError(f"--cv needs at least 2 folds, got {k}")
    if k > len(groups):
        raise ValueError(f"--cv {k} is larger than the number of patients ({len(groups)})")
    order = list(groups)
    np.random.default_rng(seed).shuffle(order)
    order.sort(key=lambda p: -len(groups[p]))
    folds: list[list[str]] = [[] for _ in range(k)]
    for p in order:
        min(folds, key=len).extend(groups[p])
    return [sorted(f) for f in folds]


def fold_rows(image_ids: Sequence[str], patients: dict[str, str], k: int, seed: int = 0,
              among: Sequence[int] | None = None) -> list[np.ndarray]:
    """:func:`patient_folds` of the photos ``image_ids`` (or of its rows ``among`` only), as row indices of
    ``image_ids``."""
    row = {i: n for n, i in enumerate(image_ids)}
    ids = image_ids if among is None else [image_ids[r] for r in among]
    return [np.array([row[i] for i in fold]) for fold in patient_folds(ids, patients, k, seed)]


def repeated_folds(image_ids: Sequence[str], patients: dict[str, str], k: int, repeats: int,
                   seed: int = 0) -> list[list[np.ndarray]]:
    """``repeats`` random patient-disjoint splits into ``k`` folds (seeds ``seed``, ``seed + 1``, …), as row
    indices of ``image_ids`` (:func:`fold_rows`)."""
    if repeats < 1:
        raise ValueError(f"need at least 1 repeat of the folds, got {repeats}")
    return [fold_rows(image_ids, patients, k, seed + r) for r in range(repeats)]


def split_triplets(triplets: np.ndarray, test_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean (train, strict, anchor-unseen) masks over oriented triplets ``[i, j, k]`` for a fold
    whose photos are the row indices ``test_rows``: train = no photo of the fold; strict = all three
    photos in the fold; anchor-unseen = the anchor in the fold, both references outside it."""
    in_fold = np.isin(triplets, test_rows)
    # numpy's stubs type .any/.all over an axis as "scalar or array" (shape unknown); these are 1-D arrays
    return ~in_fold.any(1), in_fold.all(1), in_fold[:, 0] & ~in_fold[:, 1:].any(1)  # type: ignore[return-value]


def subsample(triplets: np.ndarray, n: int | None, seed: int) -> np.ndarray:
    """``n`` triplets drawn without replacement (all when ``n`` is None or too large)."""
    if n is None or n >= len(triplets):
        return triplets
    return triplets[np.sort(np.random.default_rng(seed).choice(len(triplets), n, replace=False))]


#: a fold's result: (its photos' rows, the n×n distances of the model trained without them)
Fold = tuple[np.ndarray, np.ndarray]


def cross_validate(splits: Sequence[Sequence[np.ndarray]], triplets: np.ndarray,
                   fit_fold: Callable[[np.ndarray, np.ndarray], np.ndarray], budget: int | None = None,
                   seed: int = 0, progress: Callable[[int], None] | None = None) -> list[Fold]:
    """Every fold of every split (rows of each fold's photos): ``fit_fold(train_triplets, test_rows)``
    returns the fold model's n×n distances; ``budget`` caps the training triplets of each fold."""
    out: list[Fold] = []
    for rows in (r for split in splits for r in split):
        train, _, _ = split_triplets(triplets, rows)
        out.append((rows, fit_fold(subsample(triplets[train], budget, seed + len(out)), rows)))
        if progress is not None:
            progress(len(out) - 1)
    return out


PROTOCOLS = ("strict", "anchor_unseen")


def score_folds(triplets: np.ndarray, folds: Sequence[Fold]) -> dict[str, np.ndarray]:
    """Protocol → (m, 2) records ``[anchor row, correct]``: every fold's strict and anchor-unseen
    triplets scored with that fold's distances (correct: the chosen reference strictly closer)."""
    out: dict[str, list[np.ndarray]] = {p: [] for p in PROTOCOLS}
    for rows, D in folds:
        _, strict, anchor = split_triplets(triplets, rows)
        for name, mask in zip(PROTOCOLS, (strict, anchor)):
            i, j, k = triplets[mask].T
            out[name].append(np.stack([i, (D[i, j] < D[i, k]).astype(np.int64)], 1))
    return {p: np.concatenate(v) if v else np.zeros((0, 2), np.int64) for p, v in out.items()}


def strict_tallies(triplets: np.ndarray, folds: Sequence[Fold]) -> np.ndarray:
    """(m, 5) rows ``[i, j, k, correct, scored]`` of the oriented triplets scored strictly in at least one fold
    (all three photos in the fold): how often the fold's distances put the chosen ``j`` strictly closer, of
    how often the triplet was scored over folds and splits; the records a paired comparison with another
    run on common triplets needs (:mod:`core.eval.verdict`)."""
    correct = np.zeros(len(triplets), np.int64)
    scored = np.zeros(len(triplets), np.int64)
    for rows, D in folds:
        _, strict, _ = split_triplets(triplets, rows)
        i, j, k = triplets[strict].T
        scored[strict] += 1
        correct[strict] += (D[i, j] < D[i, k]).astype(np.int64)
    keep = scored > 0
    return np.concatenate([triplets[keep], correct[keep, None], scored[keep, None]], 1)


def protocol_summary(records: np.ndarray, image_ids: Sequence[str], patients: dict[str, str],
                     n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Balanced agreement of ``records`` (:func:`score_folds`; an anchor's accuracy pools all its
    records over folds and splits) with its patient-bootstrap 95 % CI, the counts, and
    ``per_anchor`` (image id → accuracy) for paired tests."""
    if not len(records):
        return {"balanced": None, "ci": None, "n": 0, "n_anchors": 0, "n_patients": 0, "per_anchor": {}}
    anchors, inv = np.unique(records[:, 0], return_inverse=True)
    acc = np.bincount(inv, weights=records[:, 1].astype(float)) / np.bincount(inv)
    per_anchor = {image_ids[a]: float(x) for a, x in zip(anchors, acc)}
    return {"balanced": float(acc.mean()), "ci": patient_bootstrap_ci(per_anchor, patients, n_boot, seed),
            "n": len(records), "n_anchors": len(anchors),
            "n_patients": len({patients[a] for a in per_anchor}), "per_anchor": per_anchor}


def out_of_fold(image_ids: Sequence[str], triplets: np.ndarray, folds: Sequence[Fold], patients: dict[str, str],
                n_boot: int = 1000, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Protocol (``strict``, ``anchor_unseen``) → balanced agreement with its patient-bootstrap CI,
    counts and per-anchor table (:func:`protocol_summary`)."""
    records = score_folds(triplets, folds)
    return {p: protocol_summary(records[p], image_ids, patients, n_boot, seed) for p in PROTOCOLS}


def stored(summary: dict[str, Any]) -> dict[str, Any]:
    """A protocol summary as a run's metrics keep it: without the per-anchor table."""
    return {k: v for k, v in summary.items() if k != "per_anchor"}


def versus_frozen(run_strict: dict[str, Any], image_ids: Sequence[str], triplets: np.ndarray,
                  base: Sequence[Fold], patients: dict[str, str], n_boot: int = 1000,
                  seed: int = 0) -> dict[str, Any]:
    """The frozen centred embedding on the run's folds, ``base`` (each fold's distances centred on the fold's
    training photos: :func:`core.vision.baseline.centred_folds`), scored strictly, and under ``paired`` the run
    (its strict :func:`out_of_fold` summary) minus it per patient (:func:`patient_paired_test`; with at least 2
    patients)."""
    ref = protocol_summary(score_folds(triplets, base)["strict"], image_ids, patients, n_boot, seed)
    out = stored(ref)
    rows = [[{"anchor": a, "accuracy": x} for a, x in s["per_anchor"].items()] for s in (run_strict, ref)]
    if len({patients[r["anchor"]] for r in rows[0]}) >= 2:
        out["paired"] = patient_paired_test(rows[0], rows[1], patients)
    return out


def strict_cv_metrics(image_ids: Sequence[str], triplets: np.ndarray, folds: Sequence[Fold],
                      frozen_folds: Sequence[Fold], patients: dict[str, str], k: int, repeats: int,
                      seed: int = 0) -> dict[str, Any]:
    """A run's ``metrics["cv"]`` from its out-of-fold ``folds`` (``repeats`` splits × ``k`` patient folds): the
    strict figure (no photo of a scored triplet seen by training), ``anchor_unseen``, ``frozen_centred``
    (:func:`versus_frozen` against ``frozen_folds``, the frozen centred embedding on the same folds) and
    ``per_triplet``: each strictly scored triplet as ``[anchor, chosen, other, correct, scored]`` image ids and
    counts (:func:`strict_tallies`)."""
    oof = out_of_fold(image_ids, triplets, folds, patients, seed=seed)
    return {"folds": k, "repeats": repeats, "split": "patient", "protocol": "strict", "ci_resamples": "patients",
            **stored(oof["strict"]), "anchor_unseen": stored(oof["anchor_unseen"]),
            "per_triplet": [[image_ids[i], image_ids[j], image_ids[k], int(c), int(n)]
                            for i, j, k, c, n in strict_tallies(triplets, folds)],
            "frozen_centred": versus_frozen(oof["strict"], image_ids, triplets, frozen_folds, patients,
                                            seed=seed)}


def patient_bootstrap_ci(per_anchor: Mapping[str, float], patients: Mapping[str, str], n_boot: int = 1000,
                         seed: int = 0, level: float = 0.95) -> list[float]:
    """Percentile CI of balanced agreement (the mean of ``per_anchor``: anchor → accuracy) from
    resampling *patients* with replacement, each keeping all its anchors — photos of one patient
    are not independent, so resampling anchors makes the interval too narrow."""
    if not per_anchor:
        return [float("nan")] * 2
    groups: dict[str, int] = {}
    member = np.array([groups.setdefault(patients[a], len(groups)) for a in per_anchor])
    acc = np.array(list(per_anchor.values()), dtype=np.float64)
    P = len(groups)
    w = np.random.default_rng(seed).multinomial(P, np.full(P, 1.0 / P), size=n_boot)[:, member].astype(np.float64)
    keep = w.sum(1) > 0
    boots = (w[keep] @ acc) / w[keep].sum(1)
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    return [float(v) for v in np.percentile(boots, q)]


def patient_paired_test(per_anchor_a: Sequence[dict], per_anchor_b: Sequence[dict],
                        patients: dict[str, str]) -> dict[str, float]:
    """Paired comparison of two methods over patients: each patient's mean anchor accuracy
    (``per_anchor`` of :func:`core.eval.metrics.evaluate`), a two-sided paired t-test and a
    Wilcoxon signed-rank test on the per-patient differences a − b."""
    from scipy import stats

    def by_patient(rows: Sequence[dict]) -> dict[str, float]:
        acc: dict[str, list[float]] = {}
        for r in rows:
            acc.setdefault(patients[r["anchor"]], []).append(r["accuracy"])
        return {p: float(np.mean(v)) for p, v in acc.items()}

    a, b = by_patient(per_anchor_a), by_patient(per_anchor_b)
    common = sorted(set(a) & set(b))
    diff = np.array([a[p] - b[p] for p in common])
    t = stats.ttest_rel([a[p] for p in common], [b[p] for p in common])
    w = stats.wilcoxon(diff) if np.any(diff != 0) else None
    return {"n_patients": len(common), "mean_diff": float(diff.mean()), "t_p": float(t.pvalue),
            "wilcoxon_p": float(w.pvalue) if w is not None else 1.0}


def paired_claim(claim: str, a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> dict[str, Any]:
    """Claim "a > b" judged by a one-sided paired t-test over matched runs (seeds): holds iff p < alpha."""
    from scipy import stats

    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"a paired test needs ≥ 2 matched pairs, got {len(a)} and {len(b)}")
    diff = [x - y for x, y in zip(a, b)]
    p = float(stats.ttest_rel(a, b, alternative="greater").pvalue) if max(diff) > min(diff) else math.nan
    if not math.isfinite(p):  # identical differences in every pair: the t statistic is undefined
        return {"claim": claim, "test": f"one-sided paired t-test, n = {len(a)}: undefined (identical differences)",
                "p": None, "holds": False}
    return {"claim": claim, "test": f"one-sided paired t-test, n = {len(a)}", "p": p, "holds": bool(p < alpha)}
