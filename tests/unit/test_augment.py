"""Joint image + mask augmentation: alignment, wound-keeping crops, reproducibility, batched = one at a time."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.vision.augment import AugmentConfig, WoundAugment, view_generator

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


def test_a_lone_wound_pixel_near_the_edge_is_kept_and_empty_masks_are_refused():
    img = np.full((256, 256, 3), 90, np.uint8)
    labels = np.zeros((256, 256), np.int32)
    labels[250, 3] = 1  # one wound pixel: most affines push it out or round it onto skin
    aug = WoundAugment(AugmentConfig(resize=256))
    prepared = aug.prepare(img, labels)
    _, m = aug.views(*prepared, [view_generator("lone", aug.config, v) for v in range(40)])
    assert m.shape == (40, 224, 224) and bool((m.flatten(1) == 1).any(1).all())
    with pytest.raises(ValueError, match="no wound pixels"):
        WoundAugment()(np.zeros((50, 50, 3), np.uint8), np.zeros((50, 50), np.int32))
    with pytest.raises(ValueError, match="resize"):
        AugmentConfig(resize=200)


def test_flips_and_rotations_move_the_mask_with_the_image():
    """Geometry only: every pixel painted red is wound 1 in the view's mask and every wound-1 pixel is red
    (bilinear edges aside), whatever flips, rotation, scale, shift and crop the view drew."""
    img = np.full((256, 256, 3), 128, np.uint8)
    labels = np.zeros((256, 256), np.int32)
    labels[40:120, 150:230] = 1  # an off-centre square: a flip or rotation moves it far
    img[labels == 1] = (255, 0, 0)
    aug = WoundAugment(AugmentConfig(resize=256, brightness=0, contrast=0, saturation=0, hue=0, noise_p=0,
                                     blur_p=0))
    x, m = aug.views(*aug.prepare(img, labels), [view_generator("flip", aug.config, v) for v in range(16)])
    red = (x[:, 0] > 0.99) & (x[:, 1] < 0.01)
    grey = (x - 128 / 255).abs().amax(1) < 1e-3
    assert bool((m[red] == 1).all()) and bool((m[grey] == 0).all())
    assert float(red.sum()) > 0.9 * float((m == 1).sum())
    centres = [tuple(torch.nonzero(v == 1).float().mean(0).round().tolist()) for v in m]
    assert len(set(centres)) > 8  # the views really moved the wound around


def test_the_blur_is_a_reflect_padded_depthwise_gaussian():
    """The shifted multiply-adds of ``_blur`` against ``conv2d`` with each image's separable kernel."""
    aug = WoundAugment()
    x = torch.rand(3, 3, 40, 33, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.1, 0.7, 1.5])
    half = aug.config.blur_kernel // 2
    t = torch.arange(-half, half + 1, dtype=torch.float32)
    blurred = aug._blur(x, sigma)
    for image, s, got in zip(x, sigma, blurred):
        k = torch.exp(-t ** 2 / (2 * s ** 2))
        k = (k / k.sum()).expand(3, -1)
        y = F.pad(image[None], (half,) * 4, mode="reflect")
        y = F.conv2d(F.conv2d(y, k[:, None, :, None], groups=3), k[:, None, None, :], groups=3)[0]
        assert torch.allclose(got, y, atol=1e-6)


def test_batched_views_equal_the_same_views_one_at_a_time():
    img, labels = _photo()
    aug = WoundAugment()
    prepared = aug.prepare(img, labels)
    x, m = aug.views(*prepared, [view_generator("batch", aug.config, v) for v in range(12)])
    for v in (0, 5, 11):
        one_x, one_m = aug.augment_prepared(*prepared, view_generator("batch", aug.config, v))
        assert torch.allclose(one_x, x[v], atol=1e-6) and torch.equal(one_m, m[v])
    assert not torch.equal(x[0], x[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_views_are_made_on_the_device_of_the_backbone():
    img, labels = _photo()
    aug = WoundAugment()
    prepared = aug.prepare(img, labels)
    gens = [view_generator("cuda", aug.config, v) for v in range(8)]
    x, m = aug.views(*prepared, gens, device="cuda")
    assert x.device.type == "cuda" and m.device.type == "cuda"
    _, cm = aug.views(*prepared, [view_generator("cuda", aug.config, v) for v in range(8)])
    assert float((cm != m.cpu()).float().mean()) < 1e-3  # same geometry (rounding at the odd edge pixel)
    assert bool((m.flatten(1) > 0).any(1).all())
