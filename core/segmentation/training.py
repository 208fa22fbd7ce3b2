"""Training the segmenter's decoder on wound masks, from backbone features cached once per photo and view.

Samples come from a workspace (every photo with an outlined wound) and from dataset folders
(``images/NAME.*`` with ``masks/NAME.png``, read like an import: binary masks split into wounds).
The encoder is frozen, so each photo's pyramid is computed once per view and reused by every epoch
and, in the benchmark, by every fold. The views are the four flips (identity, horizontal, vertical,
both — the label-preserving symmetries of a skin photo) and :data:`AUGMENTED_VIEWS` random ones
(:func:`augment`): a scaled crop (zoom in or out, reflect-padded, as albumentations'
ShiftScaleRotate), an aspect-ratio change, brightness/contrast/saturation/hue jitter and a random
flip, so the decoder sees wounds at other sizes and under other light than the training photos'.
One epoch shows every training photo once, in one of its views drawn at random. Loss: binary
cross-entropy + soft Dice against the mask's area fractions on the decoder's output grid (stride 4);
AdamW with a cosine schedule.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance
from tqdm.auto import tqdm

from annotations.readers import IMAGE_SUFFIXES, mask_to_labels
from annotations.workspace import Workspace
from core.segmentation.metrics import dice
from core.segmentation.model import (
    CHECKPOINT_NAME,
    INPUT_SIZE,
    RUN_KIND,
    THRESHOLD,
    Encoder,
    FPNDecoder,
    Segmenter,
    encoder,
    probability_map,
    to_batch,
)

FLIPS = ("identity", "hflip", "vflip", "hvflip")
#: Random augmented views cached per photo, besides the four flips.
AUGMENTED_VIEWS = 4
#: Crop side relative to the photo (log-uniform; > 1 zooms out), aspect-ratio and colour jitter ranges.
SCALE_RANGE = (0.6, 1.5)
ASPECT_JITTER = 0.15
COLOUR_JITTER = 0.25
HUE_JITTER = 0.03
#: Default training length: passes over the training photos (one random view each).
EPOCHS = 80
_SERIES = re.compile(r"(.*\d)[-_]\d+")


@dataclass
class Sample:
    """One photo with its wound mask (bool H×W); ``group`` keeps near-duplicates together in splits."""

    key: str
    group: str
    image: Image.Image
    mask: np.ndarray


def series_group(name: str) -> str:
    """A file-name series shares a group: ``foot-ulcer-2-3`` → ``foot-ulcer-2``, ``ulcer1-5`` → ``ulcer1``
    (a numbered name followed by ``-N``); any other name is its own group."""
    m = _SERIES.fullmatch(name)
    return m.group(1) if m else name


def workspace_samples(ws: Workspace) -> list[Sample]:
    """Every photo of the workspace with at least one outlined wound pixel (grouped by patient when known)."""
    out = []
    for row in ws.store.images():
        mask = ws.load_mask(row["image_id"]) > 0
        if mask.any():
            group = row["patient_id"] or series_group(row["image_id"])
            out.append(Sample(f"ws:{row['image_id']}", group, ws.load_image(row["image_id"]), mask))
    return out


def folder_samples(root: str | Path) -> list[Sample]:
    """Photos of a dataset folder that have a mask (``masks/<name>.png``); photos without one are skipped."""
    root = Path(root)
    images = root / "images"
    if not images.is_dir():
        raise FileNotFoundError(f"{root}: no images/ folder (expected images/NAME.png with masks/NAME.png)")
    out = []
    for path in sorted(p for p in images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
        mask_path = root / "masks" / f"{path.stem}.png"
        if not mask_path.is_file():
            continue
        with Image.open(path) as im, Image.open(mask_path) as m:
            image, mask = im.convert("RGB"), mask_to_labels(np.asarray(m)) > 0
        if mask.shape != (image.height, image.width):
            raise ValueError(f"{mask_path}: mask is {mask.shape[1]}×{mask.shape[0]} but the photo is "
                             f"{image.width}×{image.height}")
        if mask.any():
            out.append(Sample(f"{root.name}:{path.stem}", f"{root.name}:{series_group(path.stem)}", image, mask))
    return out


def _flip(x: torch.Tensor, view: str) -> torch.Tensor:
    dims = {"identity": (), "hflip": (-1,), "vflip": (-2,), "hvflip": (-2, -1)}[view]
    return x.flip(dims) if dims else x


def augment(image: Image.Image, mask: np.ndarray, rng: np.random.Generator) -> tuple[Image.Image, np.ndarray]:
    """A random scaled, reshaped, colour-jittered crop of a photo and its mask (flips are applied later)."""
    rgb, m = np.asarray(image.convert("RGB")), mask
    h, w = m.shape
    scale = float(np.exp(rng.uniform(*np.log(SCALE_RANGE))))
    aspect = float(np.exp(rng.uniform(-ASPECT_JITTER, ASPECT_JITTER)))
    cw, ch = max(8, round(w * scale * aspect ** 0.5)), max(8, round(h * scale / aspect ** 0.5))
    px, py = min(max(0, cw - w), w - 1), min(max(0, ch - h), h - 1)
    if px or py:
        rgb = np.pad(rgb, ((py, py), (px, px), (0, 0)), mode="reflect")
        m = np.pad(m, ((py, py), (px, px)), mode="reflect")
    cw, ch = min(cw, m.shape[1]), min(ch, m.shape[0])
    x0, y0 = int(rng.integers(0, m.shape[1] - cw + 1)), int(rng.integers(0, m.shape[0] - ch + 1))
    out = Image.fromarray(np.ascontiguousarray(rgb[y0:y0 + ch, x0:x0 + cw]))
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        out = enhance(out).enhance(float(rng.uniform(1 - COLOUR_JITTER, 1 + COLOUR_JITTER)))
    hsv = np.asarray(out.convert("HSV")).copy()
    hsv[..., 0] = (hsv[..., 0].astype(np.int16) + round(rng.uniform(-HUE_JITTER, HUE_JITTER) * 255)) % 256
    return Image.fromarray(hsv, "HSV").convert("RGB"), np.ascontiguousarray(m[y0:y0 + ch, x0:x0 + cw])


@dataclass
class FeatureCache:
    """Encoder pyramids (float16, CPU) and targets (wound fraction of each stride-4 cell) for every
    sample × view; row ``i * views + v``, view 0 the photo itself and view 1 its horizontal flip."""

    levels: list[torch.Tensor]
    targets: torch.Tensor
    views: int
    size: int

    def row(self, sample: int, view: int = 0) -> int:
        return sample * self.views + view


def cache_features(samples: Sequence[Sample], enc: Encoder, size: int = INPUT_SIZE,
                   augmented: int = AUGMENTED_VIEWS, seed: int = 0, progress: bool = True) -> FeatureCache:
    """Run the frozen encoder once per sample and view (the four flips, then ``augmented`` random views)."""
    levels: list[list[torch.Tensor]] = [[] for _ in enc.channels]
    targets = []
    rng = np.random.default_rng(seed)
    for s in tqdm(samples, desc="segmenter features", unit="photo", disable=not progress, leave=False):
        x = to_batch([s.image], size)
        views = [(x, s.mask, flip) for flip in FLIPS]
        for _ in range(augmented):
            image, mask = augment(s.image, s.mask, rng)
            views.append((to_batch([image], size), mask, FLIPS[int(rng.integers(len(FLIPS)))]))
        for xv, mask, flip in views:
            feats = enc(_flip(xv, flip))
            for store, f in zip(levels, feats):
                store.append(f.half().cpu())
            targets.append(_flip(_target(mask, feats[0].shape[-2:]), flip))
    return FeatureCache([torch.cat(level) for level in levels], torch.cat(targets), len(FLIPS) + augmented, size)


def _target(mask: np.ndarray, grid: tuple[int, int]) -> torch.Tensor:
    """Share of wound pixels in each cell of a ``grid`` laid over the mask (1×1×h×w, float16)."""
    m = torch.from_numpy(np.ascontiguousarray(mask, dtype=np.float32))[None, None]
    return F.interpolate(m, size=tuple(grid), mode="area").half()


def dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """Soft Dice loss per image, averaged over the batch."""
    p = torch.sigmoid(logits).flatten(1)
    t = target.flatten(1)
    return (1 - (2 * (p * t).sum(1) + eps) / (p.sum(1) + t.sum(1) + eps)).mean()


def fit_decoder(cache: FeatureCache, samples: Sequence[int], channels: Sequence[int], epochs: int = EPOCHS,
                batch_size: int = 8, lr: float = 1e-3, seed: int = 0, device: torch.device | str = "cpu",
                progress: bool = True, on_epoch: Callable[[int, list[float]], None] | None = None,
                ) -> tuple[FPNDecoder, list[float]]:
    """Train a fresh decoder on the cached views of ``samples`` (each photo once per epoch, in a random view);
    returns it (eval mode) and the loss per epoch."""
    if not samples:
        raise ValueError("no training photos")
    device = torch.device(device)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    decoder = FPNDecoder(channels).to(device)
    photos = torch.tensor(list(samples))
    steps_per_epoch = -(-len(photos) // batch_size)
    opt = torch.optim.AdamW(decoder.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs * steps_per_epoch))
    losses: list[float] = []
    bar = tqdm(range(epochs), desc="segmenter", unit="epoch", disable=not progress, leave=False)
    for epoch in bar:
        decoder.train()
        total = 0.0
        views = torch.randint(cache.views, (len(photos),), generator=gen)
        rows = photos * cache.views + views
        for batch in rows[torch.randperm(len(rows), generator=gen)].split(batch_size):
            feats = [level[batch].to(device).float() for level in cache.levels]
            target = cache.targets[batch].to(device).float()
            logits = decoder(feats)
            loss = F.binary_cross_entropy_with_logits(logits, target) + dice_loss(logits, target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(batch)
        losses.append(total / len(rows))
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if on_epoch is not None:
            on_epoch(epoch, losses)
    return decoder.eval(), losses


@torch.no_grad()
def cached_probability(decoder: FPNDecoder, cache: FeatureCache, sample: int, shape: tuple[int, int],
                       device: torch.device | str = "cpu") -> np.ndarray:
    """Probability map (H, W) of one sample from its cached photo and horizontal-flip views (the test-time
    augmentation of :meth:`Segmenter.probability`)."""
    rows = slice(cache.row(sample, 0), cache.row(sample, 1) + 1)
    logits = decoder([level[rows].to(device).float() for level in cache.levels])
    return probability_map(logits, shape)


def split_groups(samples: Sequence[Sample], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, validation) sample indices; whole groups go to validation until ``fraction`` of the photos."""
    groups = sorted({s.group for s in samples})
    if fraction <= 0 or len(groups) < 2:
        return list(range(len(samples))), []
    order = np.random.default_rng(seed).permutation(len(groups))
    val: set[str] = set()
    for g in order:
        if sum(s.group in val for s in samples) >= fraction * len(samples) or len(val) == len(groups) - 1:
            break
        val.add(groups[g])
    return ([i for i, s in enumerate(samples) if s.group not in val],
            [i for i, s in enumerate(samples) if s.group in val])


