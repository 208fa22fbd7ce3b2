"""Synthetic wound photos for the outline-editor browser tests (not a test module)."""
from __future__ import annotations

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
