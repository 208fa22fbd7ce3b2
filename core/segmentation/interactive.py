"""Outline suggestions and click-to-outline, over the trained segmenter, GrabCut or Segment Anything.

- :func:`suggest_outlines`: one outline per connected component (4-connected, holes filled) of the
  segmenter's probability ≥ its threshold whose area reaches the workspace's ``min_wound_area``; a
  component that overlaps an existing outline or comes within :data:`TOUCH_PX` px of one is skipped
  whole (the model finding an outlined wound again), never trimmed into a rim around it.
- :func:`outline_from_click`: the component of the probability map under the click; ``exclude``
  clicks inside it split it by a marker watershed (Meyer 1994, OpenCV) and keep the clicked side.
  When the click lies on low probability, or no model is given (:func:`click_outline`), GrabCut (Rother et al.,
  SIGGRAPH 2004, OpenCV) is seeded at the click: a disc around it is foreground, a small window
  (a fifth of the photo's short side) probable foreground — GrabCut grows the wound out of it by
  colour, whereas a large window tends to be filled whole — and, when a segmenter exists, every
  pixel it gives probability ≥ :data:`GRABCUT_PROBABLE` as well; the rest is probable background,
  existing outlines and ``exclude`` clicks background.
- :class:`SamClicker`: the online choice, Segment Anything (Kirillov et al., ICCV 2023) with a
  checkpoint the user provides; the click is a positive point, ``exclude`` clicks negative ones.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image
from scipy import ndimage

from annotations.infra.workspace import Workspace
from core.runtime import pick_device
from core.segmentation.model import THRESHOLD, Segmenter, load_segmenter

GRABCUT_MAX_SIDE = 512
GRABCUT_ITERATIONS = 5
#: Half-side of GrabCut's probable-foreground window around the click, as a share of the photo's short side.
GRABCUT_WINDOW = 0.1
#: Segmenter probability from which a pixel seeds GrabCut as probable foreground.
GRABCUT_PROBABLE = 0.25
#: Segment Anything image-encoder width → registry entry; the width is read from this checkpoint tensor.
SAM_WIDTHS = {768: "vit_b", 1024: "vit_l", 1280: "vit_h"}
SAM_PATCH_KEY = "image_encoder.patch_embed.proj.weight"
#: A suggested component this close to an existing outline (px, 4-connected dilation) is skipped.
TOUCH_PX = 2


class SamUnavailable(RuntimeError):
    """Segment Anything cannot be used: package missing, checkpoint missing or not loadable."""


def wound_components(prob: np.ndarray, min_area: int, threshold: float = THRESHOLD) -> list[np.ndarray]:
    """Bool masks of the components of ``prob ≥ threshold`` (holes filled) of area ≥ ``min_area``, largest
    first."""
    fg = ndimage.binary_fill_holes(prob >= threshold)
    labels, n = ndimage.label(fg)
    areas = np.bincount(labels.ravel(), minlength=n + 1)
    keep = sorted((k for k in range(1, n + 1) if areas[k] >= min_area), key=lambda k: -areas[k])
    return [labels == k for k in keep]


def new_wound_components(prob: np.ndarray, min_area: int, existing: np.ndarray,
                         threshold: float = THRESHOLD) -> tuple[list[np.ndarray], int]:
    """(kept, skipped): the components of :func:`wound_components` (``existing`` not removed) that stay
    more than :data:`TOUCH_PX` px from every ``existing`` pixel, largest first, and how many were skipped
    because they overlap or touch an existing outline."""
    comps = wound_components(prob, min_area, threshold=threshold)
    if not existing.any():
        return comps, 0
    near = ndimage.binary_dilation(existing, iterations=TOUCH_PX)
    kept = [c for c in comps if not (c & near).any()]
    return kept, len(comps) - len(kept)


def suggest_outlines_by(ws: Workspace, image_id: str,
                        segmenter: Segmenter | None = None) -> tuple[list[np.ndarray], int]:
    """(suggestions, skipped) of :func:`suggest_outlines`: ``skipped`` counts the wounds the model found on or
    beside the photo's existing outlines, which are not suggested."""
    segmenter = segmenter or load_segmenter(ws)
    existing = ws.load_mask(image_id) > 0
    return new_wound_components(segmenter.probability(ws.load_image(image_id)), ws.min_wound_area, existing,
                                segmenter.threshold)


def suggest_outlines(ws: Workspace, image_id: str, segmenter: Segmenter | None = None) -> list[np.ndarray]:
    """Suggested wound outlines of a photo (bool H×W each), never on or beside its existing outlines;
    ``segmenter=None`` uses the workspace's latest trained segmenter, else the default one shipped with the
    package."""
    return suggest_outlines_by(ws, image_id, segmenter)[0]


