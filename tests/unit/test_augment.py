"""Joint image + mask augmentation: alignment, wound-keeping crops, reproducibility."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from core.vision.augment import AugmentConfig, WoundAugment, nonempty_crop_box, view_generator

GEOMETRY_ONLY = AugmentConfig(brightness=0, contrast=0, saturation=0, hue=0, noise_p=0, blur_p=0)


def _photo(h: int = 300, w: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Grey photo; wound 1 an ellipse with a red painted marker (a square inside it), wound 2 small."""
    img = np.full((h, w, 3), 128, np.uint8)
    labels = np.zeros((h, w), np.int32)
    yy, xx = np.mgrid[:h, :w]
    labels[((yy - 150) / 60) ** 2 + ((xx - 200) / 90) ** 2 <= 1] = 1
    labels[20:30, 350:362] = 2
    img[135:165, 185:215] = (255, 0, 0)
    return img, labels


def test_painted_marker_stays_inside_the_mask():
    img, labels = _photo()
    aug = WoundAugment(GEOMETRY_ONLY)
    seen = 0
    for v in range(24):
        x, m = aug(img, labels, view_generator("marker", aug.config, v))
        red = (x[0] > 0.9) & (x[1] < 0.1) & (x[2] < 0.1)  # unmistakably marker
        if red.sum() == 0:
            continue  # the crop may leave the marker out (it keeps *some* wound pixels)
        seen += 1
        assert (m[red] == 1).float().mean() > 0.98
    assert seen >= 10


def test_crops_are_never_wound_empty():
    img = np.full((500, 500, 3), 90, np.uint8)
    labels = np.zeros((500, 500), np.int32)
    labels[2:6, 492:497] = 1  # a tiny wound in a corner
    aug = WoundAugment()
    for v in range(30):
        x, m = aug(img, labels, view_generator("corner", aug.config, v))
        assert x.shape == (3, 224, 224) and m.shape == (224, 224)
        assert (m > 0).any()
        assert set(m.unique().tolist()) <= {0, 1}
        assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


def test_views_are_reproducible_and_distinct():
    img, labels = _photo()
    aug = WoundAugment()
    a = aug(img, labels, view_generator("sha", aug.config, 3))
    b = aug(img, labels, view_generator("sha", aug.config, 3))
    c = aug(img, labels, view_generator("sha", aug.config, 4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    assert AugmentConfig().key() != AugmentConfig(degrees=10).key()


def test_crop_box_contains_a_wound_pixel_and_rejects_empty_masks():
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(1, 256, 256, dtype=torch.long)
    mask[0, 250, 3] = 1
    for _ in range(20):
        y0, x0 = nonempty_crop_box(mask, 224, g)
        assert y0 <= 250 < y0 + 224 and x0 <= 3 < x0 + 224 and y0 + 224 <= 256 and x0 + 224 <= 256
    assert nonempty_crop_box(torch.zeros(1, 256, 256), 224, g) is None
    with pytest.raises(ValueError, match="no wound pixels"):
        WoundAugment()(np.zeros((50, 50, 3), np.uint8), np.zeros((50, 50), np.int32))
    with pytest.raises(ValueError, match="resize"):
        AugmentConfig(resize=200)
