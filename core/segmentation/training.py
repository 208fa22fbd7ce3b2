"""Training the segmenter's decoder on wound masks, from backbone features cached once per photo and flip.

Samples come from a workspace (every photo with an outlined wound) and from dataset folders
(``images/NAME.*`` with ``masks/NAME.png``, read like an import: binary masks split into wounds).
The encoder is frozen, so each photo's pyramid is computed once for each of four flips (identity,
horizontal, vertical, both — the label-preserving symmetries of a skin photo) and reused by every
epoch and, in the benchmark, by every fold. Loss: binary cross-entropy + soft Dice against the
mask's area fractions on the decoder's output grid (stride 4); AdamW with a cosine schedule.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
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
    to_batch,
)

VIEWS = ("identity", "hflip", "vflip", "hvflip")
_SERIES = re.compile(r"^(.*\d)[-_]\d+$")


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
    m = _SERIES.match(name)
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


@dataclass
class FeatureCache:
    """Encoder pyramids (float16, CPU) and targets (wound fraction of each stride-4 cell) for every
    sample × view; row ``i * len(views) + v``."""

    levels: list[torch.Tensor]
    targets: torch.Tensor
    views: tuple[str, ...]
    size: int

    def rows(self, samples: Sequence[int]) -> list[int]:
        return [i * len(self.views) + v for i in samples for v in range(len(self.views))]


def cache_features(samples: Sequence[Sample], enc: Encoder, size: int = INPUT_SIZE,
                   views: Sequence[str] = VIEWS, progress: bool = True) -> FeatureCache:
    """Run the frozen encoder once per sample and view."""
    levels: list[list[torch.Tensor]] = [[] for _ in enc.channels]
    targets = []
    for s in tqdm(samples, desc="segmenter features", unit="photo", disable=not progress, leave=False):
        x = to_batch([s.image], size)
        for view in views:
            feats = enc(_flip(x, view))
            for store, f in zip(levels, feats):
                store.append(f.half().cpu())
            targets.append(_flip(_target(s.mask, feats[0].shape[-2:]), view))
    return FeatureCache([torch.cat(level) for level in levels], torch.cat(targets), tuple(views), size)


def _target(mask: np.ndarray, grid: tuple[int, int]) -> torch.Tensor:
    """Share of wound pixels in each cell of a ``grid`` laid over the mask (1×1×h×w, float16)."""
    m = torch.from_numpy(np.ascontiguousarray(mask, dtype=np.float32))[None, None]
    return F.interpolate(m, size=tuple(grid), mode="area").half()


def dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """Soft Dice loss per image, averaged over the batch."""
    p = torch.sigmoid(logits).flatten(1)
    t = target.flatten(1)
    return (1 - (2 * (p * t).sum(1) + eps) / (p.sum(1) + t.sum(1) + eps)).mean()


def fit_decoder(cache: FeatureCache, samples: Sequence[int], channels: Sequence[int], epochs: int = 20,
                batch_size: int = 8, lr: float = 1e-3, seed: int = 0, device: torch.device | str = "cpu",
                progress: bool = True, on_epoch: Callable[[int, list[float]], None] | None = None,
                ) -> tuple[FPNDecoder, list[float]]:
    """Train a fresh decoder on the cached rows of ``samples``; returns it (eval mode) and the loss per epoch."""
    if not samples:
        raise ValueError("no training photos")
    device = torch.device(device)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    decoder = FPNDecoder(channels).to(device)
    rows = torch.tensor(cache.rows(samples))
    steps_per_epoch = -(-len(rows) // batch_size)
    opt = torch.optim.AdamW(decoder.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs * steps_per_epoch))
    losses: list[float] = []
    bar = tqdm(range(epochs), desc="segmenter", unit="epoch", disable=not progress, leave=False)
    for epoch in bar:
        decoder.train()
        total = 0.0
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
    """Probability map (H, W) of one sample's identity view, from its cached features."""
    row = sample * len(cache.views) + cache.views.index("identity")
    feats = [level[row:row + 1].to(device).float() for level in cache.levels]
    logits = F.interpolate(decoder(feats), size=shape, mode="bilinear", align_corners=False)
    return torch.sigmoid(logits)[0, 0].cpu().numpy().astype(np.float32)


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


def train_segmenter(ws: Workspace, data: Sequence[str | Path] = (), epochs: int = 20, batch_size: int = 8,
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
              "n_train": len(train), "n_val": len(val)}
    run_id = ws.store.start_run(RUN_KIND, config, seed=seed)
    try:
        enc = encoder(str(device))
        cache = cache_features(samples, enc, progress=progress)
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