def component_at(mask: np.ndarray, x: int, y: int) -> np.ndarray:
    """The 4-connected component of ``mask`` containing pixel (x, y); all False when (x, y) is outside it."""
    if not mask[y, x]:
        return np.zeros(mask.shape, bool)
    labels, _ = ndimage.label(mask)
    return labels == labels[y, x]


def _disc(shape: tuple[int, int], x: int, y: int, r: int) -> np.ndarray:
    yy, xx = np.ogrid[: shape[0], : shape[1]]
    return (xx - x) ** 2 + (yy - y) ** 2 <= r * r


def split_at(rgb: np.ndarray, region: np.ndarray, x: int, y: int, exclude: Sequence[tuple[int, int]]) -> np.ndarray:
    """The part of ``region`` a marker watershed on the photo gives to (x, y) rather than to ``exclude``."""
    inside = [(ex, ey) for ex, ey in exclude if region[ey, ex]]
    if not inside:
        return region
    markers = np.where(region, 0, 2).astype(np.int32)
    for ex, ey in inside:
        markers[_disc(region.shape, ex, ey, 2) & region] = 2
    markers[_disc(region.shape, x, y, 2) & region] = 1
    cv2.watershed(np.ascontiguousarray(rgb[..., ::-1]), markers)
    return component_at((markers == 1) & region, x, y)


