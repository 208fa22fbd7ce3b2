"""Synthetic wound photos and outline-editor helpers for the browser tests (not a test module)."""
from __future__ import annotations

import re

import numpy as np
from PIL import Image, ImageDraw


def wound_photo(seed: int, blobs: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """A 320×240 skin-coloured photo with dark red elliptic wounds, and its label map."""
    rng = np.random.default_rng(seed)
    img = np.full((240, 320, 3), (214, 170, 150), np.uint8) + rng.integers(0, 12, (240, 320, 3), dtype=np.uint8)
    mask = Image.new("L", (320, 240), 0)
    for n, box in enumerate(blobs, start=1):
        ImageDraw.Draw(mask).ellipse(box, fill=n)
    labels = np.asarray(mask)
    img[labels > 0] = (150, 40, 40)
    return img, labels


def to_screen(pg, x: float, y: float) -> tuple[float, float]:
    """Screen position of photo coordinates (x, y), through the outline editor's current zoom and pan."""
    return tuple(pg.locator(".oe svg").evaluate(
        "(svg, [x, y]) => { const p = svg.createSVGPoint(); p.x = x; p.y = y;"
        " const q = p.matrixTransform(svg.getScreenCTM()); return [q.x, q.y]; }", [x, y]))


def tool(pg, name: str):
    """The outline editor's toolbar button labelled exactly ``name``."""
    return pg.locator(".oe .bar button", has_text=re.compile(rf"^{re.escape(name)}$"))
