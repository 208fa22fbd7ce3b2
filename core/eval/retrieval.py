"""Nearest and farthest images under a run's (or a fused pair of runs') image distances.

:func:`neighbours` reads an n×n distance matrix; :class:`EmbeddingIndex` gives the same answer for
an embedding without building that matrix (a scikit-learn ``NearestNeighbors`` index), which the
explorer uses above a few thousand photos. TriDerm's retrieval figure (paper §3.4) shows similar
images at normalised distance < 0.35 and dissimilar ones > 0.8. :func:`same_label_retrieval` measures
how often those neighbours share the query's label (precision@k, average precision), and
:func:`retrieval_summary` gives their means with CIs that resample patients.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from annotations.infra.workspace import Workspace
from core.eval.distances import image_distances
from core.eval.fusion import DEFAULT_ALPHA, fuse, minmax_normalise
from core.eval.protocol import patient_bootstrap_ci
from core.runtime import load_embeddings


def neighbours(ids: Sequence[str], D: np.ndarray, image_id: str, k: int = 5) -> dict[str, list[tuple[str, float]]]:
    """The ``k`` most similar (nearest first) and ``k`` most dissimilar (farthest first) images.

    ``D`` is the n×n distance matrix ordered as ``ids``; the query image itself is
    excluded. Ties keep the order of ``ids``.
    """
    ids = list(ids)
    D = np.asarray(D, dtype=np.float64)
    if D.shape != (len(ids), len(ids)):
        raise ValueError(f"{len(ids)} ids for a distance matrix of shape {D.shape}")
    if k < 1:
        raise ValueError(f"k must be ≥ 1, got {k}")
    try:
        q = ids.index(image_id)
    except ValueError:
        raise KeyError(f"image {image_id!r} is not in this embedding ({len(ids)} images)") from None
    others = np.array([n for n in range(len(ids)) if n != q], dtype=np.int64)
    d = D[q, others]
    near = others[np.argsort(d, kind="stable")][:k]
    far = others[np.argsort(-d, kind="stable")][:k]
    return {
        "similar": [(ids[n], float(D[q, n])) for n in near],
        "dissimilar": [(ids[n], float(D[q, n])) for n in far],
    }


def max_distance(X: np.ndarray, block_bytes: int = 64 << 20) -> float:
    """The largest Euclidean distance between two rows of ``X``, computed in row blocks of about
    ``block_bytes`` (memory O(n) per block, never the n×n matrix); the same float64 values as
    :func:`core.eval.distances.pairwise_euclidean`."""
    from scipy.spatial.distance import cdist  # here, not at the top: Explore draws its map before any retrieval

    X = np.asarray(X, dtype=np.float64)
    step = max(1, block_bytes // (8 * max(1, len(X))))
    return max((float(cdist(X[i:i + step], X).max()) for i in range(0, len(X), step)), default=0.0)


class EmbeddingIndex:
    """:func:`neighbours` under the min-max normalised Euclidean distances of an embedding, without
    the n×n matrix: the nearest from a scikit-learn ``NearestNeighbors`` index, the farthest from the
    query's one row of distances (farthest points are not an index query), both divided by the
    largest pairwise distance (:func:`max_distance`; the smallest is 0, an image to itself).

    Equal to :func:`neighbours` on ``minmax_normalise(pairwise_euclidean(X))`` except where several
    images tie at the k-th distance (the index may keep another of them).
    """

    def __init__(self, ids: Sequence[str], X: np.ndarray) -> None:
        from sklearn.neighbors import NearestNeighbors

        self.ids = list(ids)
        self.X = np.asarray(X, dtype=np.float64)
        if self.X.ndim != 2 or len(self.X) != len(self.ids):
            raise ValueError(f"{len(self.ids)} ids for an embedding of shape {self.X.shape}")
        self._row = {image_id: n for n, image_id in enumerate(self.ids)}
        self.index = NearestNeighbors().fit(self.X)
        self.scale = max_distance(self.X)

    def neighbours(self, image_id: str, k: int = 5) -> dict[str, list[tuple[str, float]]]:
        """The ``k`` most similar (nearest first) and ``k`` most dissimilar (farthest first) images."""
        from scipy.spatial.distance import cdist

        if k < 1:
            raise ValueError(f"k must be ≥ 1, got {k}")
        q = self._row.get(image_id)
        if q is None:
            raise KeyError(f"image {image_id!r} is not in this embedding ({len(self.ids)} images)")
        n = len(self.ids)
        found = self.index.kneighbors(self.X[q:q + 1], n_neighbors=min(n, k + 1), return_distance=False)[0]
        near = np.array([i for i in found if i != q][:k], dtype=np.int64)
        d_near = cdist(self.X[q:q + 1], self.X[near])[0]  # exact, as the full matrix has them
        order = np.lexsort((near, d_near))
        row = cdist(self.X[q:q + 1], self.X)[0]
        others = np.delete(np.arange(n), q)
        far = others[np.argsort(-row[others], kind="stable")][:k]
        scale = self.scale if self.scale > 0 else np.inf  # all points equal: every distance 0, as minmax_normalise
        return {
            "similar": [(self.ids[near[i]], float(d_near[i] / scale)) for i in order],
            "dissimilar": [(self.ids[i], float(row[i] / scale)) for i in far],
        }


def has_embeddings(ws: Workspace, run: dict) -> bool:
    """Whether the run registered an embeddings file that is still on disk."""
    rel = run["artifacts"].get("embeddings")
    return bool(rel) and (ws.root / rel).exists()


def run_image_distances(ws: Workspace, run: dict) -> tuple[list[str], np.ndarray] | None:
    """(ids, D) of a finished run with image embeddings or distances; None when it has neither."""
    if run["status"] != "done" or "modality" not in run["config"] or not has_embeddings(ws, run):
        return None
    emb = load_embeddings(ws, run["id"])
    if emb.get("image_emb") is None and emb.get("distance") is None:
        return None
    ids, D = image_distances(emb)
    return list(ids), np.asarray(D, dtype=np.float64)


def run_distances(
    ws: Workspace, run_ids: int | Sequence[int], method: str = "uncertainty", alpha: float = DEFAULT_ALPHA
) -> tuple[list[str], np.ndarray]:
    """Min-max normalised image distances of one run, or of several runs fused with ``method``.

    With several runs (vision first), images missing from any run raise
    :class:`core.eval.fusion.MissingImagesError` listing them.
    """
    runs = [run_ids] if isinstance(run_ids, (int, np.integer)) else list(run_ids)
    if not runs:
        raise ValueError("no run given")
    pairs = [image_distances(load_embeddings(ws, int(r))) for r in runs]
    if len(pairs) == 1:
        ids, D = pairs[0]
        return list(ids), minmax_normalise(D)
    fused = fuse(pairs, method=method, alpha=alpha)
    return fused.ids, fused.D


def neighbours_in_runs(
    ws: Workspace,
    run_ids: int | Sequence[int],
    image_id: str,
    k: int = 5,
    method: str = "uncertainty",
    alpha: float = DEFAULT_ALPHA,
) -> dict[str, list[tuple[str, float]]]:
    """:func:`neighbours` of ``image_id`` under :func:`run_distances` of a run or a fused pair of runs."""
    ids, D = run_distances(ws, run_ids, method=method, alpha=alpha)
    return neighbours(ids, D, image_id, k=k)


#: the cut-offs of :func:`same_label_retrieval`'s precision@k
RETRIEVAL_KS = (1, 5, 10)


def same_label_retrieval(D: np.ndarray, labels: Sequence[str], patients: Sequence[str],
                         queries: Sequence[int] | np.ndarray, gallery: Sequence[int] | np.ndarray | None = None,
                         ks: Sequence[int] = RETRIEVAL_KS) -> dict[int, dict[str, float | None]]:
    """Same-label retrieval of each query row of the n×n distances ``D``: ``p@k`` (the share of its ``k``
    nearest gallery photos that carry its label; fewer than ``k`` candidates count as misses) and ``ap``
    (average precision over the whole ranked gallery; None when no candidate shares its label).

    Candidates are the ``gallery`` rows (default every row) minus the query and every photo of the query's
    own patient (``patients[row]``): photos of one patient look alike whatever their label, so finding them
    says nothing about retrieving a *new* patient's look-alikes. Ties keep the gallery's order. Returns
    query row → metric → value."""
    D = np.asarray(D, dtype=np.float64)
    n = len(labels)
    if D.shape != (n, n) or len(patients) != n:
        raise ValueError(f"{n} labels and {len(patients)} patients for a distance matrix of shape {D.shape}")
    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be ≥ 1, got {list(ks)}")
    rows = np.arange(n) if gallery is None else np.asarray(gallery, dtype=np.int64)
    lab, pat = np.asarray(labels, dtype=object), np.asarray(patients, dtype=object)
    out: dict[int, dict[str, float | None]] = {}
    for q in (int(r) for r in queries):
        if not 0 <= q < n:
            raise ValueError(f"query row {q} is outside [0, {n})")
        cand = rows[pat[rows] != pat[q]]
        hit = (lab[cand[np.argsort(D[q, cand], kind="stable")]] == lab[q]).astype(np.float64)
        rec: dict[str, float | None] = {f"p@{k}": float(hit[:k].sum() / k) for k in ks}
        rec["ap"] = float((np.cumsum(hit) / np.arange(1, len(hit) + 1))[hit > 0].mean()) if hit.any() else None
        out[q] = rec
    return out


def retrieval_summary(per_query: dict[str, dict[str, float | None]], patients: dict[str, str], n_boot: int = 1000,
                      seed: int = 0) -> dict[str, dict[str, Any]]:
    """Metric → ``{"mean", "ci", "n"}``: the mean over queries (image id → metric → value, e.g.
    :func:`same_label_retrieval`'s averaged over folds and seeds) of every metric, with a 95 % CI that
    resamples patients (:func:`core.eval.protocol.patient_bootstrap_ci`); queries without a value (an ``ap``
    with nothing to find) are left out of that metric."""
    names = sorted({m for rec in per_query.values() for m in rec}, key=lambda m: (m == "ap", len(m), m))
    out: dict[str, dict[str, Any]] = {}
    for m in names:
        values = {q: float(rec[m]) for q, rec in per_query.items() if rec.get(m) is not None}  # type: ignore[arg-type]
        out[m] = {"mean": float(np.mean(list(values.values()))) if values else None,
                  "ci": patient_bootstrap_ci(values, patients, n_boot, seed), "n": len(values)}
    return out


#: photo metadata read as a photo's type for a run's retrieval figure: the first field every photo carries
TYPE_FIELDS = ("wound_type", "diagnosis", "rdeb_subtype")


def photo_types(images: Sequence[dict[str, Any]], image_ids: Sequence[str]) -> tuple[str, list[str]] | None:
    """(field, each photo's value in ``image_ids`` order) of the first of :data:`TYPE_FIELDS` that every photo
    of ``image_ids`` carries in its metadata (store image rows ``images``); None when none does."""
    meta = {im["image_id"]: im.get("metadata") or {} for im in images}
    for field in TYPE_FIELDS:
        values = [meta.get(i, {}).get(field) for i in image_ids]
        if all(v not in (None, "") for v in values):
            return field, [str(v) for v in values]
    return None


def fold_retrieval(image_ids: Sequence[str], folds: Sequence[tuple[np.ndarray, np.ndarray]], labels: Sequence[str],
                   patients: dict[str, str]) -> dict[str, dict[str, float | None]]:
    """Image id → metric → :func:`same_label_retrieval` of the photo among its fold's other held-out photos
    (``folds``: (the fold's rows, the n×n distances of the model trained without them)), averaged over every
    fold it was held out in (one per split)."""
    pats = [patients[i] for i in image_ids]
    recs: dict[str, list[dict[str, float | None]]] = {}
    for rows, D in folds:
        for q, rec in same_label_retrieval(D, labels, pats, rows, gallery=rows).items():
            recs.setdefault(image_ids[q], []).append(rec)
    out: dict[str, dict[str, float | None]] = {}
    for image_id, rs in recs.items():
        out[image_id] = {}
        for m in rs[0]:
            vals = [v for r in rs if (v := r[m]) is not None]
            out[image_id][m] = float(np.mean(vals)) if vals else None
    return out


def cv_retrieval(image_ids: Sequence[str], folds: Sequence[tuple[np.ndarray, np.ndarray]],
                 types: tuple[str, list[str]] | None, patients: dict[str, str], seed: int = 0) -> dict[str, Any]:
    """A run's ``metrics["cv"]["retrieval"]`` (under that key; empty without photo ``types``, see
    :func:`photo_types`): same-type precision@k and mAP of each held-out photo among its fold's
    (:func:`fold_retrieval`), patient-bootstrap CIs."""
    if types is None:
        return {}
    return {"retrieval": {"label": types[0], "gallery": "strict",
                          **retrieval_summary(fold_retrieval(image_ids, folds, types[1], patients), patients,
                                              seed=seed)}}
