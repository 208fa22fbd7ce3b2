"""Joint photo + wound-label-mask augmentation for TriDerm-V (paper §3.2, METHODS.md §1).

A photo is converted and resized once (:meth:`WoundAugment.prepare`: ``resize``×``resize``, square
like inference; the label map with nearest interpolation). Its K views are then made as ONE batch
of tensor ops (:meth:`WoundAugment.views`) on the device of the caller's choice:

1. geometry, one composed affine map per view sampled by ``F.grid_sample`` (the grid ``F.affine_grid`` would make, as broadcast sums)
   (image bilinear, label map nearest, so the mask moves with the image; fill 0 = skin):
   horizontal / vertical flips, then shift, scale and rotation about the centre, then a non-empty
   crop to ``size``: the window is drawn uniformly among the windows that contain one uniformly
   drawn wound pixel of the warped mask, so the crop always keeps wound pixels (if the affine pushed
   every wound out, it is redrawn; after ``max_tries`` the view falls back to flips only);
2. image only, batched with per-view factors: colour jitter (brightness, contrast, saturation and a
   hue rotation about the grey axis, composed into one 3×3 colour matrix and offset per view, clamped
   to [0, 1] once), Gaussian noise, Gaussian blur (separable, reflect padding).

Every random parameter of view *v* is drawn on the CPU from its own generator
(:func:`view_generator`: run seed, image sha256, config hash, view index — what the feature
cache keys on), so a view is the same whether it is made alone or in a batch, and on any device
(the noise is drawn on the image's device from a seed of the view's generator).

:func:`crop_views` is the SimCLR-style view of ready-made wound crops (no mask) used by the
image–text training's unimodal term: random resized square crop, horizontal flip, colour jitter.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2

#: Luma weights of torchvision's grayscale (contrast, saturation).
GREY = (0.299, 0.587, 0.114)
#: Wound pixels tried per affine draw (a uniform sample: the crop's pixel is uniform among those that land).
WOUND_SAMPLE = 256
#: RGB → YIQ; a hue shift is a rotation of the (I, Q) chroma plane.
_YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_YIQ_INV = np.linalg.inv(_YIQ)


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
        return self._key

    @cached_property
    def _key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def view_generator(image_sha256: str, config: AugmentConfig, view: int, seed: int = 0) -> torch.Generator:
    """Deterministic RNG for view ``view`` of a photo under ``config`` in a run seeded ``seed``."""
    digest = hashlib.sha256(f"{seed}:{image_sha256}:{config.key()}:{view}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def to_tensors(image: Image.Image | np.ndarray, labels: np.ndarray) -> tuple[Tensor, Tensor]:
    """RGB photo + H×W integer label map → (uint8 3×H×W, int32 H×W)."""
    arr = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected an RGB image H×W×3, got shape {arr.shape}")
    if labels.shape != arr.shape[:2]:
        raise ValueError(f"mask shape {labels.shape} differs from image shape {arr.shape[:2]}")
    img = torch.from_numpy(np.array(arr, dtype=np.uint8)).permute(2, 0, 1)
    return img, torch.from_numpy(labels.astype(np.int32))


@dataclass
class ViewParams:
    """The drawn parameters of K views (CPU tensors)."""

    theta: Tensor        # K×2×3 affine_grid matrices (output → input, normalised coordinates)
    colour: Tensor       # K×3×3 colour matrices
    offset: Tensor       # K: (1 − contrast)·brightness, times the view's mean grey, added to every channel
    noise_seed: list[int | None]
    blur_sigma: Tensor   # K, 0 = no blur


def _translation(dx: float, dy: float) -> np.ndarray:
    return np.array([[1.0, 0.0, dx], [0.0, 1.0, dy], [0.0, 0.0, 1.0]])


def _to_pixels(side: int) -> np.ndarray:
    """Normalised (align_corners=False) → pixel coordinates of a ``side`` px axis."""
    return np.array([[side / 2, 0.0, (side - 1) / 2], [0.0, side / 2, (side - 1) / 2], [0.0, 0.0, 1.0]])


def hue_matrix(hue: float) -> np.ndarray:
    """3×3 RGB matrix rotating the YIQ chroma by ``hue`` turns (greys unchanged)."""
    a = 2 * math.pi * hue
    rot = np.array([[1.0, 0.0, 0.0], [0.0, math.cos(a), -math.sin(a)], [0.0, math.sin(a), math.cos(a)]])
    return _YIQ_INV @ rot @ _YIQ


def _uniform(gen: torch.Generator, n: int) -> np.ndarray:
    return torch.rand(n, generator=gen, dtype=torch.float64).numpy()


class WoundAugment:
    """Views of a photo and its label map: :meth:`views` (a batch) or ``__call__`` (one view)."""

    def __init__(self, config: AugmentConfig | None = None) -> None:
        self.config = c = config or AugmentConfig()
        self.resize = v2.Resize((c.resize, c.resize), antialias=True)
        r = c.resize
        self._flip = {(h, v): np.array([[-1.0 if h else 1.0, 0.0, r - 1.0 if h else 0.0],
                                        [0.0, -1.0 if v else 1.0, r - 1.0 if v else 0.0], [0.0, 0.0, 1.0]])
                      for h in (False, True) for v in (False, True)}
        self._to_norm = np.linalg.inv(_to_pixels(r))
        self._from_out = _to_pixels(c.size)

    def prepare(self, image: Image.Image | np.ndarray, labels: np.ndarray) -> tuple[Tensor, Tensor]:
        """Convert and resize once (shared by all views of a photo): (uint8 3×R×R, int32 R×R)."""
        img, mask = to_tensors(image, labels)
        if not (mask > 0).any():
            raise ValueError("cannot make a wound-keeping crop: the mask has no wound pixels")
        img, mask = self.resize(tv_tensors.Image(img), tv_tensors.Mask(mask[None]))
        return img.as_subclass(Tensor), mask[0].as_subclass(Tensor)

    def _geometry(self, wound: np.ndarray, mask: np.ndarray, gen: torch.Generator) -> np.ndarray:
        """3×3 map from a view's output pixels to the resized photo's pixels (flips, affine, crop);
        ``wound``: 2×N wound pixel coordinates (x; y) of the R×R ``mask``."""
        c, r = self.config, self.config.resize
        flip_u = _uniform(gen, 2)
        flip = self._flip[(bool(flip_u[0] < c.hflip), bool(flip_u[1] < c.vflip))]
        centre = (r - 1) / 2
        warp, q = None, None
        for _ in range(c.max_tries):
            # a uniform sample of the wound pixels after the flips
            pick = wound[:, torch.randint(wound.shape[1], (WOUND_SAMPLE,), generator=gen).numpy()]
            u = _uniform(gen, 4)
            angle = math.radians((2 * u[0] - 1) * c.degrees)
            shift = (2 * u[1:3] - 1) * c.translate * r
            s = c.scale[0] + u[3] * (c.scale[1] - c.scale[0])
            cos, sin = s * math.cos(angle), s * math.sin(angle)
            rot = np.array([[cos, -sin, 0.0], [sin, cos, 0.0], [0.0, 0.0, 1.0]])
            fwd = _translation(centre + shift[0], centre + shift[1]) @ rot @ _translation(-centre, -centre) @ flip
            q = np.round(fwd[:2, :2] @ pick + fwd[:2, 2:])  # where the wound pixels land
            # keep the landing pixels inside the canvas whose nearest source pixel is a wound pixel
            inv = np.linalg.inv(fwd)
            src = np.round(inv[:2, :2] @ q + inv[:2, 2:]).astype(np.int64)
            ok = ((q >= 0) & (q <= r - 1)).all(0) & ((src >= 0) & (src <= r - 1)).all(0)
            ok[ok] = mask[src[1, ok], src[0, ok]] > 0
            if ok.any():
                warp, q = inv, q[:, ok]
                break
        if warp is None or q is None:  # every affine lost the wounds: keep the flipped, un-warped view
            warp, q = flip, flip[:2, :2] @ wound + flip[:2, 2:]  # a flip is its own inverse
        i = int(torch.randint(q.shape[1], (1,), generator=gen))
        px, py = int(q[0, i]), int(q[1, i])
        y0 = int(torch.randint(max(0, py - c.size + 1), min(py, r - c.size) + 1, (1,), generator=gen))
        x0 = int(torch.randint(max(0, px - c.size + 1), min(px, r - c.size) + 1, (1,), generator=gen))
        return warp @ _translation(x0, y0)

    def _colour(self, gen: torch.Generator) -> tuple[np.ndarray, float]:
        """(3×3 colour matrix, offset factor) of brightness · contrast · saturation · hue jitter."""
        c = self.config
        u = _uniform(gen, 4)
        b, k, s = (max(0.0, 1 - f) + x * (1 + f - max(0.0, 1 - f))
                   for f, x in zip((c.brightness, c.contrast, c.saturation), u[:3]))
        sat = s * np.eye(3) + (1 - s) * np.broadcast_to(np.array(GREY), (3, 3))
        return k * b * hue_matrix((2 * u[3] - 1) * c.hue) @ sat, (1 - k) * b

    def draw(self, mask: Tensor, generators: Sequence[torch.Generator]) -> ViewParams:
        """Draw every view's parameters from its own generator (``mask``: the prepared R×R label map)."""
        c = self.config
        lab = mask.cpu().numpy()
        ys, xs = np.nonzero(lab > 0)
        wound = np.stack([xs, ys]).astype(np.float64)
        thetas, colours, offsets, seeds, sigmas = [], [], [], [], []
        for gen in generators:
            thetas.append((self._to_norm @ self._geometry(wound, lab, gen) @ self._from_out)[:2])
            colour, offset = self._colour(gen)
            colours.append(colour)
            offsets.append(offset)
            u = _uniform(gen, 3)
            seeds.append(int(torch.randint(2**62, (1,), generator=gen)) if u[0] < c.noise_p else None)
            sigmas.append(c.blur_sigma[0] + u[2] * (c.blur_sigma[1] - c.blur_sigma[0]) if u[1] < c.blur_p else 0.0)
        return ViewParams(torch.from_numpy(np.stack(thetas)).float(), torch.from_numpy(np.stack(colours)).float(),
                          torch.tensor(offsets, dtype=torch.float32), seeds, torch.tensor(sigmas, dtype=torch.float32))

    def render(self, img: Tensor, mask: Tensor, p: ViewParams) -> tuple[Tensor, Tensor]:
        """The views ``p`` of a prepared photo, on ``img``'s device: (K×3×S×S float in [0, 1], K×S×S int32)."""
        c, dev = self.config, img.device
        k, s = p.theta.shape[0], c.size
        x, m = self._warp(img.float().div_(255), mask.float(), p.theta.to(dev))
        grey = torch.tensor(GREY, device=dev)
        shift = (p.offset.to(dev) * (x.mean((2, 3)) @ grey)).view(k, 1, 1, 1)
        a = p.colour.to(dev)[..., None, None]
        y = torch.empty_like(x)
        for o in range(3):  # the colour matrix: per output channel, one input channel at a time
            torch.addcmul(shift[:, 0], a[:, o, 0], x[:, 0], out=y[:, o])
            for j in (1, 2):
                y[:, o].addcmul_(a[:, o, j], x[:, j])
        x = y.clamp_(0, 1)
        for v, seed in enumerate(p.noise_seed):
            if seed is not None:
                noise = torch.randn((3, s, s), generator=torch.Generator(dev).manual_seed(seed), device=dev)
                x[v].add_(noise, alpha=c.noise_sigma).clamp_(0, 1)
        blur = torch.nonzero(p.blur_sigma > 0, as_tuple=True)[0]
        if blur.numel():
            x[blur.to(dev)] = self._blur(x[blur.to(dev)], p.blur_sigma[blur].to(dev))
        return x, m

    def _warp(self, img: Tensor, mask: Tensor, theta: Tensor) -> tuple[Tensor, Tensor]:
        """The image (bilinear, K×3×S×S) and the label map (nearest, K×S×S int32) through each view's ``theta``
        (the sampling grid of ``F.affine_grid``, built as two broadcast sums)."""
        k, s = theta.shape[0], self.config.size
        t = (torch.arange(s, device=theta.device, dtype=theta.dtype) * 2 + 1) / s - 1  # pixel centres, normalised
        grid = torch.empty(k, s, s, 2, device=theta.device, dtype=theta.dtype)
        for axis in range(2):
            torch.add((theta[:, axis, 0, None] * t)[:, None, :], (theta[:, axis, 1, None] * t + theta[:, axis, 2, None])
                      [:, :, None], out=grid[..., axis])
        x = F.grid_sample(img.expand(k, -1, -1, -1), grid,
                          mode="bilinear", padding_mode="zeros", align_corners=False)
        m = F.grid_sample(mask.expand(k, 1, -1, -1), grid, mode="nearest", padding_mode="zeros", align_corners=False)
        return x, m[:, 0].int()

    def _blur(self, x: Tensor, sigma: Tensor) -> Tensor:
        """Separable Gaussian blur of B×3×S×S with one sigma per image (reflect padding): the taps accumulate as
        shifted multiply-adds, rows then columns (the sums of a depthwise ``conv2d``, without its im2col)."""
        b, ch, h, w = x.shape
        half = self.config.blur_kernel // 2
        t = torch.arange(-half, half + 1, device=x.device, dtype=x.dtype)
        kern = torch.exp(-(t[None] ** 2) / (2 * sigma[:, None] ** 2))
        kern = (kern / kern.sum(1, keepdim=True)).repeat_interleave(ch, 0)[:, :, None, None]  # (B·3)×k×1×1
        padded = F.pad(x.reshape(b * ch, h, w), (half, half, half, half), mode="reflect")
        rows = kern[:, 0] * padded[:, :h]
        for i in range(1, 2 * half + 1):
            rows.addcmul_(kern[:, i], padded[:, i:i + h])
        y = kern[:, 0] * rows[:, :, :w]
        for i in range(1, 2 * half + 1):
            y.addcmul_(kern[:, i], rows[:, :, i:i + w])
        return y.view(b, ch, h, w)

    def views(self, img: Tensor, mask: Tensor, generators: Sequence[torch.Generator],
              device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
        """K views of a :meth:`prepare`-d photo, view k drawn from ``generators[k]``, computed on ``device``
        (default: the image's; a CPU photo bound for CUDA goes through pinned memory, non-blocking):
        (K×3×S×S float in [0, 1], K×S×S int32 labels)."""
        dev = torch.device(device) if device is not None else img.device
        params = self.draw(mask, generators)
        if dev.type == "cuda" and img.device.type == "cpu":
            img, mask = img.pin_memory().to(dev, non_blocking=True), mask.pin_memory().to(dev, non_blocking=True)
        x, m = self.render(img.to(dev), mask.to(dev), params)
        lost = ~(m.flatten(1) > 0).any(1)
        if lost.any():  # rounding put the drawn wound pixel on skin: fall back to flips only
            fallback = WoundAugment(AugmentConfig(**{**asdict(self.config), "max_tries": 0}))
            idx = torch.nonzero(lost, as_tuple=True)[0]
            redo = [generators[int(i)] for i in idx]
            x[idx], m[idx] = fallback.render(img.to(dev), mask.to(dev), fallback.draw(mask, redo))
        return x, m

    def augment_prepared(self, img: Tensor, mask: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """One random view of a :meth:`prepare`-d photo: (float 3×S×S in [0, 1], int32 S×S)."""
        gen = generator if generator is not None else torch.Generator().manual_seed(int(torch.randint(2**62, (1,))))
        x, m = self.views(img, mask, [gen])
        return x[0], m[0]

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
