"""Training-free fusion of image-distance matrices from several modalities.

TriDerm (paper §2.2 "Fusion"; METHODS.md §1 "Fusion") fuses the vision distance
matrix D_V and the text distance matrix D_T, each min-max normalised to [0, 1]:

- uncertainty-aware fusion: the confidence of modality m for image i is the variance
  σ²_{m,i} of row i of D_m (a high variance means the image separates others clearly);
  per-image weights w_i combine confidence with a prior α (0.7 for vision), pairs use
  the symmetric w_ij = (w_i + w_j) / 2, and D = w_ij·D_V + (1 − w_ij)·D_T;
- similarity-based fusion: S = (1 − D_V) ⊙ (1 − D_T), D = 1 − S.

Both generalise to M ≥ 2 modalities (see the functions). Matrices are aligned on
image ids; images missing from a modality are reported, never silently dropped.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

METHODS = ("uncertainty", "similarity")
DEFAULT_ALPHA = 0.7


class MissingImagesError(ValueError):
    """Some images are not covered by every modality; ``missing[m]`` lists them per input."""

    def __init__(self, missing: dict[int, list[str]]):
        self.missing = missing
        detail = "; ".join(f"input {m} lacks {len(v)}: {', '.join(v[:10])}{' …' if len(v) > 10 else ''}"
                           for m, v in missing.items() if v)
        super().__init__(f"images missing from some inputs ({detail})")


@dataclass
class Fused:
    """A fused distance matrix over ``ids`` and, per input index, the images it lacked."""

    ids: list[str]
    D: np.ndarray
    missing: dict[int, list[str]] = field(default_factory=dict)


def _square(D: np.ndarray, name: str = "D") -> np.ndarray:
    D = np.asarray(D, dtype=np.float64)
    if D.ndim != 2 or D.shape[0] != D.shape[1]:
        raise ValueError(f"{name} must be a square distance matrix, got shape {D.shape}")
    if not np.isfinite(D).all():
        raise ValueError(f"{name} contains NaN or infinite distances")
    return D


def _stack(Ds: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    if len(Ds) < 2:
        raise ValueError(f"fusion needs at least 2 distance matrices, got {len(Ds)}")
    mats = [_square(D, f"distance matrix {m}") for m, D in enumerate(Ds)]
    if len({D.shape for D in mats}) != 1:
        raise ValueError(f"distance matrices differ in shape: {[D.shape for D in mats]}; align them by id first")
    return np.stack(mats)


def minmax_normalise(D: np.ndarray) -> np.ndarray:
    """Scale all entries of ``D`` linearly to [0, 1]; a constant matrix becomes all zeros."""
    D = _square(D)
    lo, hi = D.min(), D.max()
    return (D - lo) / (hi - lo) if hi > lo else np.zeros_like(D)


def row_variance(D: np.ndarray) -> np.ndarray:
    """Variance of each row of ``D`` over the other images (the self-distance is excluded)."""
    D = _square(D)
    n = len(D)
    if n < 3:
        raise ValueError(f"row variance needs at least 3 images, got {n}")
    off = D[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    return off.var(axis=1)


def _priors(n_modalities: int, alpha: float | Sequence[float]) -> np.ndarray:
    """Modality priors: a scalar α means (α, 1 − α) for two modalities; else one prior per modality."""
    if isinstance(alpha, (int, float, np.integer, np.floating)):
        if n_modalities != 2:
            raise ValueError(f"a scalar alpha applies to 2 modalities; give {n_modalities} priors instead")
        if not 0.0 < float(alpha) < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        return np.array([float(alpha), 1.0 - float(alpha)])
    p = np.asarray(alpha, dtype=np.float64)
    if p.shape != (n_modalities,) or (p <= 0).any():
        raise ValueError(f"need {n_modalities} positive modality priors, got {list(p)}")
    return p / p.sum()


def uncertainty_weights(Ds: Sequence[np.ndarray] | np.ndarray, alpha: float | Sequence[float] = DEFAULT_ALPHA) -> np.ndarray:
    """Per-image modality weights w[m, i] (each column sums to 1).

    **Reconstruction** — the paper's eq. 3 is lost in the extracted text; this follows
    METHODS.md's inferred form: w_i = α·σ²_{V,i} / (α·σ²_{V,i} + (1−α)·σ²_{T,i}), i.e.
    w[m, i] = p_m·σ²_{m,i} / Σ_m' p_m'·σ²_{m',i} with priors p = (α, 1 − α) for two
    modalities. An image with zero variance in every modality falls back to the priors.
    The matrices should already be min-max normalised.
    """
    stack = _stack(Ds)
    p = _priors(len(stack), alpha)
    conf = p[:, None] * np.stack([row_variance(D) for D in stack])
    total = conf.sum(axis=0)
    return np.where(total > 0, conf / np.where(total > 0, total, 1.0), p[:, None])


def uncertainty_fusion(Ds: Sequence[np.ndarray], alpha: float | Sequence[float] = DEFAULT_ALPHA) -> np.ndarray:
    """Uncertainty-aware fusion D = Σ_m w_{m,ij}·D_m with symmetric w_{m,ij} = (w_{m,i} + w_{m,j}) / 2.

    Each input is min-max normalised first; weights from :func:`uncertainty_weights`
    (a reconstruction of the paper's lost eq. 3). With two inputs this is
    D = w_ij·D_V + (1 − w_ij)·D_T, α = 0.7 favouring the first (vision) matrix.
    """
    stack = np.stack([minmax_normalise(D) for D in _stack(Ds)])
    w = uncertainty_weights(stack, alpha)
    w_pair = (w[:, :, None] + w[:, None, :]) / 2
    return (w_pair * stack).sum(axis=0)


def similarity_fusion(Ds: Sequence[np.ndarray]) -> np.ndarray:
    """Similarity-based fusion: S = Π_m (1 − D_m) on min-max normalised inputs, D = 1 − S."""
    stack = np.stack([minmax_normalise(D) for D in _stack(Ds)])
    return 1.0 - np.prod(1.0 - stack, axis=0)


def align(
    inputs: Sequence[tuple[Sequence[str], np.ndarray]], allow_missing: bool = False
) -> tuple[list[str], list[np.ndarray], dict[int, list[str]]]:
    """Restrict several (ids, D) pairs to their common images, in the first input's order.

    Returns (common ids, sub-matrices, missing) where ``missing[m]`` lists the images
    that some other input has but input m lacks. If any image is missing and
    ``allow_missing`` is False, raises :class:`MissingImagesError` with those lists.
    """
    if len(inputs) < 2:
        raise ValueError(f"fusion needs at least 2 inputs, got {len(inputs)}")
    id_lists: list[list[str]] = []
    for m, (ids, D) in enumerate(inputs):
        ids = list(ids)
        D = _square(D, f"input {m}")
        if len(ids) != len(D):
            raise ValueError(f"input {m}: {len(ids)} ids for a {len(D)}×{len(D)} matrix")
        if len(set(ids)) != len(ids):
            raise ValueError(f"input {m}: duplicate image ids")
        id_lists.append(ids)
    union = set().union(*id_lists)
    missing = {m: sorted(union - set(ids)) for m, ids in enumerate(id_lists)}
    missing = {m: v for m, v in missing.items() if v}
    if missing and not allow_missing:
        raise MissingImagesError(missing)
    common_set = set.intersection(*(set(ids) for ids in id_lists))
    common = [i for i in id_lists[0] if i in common_set]
    if len(common) < 3:
        raise ValueError(f"only {len(common)} images are shared by all inputs; fusion needs at least 3")
    subs = []
    for ids, (_, D) in zip(id_lists, inputs):
        pos = {image_id: n for n, image_id in enumerate(ids)}
        idx = np.array([pos[i] for i in common])
        subs.append(np.asarray(D, dtype=np.float64)[np.ix_(idx, idx)])
    return common, subs, missing


def fuse(
    inputs: Sequence[tuple[Sequence[str], np.ndarray]],
    method: str = "uncertainty",
    alpha: float | Sequence[float] = DEFAULT_ALPHA,
    allow_missing: bool = False,
) -> Fused:
    """Fuse (ids, D) pairs (vision first) on their common images with ``method``.

    Images lacking from some input raise :class:`MissingImagesError` unless
    ``allow_missing``; then they are left out and listed in ``Fused.missing``.
    """
    if method not in METHODS:
        raise ValueError(f"unknown fusion method {method!r}; choose from {', '.join(METHODS)}")
    ids, subs, missing = align(inputs, allow_missing=allow_missing)
    D = uncertainty_fusion(subs, alpha) if method == "uncertainty" else similarity_fusion(subs)
    return Fused(ids=ids, D=D, missing=missing)
