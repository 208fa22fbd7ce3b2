"""A wound track's photos aligned on the wound: one square view per visit, at one scale, centred on the
wound, so that visits compare side by side.

Each photo is first mapped onto its calibration's plane (the marker's homography corrects perspective
and gives cm; a ruler gives cm at one scale; without either, pixels), centred on the wound's centroid in
a window that holds the track's largest wound with a margin. Every later view is then registered on the
one before it with OpenCV's ECC (:func:`cv2.findTransformECC`, a rigid motion — a similarity without a
calibration, whose photos differ in scale) on the skin around the wound, the wound itself masked out
because it changes between visits; a registration that does not converge, or moves the view by more
than :data:`MAX_SHIFT` of its width, is not used and the view says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np

from annotations.followup.measure import Calibration

if TYPE_CHECKING:
    from annotations.infra.workspace import Workspace

PAD = 0.6          # margin around the largest wound, as a fraction of its radius
MAX_SHIFT = 0.1    # the largest registration move accepted, as a fraction of the view's width
ECC_ITERATIONS, ECC_EPS = 50, 1e-4


@dataclass
class AlignedView:
    """One visit's view: ``image`` (size×size RGB), ``mask`` (the wound, bool), ``transform`` (3×3, photo
    pixels → view pixels) and ``method`` (how it was aligned, in words)."""

    image: np.ndarray
    mask: np.ndarray
    transform: np.ndarray
    method: str


def _plane(calibration: Calibration | None) -> np.ndarray:
    return np.eye(3) if calibration is None else np.asarray(calibration.homography, np.float64)


def _to_plane(h: np.ndarray, points: np.ndarray) -> np.ndarray:
    return cv2.perspectiveTransform(points.reshape(-1, 1, 2).astype(np.float64), h).reshape(-1, 2)


def _grey(view: np.ndarray) -> np.ndarray:
    return cv2.GaussianBlur(cv2.cvtColor(view, cv2.COLOR_RGB2GRAY).astype(np.float32), (0, 0), 1.0)


def _correlation(a: np.ndarray, b: np.ndarray, where: np.ndarray) -> float:
    """Zero-mean normalised correlation of two grey views on ``where``."""
    x, y = a[where] - a[where].mean(), b[where] - b[where].mean()
    return float((x * y).sum() / max(np.sqrt((x * x).sum() * (y * y).sum()), 1e-9))


def _register(moving: np.ndarray, fixed: np.ndarray, skin: np.ndarray, motion: int) -> np.ndarray | None:
    """The 3×3 warp taking ``moving``'s view onto ``fixed``'s (ECC on ``skin``), or None when ECC fails,
    moves too far or does not raise the skin's correlation."""
    warp = np.eye(2, 3, dtype=np.float32)
    grey = [_grey(fixed), _grey(moving)]
    start = _correlation(grey[0], grey[1], skin)
    try:
        score, found = cv2.findTransformECC(grey[0], grey[1], warp, motion,
                                       (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, ECC_ITERATIONS, ECC_EPS),
                                       skin.astype(np.uint8), 5)
    except cv2.error:
        return None
    h = np.vstack([np.asarray(found, np.float64), [0, 0, 1]])
    inverse = np.linalg.inv(h)  # ECC's warp maps fixed's pixels to moving's: invert it
    if not np.isfinite(inverse).all() or np.hypot(*inverse[:2, 2]) > MAX_SHIFT * fixed.shape[1] or score <= start:
        return None
    return inverse


def align_views(images: list[np.ndarray], masks: list[np.ndarray], calibrations: list[Calibration | None],
                size: int = 220) -> list[AlignedView]:
    """The visits' views (in the order given), aligned as the module says. Calibrations count only when
    every visit has one (a mix of cm and pixels has no common scale)."""
    if not (len(images) == len(masks) == len(calibrations)):
        raise ValueError("align_views needs one image, mask and calibration per visit")
    metric = all(c is not None for c in calibrations)
    planes = [_plane(c) if metric else np.eye(3) for c in calibrations]
    centres: list[np.ndarray | None] = []
    radius = 0.0
    for mask, h in zip(masks, planes):
        ys, xs = np.nonzero(mask)
        if len(xs) == 0:
            centres.append(None)
            continue
        pts = _to_plane(h, np.stack([xs, ys], axis=1)[:: max(1, len(xs) // 2000)])
        centre = pts.mean(axis=0)
        centres.append(centre)
        radius = max(radius, float(np.linalg.norm(pts - centre, axis=1).max()))
    if radius == 0.0:
        radius = float(max(images[0].shape[:2])) / 4 if not metric else 2.0
    known = [c for c in centres if c is not None]
    half = radius * (1 + PAD)
    scale = np.array([[size / (2 * half), 0, size / 2], [0, size / (2 * half), size / 2], [0, 0, 1]])
    views: list[AlignedView] = []
    for image, mask, h, centre in zip(images, masks, planes, centres):
        c = centre if centre is not None else (known[0] if known else np.zeros(2))
        if not metric:  # pixels: the photo's own scale, around its wound
            c = c if centre is not None else np.array(image.shape[1::-1]) / 2
        move = scale @ np.array([[1, 0, -c[0]], [0, 1, -c[1]], [0, 0, 1]]) @ h
        view = cv2.warpPerspective(image, move, (size, size), flags=cv2.INTER_AREA, borderValue=(40, 40, 45))
        wound = cv2.warpPerspective(mask.astype(np.uint8), move, (size, size), flags=cv2.INTER_NEAREST) > 0
        method = ("marker plane" if metric and calibrations[0] is not None and calibrations[0].method == "marker" else
                  "ruler scale" if metric else "pixels") + ", wound centred"
        if views:
            before = views[-1]
            outside = cv2.warpPerspective(np.ones(image.shape[:2], np.uint8), move, (size, size)) > 0
            skin = outside & ~cv2.dilate(wound.astype(np.uint8) | before.mask.astype(np.uint8),
                                          np.ones((9, 9), np.uint8)).astype(bool)
            refine = (_register(view, before.image, skin, cv2.MOTION_EUCLIDEAN if metric else cv2.MOTION_AFFINE)
                      if skin.mean() > 0.2 else None)
            if refine is not None:
                move = refine @ move
                view = cv2.warpPerspective(image, move, (size, size), flags=cv2.INTER_AREA, borderValue=(40, 40, 45))
                wound = cv2.warpPerspective(mask.astype(np.uint8), move, (size, size), flags=cv2.INTER_NEAREST) > 0
                method += ", registered on the visit before (ECC)"
            else:
                method += " (registration not used)"
        views.append(AlignedView(view, wound, move, method))
    return views


def track_views(ws: Workspace, visits: list[tuple[str, int]], size: int = 220) -> list[AlignedView]:
    """:func:`align_views` of a track's visits ``(image_id, wound_index)`` in a workspace (each photo
    calibrated by its marker or ruler as the follow-up measures it)."""
    from annotations.followup import followup

    marker = followup.workspace_marker(ws)
    images, masks, calibrations = [], [], []
    for image_id, wound_index in visits:
        img = ws.store.image(image_id)
        assert img is not None, image_id  # a track's visits are the workspace's photos
        pixels = np.asarray(ws.load_image(image_id))
        images.append(pixels)
        masks.append(ws.load_mask(image_id) == wound_index)
        calibrations.append(followup.calibrate(pixels, img["metadata"], marker, f"photo {img['file']}"))
    return align_views(images, masks, calibrations, size)
