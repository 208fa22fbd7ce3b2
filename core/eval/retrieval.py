"""Nearest and farthest images under a run's (or a fused pair of runs') image distances.

The explorer page calls :func:`neighbours_in_runs`; TriDerm's retrieval figure (paper
§3.4) shows similar images at normalised distance < 0.35 and dissimilar ones > 0.8.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from annotations.workspace import Workspace
from core.eval.distances import image_distances
from core.eval.fusion import DEFAULT_ALPHA, fuse, minmax_normalise
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
