"""Agreement between an image-distance matrix and triplet judgments.

TriDerm (paper §3.1; METHODS.md §1 "Evaluation"): for a triplet (i, j, k) where the
expert chose j, the margin is Δ = d(i,k) − d(i,j); the embedding agrees when Δ > 0
(ties count as disagreement).

- balanced (anchor) agreement: mean over anchors of the fraction of the anchor's
  triplets that agree;
- micro agreement: fraction of all triplets that agree;
- macro-F1 and Cohen's κ: the binary task "reference in position j vs position k",
  true label = the expert's choice, predicted label = the closer reference.

Confidence intervals bootstrap over anchors: anchors are resampled with replacement
and keep all their triplets (:func:`core.eval.protocol.patient_bootstrap_ci` resamples patients instead).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

METRICS = ("balanced", "micro", "macro_f1", "kappa")


def _validate_distance(D: np.ndarray) -> np.ndarray:
    D = np.asarray(D, dtype=np.float64)
    if D.ndim != 2 or D.shape[0] != D.shape[1]:
        raise ValueError(f"D must be a square n×n distance matrix, got shape {D.shape}")
    return D


def _per_triplet(
    D: np.ndarray,
    anchors: Sequence[int] | np.ndarray,
    refs_j: Sequence[int] | np.ndarray,
    refs_k: Sequence[int] | np.ndarray,
    choices: Sequence[str] | np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Validate inputs; return (anchor index, true label, predicted label, correct).

    Labels are 0 for position j and 1 for position k. A tie (Δ = 0) is predicted as
    the position the expert did *not* choose, so it counts as wrong in every metric.
    """
    D = _validate_distance(D)
    a = np.asarray(anchors, dtype=np.int64).reshape(-1)
    j = np.asarray(refs_j, dtype=np.int64).reshape(-1)
    k = np.asarray(refs_k, dtype=np.int64).reshape(-1)
    c = np.asarray(choices).reshape(-1)
    if not (len(a) == len(j) == len(k) == len(c)):
        raise ValueError(
            f"anchors, refs_j, refs_k and choices differ in length: {len(a)}, {len(j)}, {len(k)}, {len(c)}"
        )
    n = D.shape[0]
    for name, idx in (("anchors", a), ("refs_j", j), ("refs_k", k)):
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{name} holds an index outside [0, {n}) for a {n}×{n} distance matrix")
    bad = ~np.isin(c, ["j", "k"])
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        raise ValueError(f"choice at position {pos} is {str(c[pos])!r}; expected 'j' or 'k' (drop skips first)")
    y_true = (c == "k").astype(np.int64)
    dj, dk = D[a, j], D[a, k]
    y_pred = np.where(dj < dk, 0, np.where(dk < dj, 1, 1 - y_true))
    return a, y_true, y_pred, y_pred == y_true