def collect_samples(ws: Workspace, data: Sequence[str | Path] = ()) -> list[Sample]:
    """Workspace samples plus those of each dataset folder; none at all is a ValueError naming the sources."""
    samples = workspace_samples(ws)
    for root in data:
        samples += folder_samples(root)
    if not samples:
        sources = [str(ws.root), *map(str, data)]
        raise ValueError(f"no wound masks to train on in {', '.join(sources)}: outline wounds first "
                         "(or pass --data DIR with images/ and masks/)")
    return samples


def train_segmenter(ws: Workspace, data: Sequence[str | Path] = (), epochs: int = EPOCHS, batch_size: int = 8,
                    lr: float = 1e-3, seed: int = 0, device: torch.device | str = "cpu",
                    val_fraction: float = 0.2, progress: bool = True) -> int:
    """Train the decoder on the workspace's masks (+ ``data`` folders) and record a ``segmenter`` run.

    Whole groups (patients, file-name series) making up ``val_fraction`` of the photos are held out
    and the run's ``dice`` is their mean per-photo Dice; with ``val_fraction=0`` every photo trains
    and no Dice is reported. Bad input raises before anything is written.
    """
    if epochs < 1 or batch_size < 1 or lr <= 0 or not 0 <= val_fraction < 1:
        raise ValueError(f"need epochs ≥ 1, batch size ≥ 1, lr > 0 and 0 ≤ val fraction < 1 (got {epochs}, "
                         f"{batch_size}, {lr}, {val_fraction})")
    samples = collect_samples(ws, data)
    train, val = split_groups(samples, val_fraction, seed)
    device = torch.device(device)
    config = {"data": [str(d) for d in data], "epochs": epochs, "batch_size": batch_size, "lr": lr,
              "device": device.type, "val_fraction": val_fraction, "input_size": INPUT_SIZE,
              "augmented_views": AUGMENTED_VIEWS, "n_train": len(train), "n_val": len(val)}
    run_id = ws.store.start_run(RUN_KIND, config, seed=seed)
    try:
        enc = encoder(str(device))
        cache = cache_features(samples, enc, seed=seed, progress=progress)
        decoder, losses = fit_decoder(
            cache, train, enc.channels, epochs, batch_size, lr, seed, device, progress,
            on_epoch=lambda ep, ls: ws.store.update_run(run_id, progress=(ep + 1) / epochs, metrics={"loss": ls}))
        metrics: dict = {"loss": losses, "n_train": len(train), "n_val": len(val)}
        if val:
            scores = [dice(cached_probability(decoder, cache, i, samples[i].mask.shape, device) >= THRESHOLD,
                           samples[i].mask) for i in val]
            metrics["dice"] = float(np.mean(scores))
        path = Segmenter(decoder, enc, INPUT_SIZE, run_id).save(ws.run_dir(run_id) / CHECKPOINT_NAME)
        ws.store.finish_run(run_id, metrics=metrics, artifacts={"checkpoint": str(path.relative_to(ws.root))})
    except BaseException as e:
        ws.store.finish_run(run_id, status="stopped" if isinstance(e, KeyboardInterrupt) else "failed",
                            message=f"{type(e).__name__}: {e}")
        raise
    return run_id