def grabcut_outline(rgb: np.ndarray, x: int, y: int, exclude: Sequence[tuple[int, int]] = (),
                    existing: np.ndarray | None = None, prob: np.ndarray | None = None) -> np.ndarray:
    """GrabCut seeded at the click and, when given, by the segmenter's probability map (on a copy at most
    :data:`GRABCUT_MAX_SIDE` px); the clicked component."""
    h, w = rgb.shape[:2]
    scale = min(1.0, GRABCUT_MAX_SIDE / max(h, w))
    small = cv2.resize(rgb, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)
    sh, sw = small.shape[:2]
    sx, sy = min(sw - 1, int(x * scale)), min(sh - 1, int(y * scale))
    r = max(8, round(GRABCUT_WINDOW * min(sh, sw)))
    mask = np.full((sh, sw), cv2.GC_PR_BGD, np.uint8)
    if prob is not None:
        mask[cv2.resize(prob, (sw, sh), interpolation=cv2.INTER_LINEAR) >= GRABCUT_PROBABLE] = cv2.GC_PR_FGD
    mask[max(0, sy - r): sy + r + 1, max(0, sx - r): sx + r + 1] = cv2.GC_PR_FGD
    if existing is not None and existing.any():
        mask[cv2.resize(existing.astype(np.uint8), (sw, sh), interpolation=cv2.INTER_NEAREST) > 0] = cv2.GC_BGD
    seed = max(2, r // 8)
    for ex, ey in exclude:
        mask[_disc((sh, sw), int(ex * scale), int(ey * scale), seed)] = cv2.GC_BGD
    mask[_disc((sh, sw), sx, sy, seed)] = cv2.GC_FGD
    bgd, fgd = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
    # OpenCV's stubs require a rect; with GC_INIT_WITH_MASK it is unused and None is what OpenCV documents
    cv2.grabCut(np.ascontiguousarray(small[..., ::-1]), mask, None, bgd, fgd, GRABCUT_ITERATIONS,  # type: ignore[call-overload]
                cv2.GC_INIT_WITH_MASK)
    fg = ((mask == cv2.GC_FGD) | (mask == cv2.GC_PR_FGD)).astype(np.uint8)
    fg = cv2.resize(fg, (w, h), interpolation=cv2.INTER_NEAREST) > 0
    if existing is not None:
        fg &= ~existing
    return ndimage.binary_fill_holes(component_at(fg, x, y)) & (~existing if existing is not None else True)


class SamClicker:
    """Segment Anything with a user-provided checkpoint; :meth:`outline` answers a click like the segmenter."""

    def __init__(self, checkpoint_path: str | Path, device: torch.device | str | None = None) -> None:
        try:
            from segment_anything import SamPredictor, sam_model_registry
        except ImportError:
            raise SamUnavailable("Segment Anything needs the 'segment-anything' package "
                                 "(pip install segment-anything, or pip install 'triderm-studio[sam]')") from None
        path = Path(checkpoint_path)
        if not path.is_file():
            raise SamUnavailable(f"Segment Anything checkpoint not found: {path} (download one of the "
                                 "sam_vit_b/l/h checkpoints of the Segment Anything project)")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # any unreadable file is the same user error
            raise SamUnavailable(f"{path}: not a loadable Segment Anything checkpoint ({e})") from None
        patch = state.get(SAM_PATCH_KEY) if isinstance(state, dict) else None
        model_type = SAM_WIDTHS.get(int(patch.shape[0])) if isinstance(patch, torch.Tensor) and patch.ndim else None
        if model_type is None:
            raise SamUnavailable(f"{path}: not a loadable Segment Anything checkpoint (no {SAM_PATCH_KEY} of width "
                                 f"{'/'.join(map(str, SAM_WIDTHS))}, as in sam_vit_b/l/h)")
        model = sam_model_registry[model_type]()
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            raise SamUnavailable(f"{path}: not a loadable Segment Anything {model_type} checkpoint "
                                 f"({str(e).splitlines()[0]} …)") from None
        self.model_type = model_type
        self.predictor = SamPredictor(model.to(pick_device() if device is None else device).eval())
        self._image_key: str | None = None

    def outline(self, image: Image.Image, x: int, y: int, exclude: Sequence[tuple[int, int]] = ()) -> np.ndarray:
        """Bool (H, W) mask of the best-scoring of SAM's masks for the click (+ negative ``exclude`` points)."""
        rgb = np.ascontiguousarray(np.asarray(image.convert("RGB")))
        key = hashlib.sha1(rgb.tobytes()).hexdigest() + str(rgb.shape)
        if key != self._image_key:
            self.predictor.set_image(rgb)
            self._image_key = key
        points = np.array([(x, y), *exclude], dtype=np.float32)
        labels = np.array([1] + [0] * len(exclude))
        masks, scores, _ = self.predictor.predict(point_coords=points, point_labels=labels, multimask_output=True)
        return np.asarray(masks[int(np.argmax(scores))], bool)


#: What proposed a click outline (:func:`click_outline_by`), in the words the page shows.
BY_SAM, BY_MODEL, BY_GRABCUT = "Segment Anything", "the wound model", "GrabCut (colour contrast, not a wound model)"


def click_outline_by(image: Image.Image, x: int, y: int, segmenter: Segmenter | SamClicker | None = None,
                     exclude: Sequence[tuple[int, int]] = (),
                     existing: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """(mask, method): :func:`click_outline` and which method proposed it — :data:`BY_SAM`,
    :data:`BY_MODEL` (the click is on the segmenter's wound pixels) or :data:`BY_GRABCUT` (no
    segmenter, or the segmenter sees no wound under the click)."""
    w, h = image.size
    for px, py in [(x, y), *exclude]:
        if not (0 <= px < w and 0 <= py < h):
            raise ValueError(f"click ({px}, {py}) is outside the {w}×{h} photo")
    existing = np.zeros((h, w), bool) if existing is None else existing
    if existing[y, x]:
        return np.zeros((h, w), bool), (BY_SAM if isinstance(segmenter, SamClicker)
                                        else BY_MODEL if segmenter is not None else BY_GRABCUT)
    rgb = np.asarray(image.convert("RGB"))
    if isinstance(segmenter, SamClicker):
        mask = segmenter.outline(image, x, y, exclude) & ~existing
        return component_at(mask, x, y), BY_SAM
    prob = None
    if segmenter is not None:
        prob = segmenter.probability(image)
        fg = ndimage.binary_fill_holes(prob >= segmenter.threshold) & ~existing
        if fg[y, x]:
            return split_at(rgb, component_at(fg, x, y), x, y, exclude), BY_MODEL
    return grabcut_outline(rgb, x, y, exclude, existing, prob), BY_GRABCUT


def click_outline(image: Image.Image, x: int, y: int, segmenter: Segmenter | SamClicker | None = None,
                  exclude: Sequence[tuple[int, int]] = (), existing: np.ndarray | None = None) -> np.ndarray:
    """The wound under the click (x = column, y = row) as a bool mask; see :func:`outline_from_click`."""
    return click_outline_by(image, x, y, segmenter, exclude, existing)[0]


def outline_from_click(ws: Workspace, image_id: str, x: int, y: int,
                       segmenter: Segmenter | SamClicker | None = None,
                       exclude: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """Outline of the wound clicked at (x, y) on a workspace photo, never over its existing outlines.

    ``segmenter=None`` uses the workspace's latest trained segmenter, else the default one shipped with the package.
    """
    return outline_from_click_by(ws, image_id, x, y, segmenter, exclude)[0]


def outline_from_click_by(ws: Workspace, image_id: str, x: int, y: int,
                          segmenter: Segmenter | SamClicker | None = None,
                          exclude: Sequence[tuple[int, int]] = ()) -> tuple[np.ndarray, str]:
    """(mask, method) of :func:`outline_from_click`: the method says what proposed the outline."""
    segmenter = segmenter if segmenter is not None else load_segmenter(ws)
    return click_outline_by(ws.load_image(image_id), int(x), int(y), segmenter,
                            [(int(a), int(b)) for a, b in exclude], ws.load_mask(image_id) > 0)
