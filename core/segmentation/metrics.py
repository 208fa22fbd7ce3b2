"""Segmentation quality and the simulated editing effort of a suggestion.

- Dice and IoU of two boolean masks (both empty → 1).
- Boundary F-score (Csurka et al., BMVC 2013; the DAVIS ``F`` measure): precision and recall of
  boundary pixels within a tolerance of ``ceil(0.008 × image diagonal)`` pixels.
- Per-wound scores: each predicted connected component is assigned to the true wound it overlaps
  most; a wound's suggestion is the union of its components (none → Dice 0).
- Where a suggestion misses the expert's wound: its recall in each wound's outer band (the pixels within
  :data:`BAND_FRACTION` of the wound's equivalent radius of its outline) and in the core inside it. A
  suggestion that stops short of a loose outline misses the band; one that misses a kind of tissue, the core.
- Edit effort: a suggestion with Dice ≥ 0.9 to its wound needs no edit; otherwise the clinician
  moves the vertices of the suggestion's outline (Douglas–Peucker, 1 px) lying farther than the
  boundary tolerance from the true outline, or draws the true outline's vertices when nothing was
  suggested.
"""
from __future__ import annotations

import math

import cv2
import numpy as np
from scipy import ndimage

NO_EDIT_DICE = 0.9
POLYGON_EPSILON = 1.0
#: A wound's outer band: its pixels within this share of its equivalent radius √(area/π) of its outline.
BAND_FRACTION = 0.15


def dice(pred: np.ndarray, truth: np.ndarray) -> float:
    """2|P∩T| / (|P| + |T|); 1 when both are empty."""
    p, t = np.asarray(pred, bool), np.asarray(truth, bool)
    denom = p.sum() + t.sum()
    return 1.0 if denom == 0 else float(2 * (p & t).sum() / denom)


def iou(pred: np.ndarray, truth: np.ndarray) -> float:
    """|P∩T| / |P∪T|; 1 when both are empty."""
    p, t = np.asarray(pred, bool), np.asarray(truth, bool)
    union = (p | t).sum()
    return 1.0 if union == 0 else float((p & t).sum() / union)


def boundary_tolerance(shape: tuple[int, int]) -> int:
    """DAVIS boundary tolerance: ``ceil(0.008 × diagonal)`` pixels."""
    return max(1, math.ceil(0.008 * math.hypot(*shape)))


def boundary(mask: np.ndarray) -> np.ndarray:
    """Pixels of ``mask`` with a 4-neighbour outside it (the photo's edge counts as outside)."""
    m = np.asarray(mask, bool)
    return m & ~ndimage.binary_erosion(m, border_value=0)


def _near(a: np.ndarray, b: np.ndarray, tol: float) -> np.ndarray:
    """For each pixel of ``a``: whether a pixel of ``b`` lies within ``tol``."""
    if not b.any():
        return np.zeros(int(a.sum()), bool)
    return ndimage.distance_transform_edt(~b)[a] <= tol


def boundary_f(pred: np.ndarray, truth: np.ndarray, tol: float | None = None) -> float:
    """Boundary F-score within ``tol`` pixels (default :func:`boundary_tolerance`); 1 when both are empty."""
    bp, bt = boundary(pred), boundary(truth)
    if not bp.any() and not bt.any():
        return 1.0
    if not bp.any() or not bt.any():
        return 0.0
    tol = boundary_tolerance(bp.shape) if tol is None else tol
    precision, recall = _near(bp, bt, tol).mean(), _near(bt, bp, tol).mean()
    return 0.0 if precision + recall == 0 else float(2 * precision * recall / (precision + recall))


def band_recall(pred: np.ndarray, truth: np.ndarray, fraction: float = BAND_FRACTION) -> tuple[float | None, float | None]:
    """(recall in the outer band, recall in the core) of the true wound pixels: each connected wound's band holds
    its pixels within ``fraction`` × √(its area / π) of its outline (Euclidean distance to the nearest non-wound
    pixel, the image border counting as outside); None where a part is empty."""
    p, t = np.asarray(pred, bool), np.asarray(truth, bool)
    labels, n = ndimage.label(t)
    depth = ndimage.distance_transform_edt(np.pad(t, 1))[1:-1, 1:-1]
    radius = np.sqrt(np.bincount(labels.ravel(), minlength=n + 1) / math.pi)[labels]
    band = t & (depth <= fraction * radius)
    core = t & ~band
    return tuple(float(p[part].mean()) if part.any() else None for part in (band, core))  # type: ignore[return-value]


def match_wounds(pred: np.ndarray, truth_labels: np.ndarray) -> dict[int, np.ndarray]:
    """True wound index → its suggestion: the predicted 4-connected components overlapping it most."""
    comps, n = ndimage.label(np.asarray(pred, bool))
    out = {int(k): np.zeros(truth_labels.shape, bool) for k in np.unique(truth_labels) if k > 0}
    for c in range(1, n + 1):
        comp = comps == c
        hits = np.bincount(truth_labels[comp], minlength=1)
        hits[0] = 0
        if hits.max() > 0:
            out[int(hits.argmax())] |= comp
    return out


def polygon_vertices(mask: np.ndarray, epsilon: float = POLYGON_EPSILON) -> np.ndarray:
    """Vertices (x, y) of the outer outlines of ``mask``, simplified by Douglas–Peucker."""
    contours, _ = cv2.findContours(np.asarray(mask, np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    pts = [cv2.approxPolyDP(c, epsilon, True).reshape(-1, 2) for c in contours]
    return np.concatenate(pts) if pts else np.zeros((0, 2), int)


def vertices_to_move(suggestion: np.ndarray, truth: np.ndarray, tol: float | None = None) -> int:
    """Vertices a clinician moves to turn ``suggestion`` into ``truth`` (all of truth's when nothing is suggested)."""
    if not suggestion.any():
        return len(polygon_vertices(truth))
    tol = boundary_tolerance(truth.shape) if tol is None else tol
    dist = ndimage.distance_transform_edt(~boundary(truth))
    v = polygon_vertices(suggestion)
    return int((dist[v[:, 1], v[:, 0]] > tol).sum())


def photo_scores(pred: np.ndarray, truth_labels: np.ndarray) -> dict:
    """Per-photo Dice, IoU and boundary F, and per-wound Dice, IoU, no-edit flag and vertices to move."""
    truth = truth_labels > 0
    wounds = []
    for k, sug in match_wounds(pred, truth_labels).items():
        t = truth_labels == k
        d = dice(sug, t)
        wounds.append({"wound": k, "dice": d, "iou": iou(sug, t), "no_edit": d >= NO_EDIT_DICE,
                       "vertices": 0 if d >= NO_EDIT_DICE else vertices_to_move(sug, t)})
    return {"dice": dice(pred, truth), "iou": iou(pred, truth), "boundary_f": boundary_f(pred, truth),
            "wounds": wounds}