def _confusion_scores(cm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Macro-F1 and Cohen's κ from 2×2 confusion counts cm[..., true, pred].

    Matches scikit-learn: macro-F1 averages over the labels present in the true or
    predicted labels; κ is NaN when undefined (expected agreement p_e = 1).
    """
    cm = np.asarray(cm, dtype=np.float64)
    total = cm.sum(axis=(-2, -1))
    f1s, present = [], []
    for c in (0, 1):
        tp = cm[..., c, c]
        fp = cm[..., 1 - c, c]
        fn = cm[..., c, 1 - c]
        denom = 2 * tp + fp + fn
        with np.errstate(invalid="ignore", divide="ignore"):
            f1s.append(np.where(denom > 0, 2 * tp / np.where(denom > 0, denom, 1), 0.0))
        present.append(denom > 0)
    f1 = np.stack(f1s, -1)
    pres = np.stack(present, -1)
    n_present = pres.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        macro_f1 = np.where(n_present > 0, (f1 * pres).sum(-1) / np.maximum(n_present, 1), np.nan)
        p_o = (cm[..., 0, 0] + cm[..., 1, 1]) / total
        p_true = cm.sum(-1) / total[..., None]
        p_pred = cm.sum(-2) / total[..., None]
        p_e = (p_true * p_pred).sum(-1)
        kappa = np.where(np.isclose(p_e, 1.0), np.nan, (p_o - p_e) / (1 - p_e))
    return macro_f1, kappa


def _anchor_table(
    a: np.ndarray, y_true: np.ndarray, y_pred: np.ndarray, correct: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-anchor (unique anchors, triplet count, correct count, 2×2 confusion counts)."""
    uniq, inv = np.unique(a, return_inverse=True)
    n_a = np.bincount(inv, minlength=len(uniq)).astype(np.float64)
    c_a = np.bincount(inv, weights=correct.astype(np.float64), minlength=len(uniq))
    cm = np.zeros((len(uniq), 2, 2))
    np.add.at(cm, (inv, y_true, y_pred), 1.0)
    return uniq, n_a, c_a, cm


def _scores_from_anchor_weights(
    w: np.ndarray, n_a: np.ndarray, c_a: np.ndarray, cm: np.ndarray
) -> dict[str, np.ndarray]:
    """All four metrics for anchor multiplicities w (shape (..., A)); vectorised for the bootstrap."""
    acc_a = c_a / n_a
    balanced = (w * acc_a).sum(-1) / w.sum(-1)
    micro = (w * c_a).sum(-1) / (w * n_a).sum(-1)
    macro_f1, kappa = _confusion_scores(np.tensordot(w, cm, axes=(-1, 0)))
    return {"balanced": balanced, "micro": micro, "macro_f1": macro_f1, "kappa": kappa}


def agreement_from_choices(
    D: np.ndarray,
    anchors: Sequence[int] | np.ndarray,
    refs_j: Sequence[int] | np.ndarray,
    refs_k: Sequence[int] | np.ndarray,
    choices: Sequence[str] | np.ndarray,
) -> dict[str, float]:
    """Agreement of distance matrix ``D`` with triplets in the store's raw format.

    ``choices[t]`` is ``'j'`` or ``'k'`` (skips already removed): which reference the
    judge found closer to ``anchors[t]``. Returns ``balanced``, ``micro``, ``macro_f1``,
    ``kappa`` (NaN when undefined), ``n`` triplets and ``n_anchors``.
    """
    a, y_true, y_pred, correct = _per_triplet(D, anchors, refs_j, refs_k, choices)
    if len(a) == 0:
        return {**{m: float("nan") for m in METRICS}, "n": 0, "n_anchors": 0}
    _, n_a, c_a, cm = _anchor_table(a, y_true, y_pred, correct)
    scores = _scores_from_anchor_weights(np.ones(len(n_a)), n_a, c_a, cm)
    return {**{m: float(v) for m, v in scores.items()}, "n": len(a), "n_anchors": len(n_a)}


def agreement(D: np.ndarray, triplets: np.ndarray) -> dict[str, float]:
    """Agreement of ``D`` with oriented triplets: rows ``[i, j, k]`` mean "i is closer to j".

    Oriented triplets have lost the reference positions that macro-F1 and κ label, so
    the references are put in a canonical position order (smaller index in position
    j). Balanced and micro agreement do not depend on this; use
    :func:`agreement_from_choices` (or :func:`evaluate`) to score raw store positions.
    """
    t = np.asarray(triplets, dtype=np.int64)
    if t.size == 0:
        t = t.reshape(0, 3)
    if t.ndim != 2 or t.shape[1] != 3:
        raise ValueError(f"triplets must be an (m, 3) integer array [i, j, k], got shape {t.shape}")
    i, j, k = t[:, 0], t[:, 1], t[:, 2]
    first, second = np.minimum(j, k), np.maximum(j, k)
    choices = np.where(j == first, "j", "k")
    return agreement_from_choices(D, i, first, second, choices)


def _bootstrap_ci(
    n_a: np.ndarray, c_a: np.ndarray, cm: np.ndarray, n_boot: int, seed: int, level: float = 0.95
) -> dict[str, list[float]]:
    """Percentile CIs from resampling anchors with replacement (each keeps its triplets)."""
    rng = np.random.default_rng(seed)
    A = len(n_a)
    w = rng.multinomial(A, np.full(A, 1.0 / A), size=n_boot).astype(np.float64)
    boots = _scores_from_anchor_weights(w, n_a, c_a, cm)
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    out: dict[str, list[float]] = {}
    for m in METRICS:
        vals = boots[m][np.isfinite(boots[m])]
        out[m] = [float(v) for v in np.percentile(vals, q)] if len(vals) else [float("nan")] * 2
    return out


def evaluate(
    ids: Sequence[str],
    D: np.ndarray,
    triplet_rows: Iterable[Mapping[str, Any]],
    ci: bool = False,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Score ``D`` (rows/cols ordered as ``ids``) against store triplet rows.

    Rows are dicts with ``anchor``, ``ref_j``, ``ref_k`` (image ids) and ``choice``
    ('j' | 'k' | 'skip'). Skips are dropped and counted in ``n_skipped``; triplets naming
    an image not in ``ids`` are dropped and counted in ``n_missing``. With ``ci=True``
    the result also has ``ci`` (metric → [low, high], 95% bootstrap over anchors with
    ``n_boot`` resamples) and ``per_anchor`` ([{anchor, n, accuracy}], worst first).
    """
    D = _validate_distance(D)
    ids = list(ids)
    if len(ids) != D.shape[0]:
        raise ValueError(f"{len(ids)} ids for a {D.shape[0]}×{D.shape[0]} distance matrix")
    index = {image_id: n for n, image_id in enumerate(ids)}
    if len(index) != len(ids):
        raise ValueError("ids contain duplicates")
    anchors, refs_j, refs_k, choices = [], [], [], []
    n_skipped = n_missing = 0
    for row in triplet_rows:
        choice = row["choice"]
        if choice == "skip":
            n_skipped += 1
            continue
        if choice not in ("j", "k"):
            raise ValueError(f"triplet {row.get('id', row)}: choice {choice!r} is not 'j', 'k' or 'skip'")
        names = (row["anchor"], row["ref_j"], row["ref_k"])
        if any(name not in index for name in names):
            n_missing += 1
            continue
        anchors.append(index[names[0]])
        refs_j.append(index[names[1]])
        refs_k.append(index[names[2]])
        choices.append(choice)
    result: dict[str, Any] = agreement_from_choices(D, anchors, refs_j, refs_k, choices)
    result.update(n_skipped=n_skipped, n_missing=n_missing)
    if ci:
        if anchors:
            a, y_true, y_pred, correct = _per_triplet(D, anchors, refs_j, refs_k, choices)
            uniq, n_a, c_a, cm = _anchor_table(a, y_true, y_pred, correct)
            result["ci"] = _bootstrap_ci(n_a, c_a, cm, n_boot, seed)
            per_anchor = [
                {"anchor": ids[u], "n": int(n), "accuracy": float(c / n)} for u, n, c in zip(uniq, n_a, c_a)
            ]
            result["per_anchor"] = sorted(per_anchor, key=lambda r: (r["accuracy"], -r["n"], r["anchor"]))
        else:
            result["ci"] = {m: [float("nan")] * 2 for m in METRICS}
            result["per_anchor"] = []
    return result
