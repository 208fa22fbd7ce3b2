"""Image-distance matrices: Euclidean distances of an embedding, or a run's stored matrix."""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["pairwise_euclidean", "cross_euclidean", "image_distances"]


def pairwise_euclidean(x: np.ndarray) -> np.ndarray:
    """n×n Euclidean distances (exactly 0 on the diagonal)."""
    x = np.asarray(x, dtype=np.float64)
    sq = (x * x).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * x @ x.T, 0.0)
    np.fill_diagonal(d2, 0.0)
    return np.sqrt(d2)


def cross_euclidean(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """len(x)×len(y) Euclidean distances between the rows of two embeddings."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    d2 = (x * x).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2.0 * x @ y.T
    return np.sqrt(np.maximum(d2, 0.0))


def image_distances(emb: dict[str, Any]) -> tuple[list[str], np.ndarray]:
    """(image ids, distance matrix) of :func:`core.runtime.load_embeddings`'s output: the stored
    matrix, else Euclidean on the image embedding."""
    if emb.get("distance") is not None:
        return emb["image_ids"], np.asarray(emb["distance"], dtype=np.float64)
    return emb["image_ids"], pairwise_euclidean(emb["image_emb"])
