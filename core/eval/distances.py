"""Image-distance matrices: the one Euclidean pairwise-distance function of the project, and a
run's distances (its stored matrix, or Euclidean on its embedding)."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["image_distances", "pairwise_euclidean"]

Matrix = TypeVar("Matrix", np.ndarray, "torch.Tensor")


def pairwise_euclidean(x: Matrix, y: Matrix | None = None, squared: bool = False) -> Matrix:
    """len(x)×len(y) Euclidean distances between rows (``y`` defaults to ``x``; squared on request).

    Arrays go to :func:`scipy.spatial.distance.cdist` (float64, exact: 0 on the diagonal of
    ``x`` against itself); tensors stay on their own device and dtype (differentiable):
    :func:`torch.cdist`, or for squared distances the same ‖a‖² + ‖b‖² − 2a·b matrix product
    torch.cdist uses, without its square root (the SOE fit's inner loop asks for these, ~2× faster).
    Neither builds an n×m×d difference array.
    """
    torch = sys.modules.get("torch")  # a tensor implies torch is imported; arrays never import it
    if not isinstance(x, np.ndarray) and torch is not None and isinstance(x, torch.Tensor):
        other = x if y is None else y
        if squared:
            sq = x.pow(2).sum(1)
            osq = sq if y is None else other.pow(2).sum(1)
            return (sq[:, None] + osq[None, :] - 2 * x @ other.T).clamp_min(0)
        d = torch.cdist(x.unsqueeze(0), other.unsqueeze(0)).squeeze(0)
        return d.clone().fill_diagonal_(0.0) if y is None else d
    a = np.asarray(x, dtype=np.float64)
    b = a if y is None else np.asarray(y, dtype=np.float64)
    from scipy.spatial.distance import cdist  # here, not at import: jobs' --help stays fast

    return cdist(a, b, "sqeuclidean" if squared else "euclidean")


def image_distances(emb: dict[str, Any]) -> tuple[list[str], np.ndarray]:
    """(image ids, distance matrix) of :func:`core.runtime.load_embeddings`'s output: the stored
    matrix, else Euclidean on the image embedding."""
    if emb.get("distance") is not None:
        return emb["image_ids"], np.asarray(emb["distance"], dtype=np.float64)
    return emb["image_ids"], pairwise_euclidean(emb["image_emb"])
