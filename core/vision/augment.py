"""Joint photo + wound-label-mask augmentation for TriDerm-V (paper §3.2, METHODS.md §1).

Pipeline (``torchvision.transforms.v2``; the label map is a ``tv_tensors.Mask`` so every
geometric op moves it with the image, always with nearest interpolation):

1. resize to ``resize``×``resize`` (square, like inference);
2. random horizontal / vertical flips;
3. ``RandomAffine``: shift, scale, rotation (fill 0 = skin in the mask);
4. non-empty random crop to ``size``: the window is drawn uniformly among the windows
   that contain one uniformly drawn wound pixel, so the crop always keeps wound pixels
   (if the affine pushed every wound out, the affine is redrawn; after ``max_tries``
   the view falls back to flips only);
5. image only: colour jitter (brightness, contrast, saturation, hue), Gaussian noise,
   Gaussian blur.

Views are reproducible: :func:`view_generator` seeds each view from (run seed, image sha256,
config hash, view index), which is what the feature cache keys on.

:func:`crop_views` is the SimCLR-style view of ready-made wound crops (no mask) used by the
image–text training's unimodal term: random resized square crop, horizontal flip, colour jitter.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2


@dataclass(frozen=True)
class AugmentConfig:
    """Augmentation parameters; :meth:`key` hashes them for the feature cache."""

    size: int = 224
    resize: int = 256
    hflip: float = 0.5
    vflip: float = 0.5
    degrees: float = 30.0
    translate: float = 0.1
    scale: tuple[float, float] = (0.85, 1.15)
    brightness: float = 0.25
    contrast: float = 0.25
    saturation: float = 0.2
    hue: float = 0.03
    noise_p: float = 0.5
    noise_sigma: float = 0.03
    blur_p: float = 0.3
    blur_kernel: int = 5
    blur_sigma: tuple[float, float] = (0.1, 1.5)
    max_tries: int = 10

    def __post_init__(self) -> None:
        if self.resize < self.size:
            raise ValueError(f"resize ({self.resize}) must be ≥ crop size ({self.size})")
        if self.blur_kernel % 2 == 0:
            raise ValueError(f"blur_kernel must be odd, got {self.blur_kernel}")

    def key(self) -> str:
        """Short stable hash of the configuration (part of the cache key)."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def view_generator(image_sha256: str, config: AugmentConfig, view: int, seed: int = 0) -> torch.Generator:
    """Deterministic RNG for view ``view`` of a photo under ``config`` in a run seeded ``seed``."""
    digest = hashlib.sha256(f"{seed}:{image_sha256}:{config.key()}:{view}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def to_tensors(image: Image.Image | np.ndarray, labels: np.ndarray) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
    """RGB photo + H×W integer label map → (uint8 3×H×W Image, int64 1×H×W Mask)."""
    arr = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected an RGB image H×W×3, got shape {arr.shape}")
    if labels.shape != arr.shape[:2]:
        raise ValueError(f"mask shape {labels.shape} differs from image shape {arr.shape[:2]}")
    img = tv_tensors.Image(torch.from_numpy(np.array(arr, dtype=np.uint8)).permute(2, 0, 1))
    mask = tv_tensors.Mask(torch.from_numpy(labels.astype(np.int64))[None])
    return img, mask


def nonempty_crop_box(mask: Tensor, size: int, generator: torch.Generator) -> tuple[int, int] | None:
    """Top-left (y, x) of a ``size`` window containing a random wound pixel; None if no wound."""
    ys, xs = torch.nonzero(mask.reshape(mask.shape[-2:]) > 0, as_tuple=True)
    if ys.numel() == 0:
        return None
    h, w = mask.shape[-2:]
    i = int(torch.randint(ys.numel(), (1,), generator=generator))
    py, px = int(ys[i]), int(xs[i])
    y_lo, y_hi = max(0, py - size + 1), min(py, h - size)
    x_lo, x_hi = max(0, px - size + 1), min(px, w - size)
    y0 = int(torch.randint(y_lo, y_hi + 1, (1,), generator=generator))
    x0 = int(torch.randint(x_lo, x_hi + 1, (1,), generator=generator))
    return y0, x0


class WoundAugment:
    """Callable ``(image, labels, generator) -> (float image 3×S×S in [0,1], int64 labels S×S)``."""

    def __init__(self, config: AugmentConfig | None = None) -> None:
        self.config = c = config or AugmentConfig()
        self.resize = v2.Resize((c.resize, c.resize), antialias=True)
        self.flips = v2.Compose([v2.RandomHorizontalFlip(c.hflip), v2.RandomVerticalFlip(c.vflip)])
        self.affine = v2.RandomAffine(degrees=c.degrees, translate=(c.translate, c.translate),
                                      scale=c.scale, fill={tv_tensors.Image: 0, tv_tensors.Mask: 0})
        self.photometric = v2.Compose([
            v2.ColorJitter(brightness=c.brightness, contrast=c.contrast, saturation=c.saturation, hue=c.hue),
            v2.ToDtype(torch.float32, scale=True),
            v2.RandomApply([v2.GaussianNoise(sigma=c.noise_sigma, clip=True)], p=c.noise_p),
            v2.RandomApply([v2.GaussianBlur(c.blur_kernel, sigma=c.blur_sigma)], p=c.blur_p),
        ])

    def prepare(self, image: Image.Image | np.ndarray, labels: np.ndarray) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        """Convert and resize once (shared by all views of a photo)."""
        img, mask = to_tensors(image, labels)
        if not (mask > 0).any():
            raise ValueError("cannot make a wound-keeping crop: the mask has no wound pixels")
        return self.resize(img, mask)

    def augment_prepared(self, img: tv_tensors.Image, mask: tv_tensors.Mask,
                         generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """One random view of a :meth:`prepare`-d photo."""
        c = self.config
        gen = generator if generator is not None else torch.Generator().manual_seed(
            int(torch.randint(2**62, (1,))))
        # torchvision v2 draws from the global RNG: fork it and seed it from ``gen``.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(2**62, (1,), generator=gen)))
            img, mask = self.flips(img, mask)
            box = None
            for _ in range(c.max_tries):
                a_img, a_mask = self.affine(img, mask)
                box = nonempty_crop_box(a_mask, c.size, gen)
                if box is not None:
                    img, mask = a_img, a_mask
                    break
            if box is None:  # every affine lost the wounds: keep the flipped, un-warped view
                box = nonempty_crop_box(mask, c.size, gen)
                assert box is not None  # prepare() refuses a mask without wound pixels
            y0, x0 = box
            img = img[:, y0:y0 + c.size, x0:x0 + c.size]
            mask = mask[:, y0:y0 + c.size, x0:x0 + c.size]
            out = self.photometric(tv_tensors.Image(img))
        return out.as_subclass(Tensor), mask[0].as_subclass(Tensor)

    def __call__(self, image: Image.Image | np.ndarray, labels: np.ndarray,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Augment ``image`` and its label map together; returns the tensors."""
        return self.augment_prepared(*self.prepare(image, labels), generator)


def crop_views(crops: Tensor, generator: torch.Generator, scale: tuple[float, float] = (0.5, 1.0),
               jitter: float = 0.3) -> Tensor:
    """One SimCLR-style view of each float crop B×3×S×S in [0, 1] (torchvision v2, parameters drawn
    per crop, reproducible from ``generator``): a random square crop of ``scale`` of the area resized
    back to S, a horizontal flip (p = 0.5), brightness/contrast/saturation jitter of ±``jitter``."""
    side = crops.shape[-1]
    view = v2.Compose([v2.RandomResizedCrop(side, scale=scale, ratio=(1.0, 1.0), antialias=True),
                       v2.RandomHorizontalFlip(0.5),
                       v2.ColorJitter(brightness=jitter, contrast=jitter, saturation=jitter)])
    with torch.random.fork_rng(devices=[]):  # torchvision v2 draws from the global RNG
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        return torch.stack([view(x) for x in crops])
