"""Training the segmenter on wound masks, from frozen encoder features cached once per photo and view.

Samples come from a workspace (every photo with an outlined wound) and from dataset folders
(``images/NAME.*`` with ``masks/NAME.png``, read like an import: binary masks split into wounds).
The encoder's stem and first stages are frozen, so each photo's features at strides 4 and 8 are
computed once per view and reused by every epoch and, in the benchmark, by every fold; the later
encoder stages and the decoder train on them (:class:`core.segmentation.model.SegNet`). The views
are the four flips (identity, horizontal, vertical, both — the label-preserving symmetries of a
skin photo, and the test-time views) and random ones (:func:`augment`): the default (``--pretrain``)
caches :data:`PRETRAIN_AUGMENTED_VIEWS` close-up (:data:`CLOSE_UP`: a crop holding part of the wound,
resized as a photo taken nearer), which on fuseg-dev's nested folds kept the in-source Dice and raised
the transfer to close-up photos (results/segmentation_search.md, stop 65); a workspace's run caches
:data:`AUGMENTED_VIEWS` (none: the clinic's fine-tune is measured on the flips). :data:`STRONG` (a
rotated, scaled crop, colour jitter, blur) added nothing measured in source. One epoch shows every
training photo once, in one of its views drawn at random. Loss: binary cross-entropy + soft Dice against the mask's area
fractions on the output grid (stride 4); AdamW with a cosine schedule, the encoder stages at a tenth
of the decoder's rate. A workspace's run starts from the default segmenter and fine-tunes its decoder's head alone
(:data:`~core.segmentation.defaults.FINE_TUNE`; ``--tune all``: every part); the ``--pretrain`` run that makes the
default starts from ImageNet and trains every part.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance, ImageFilter
from tqdm.auto import tqdm

from annotations.infra.workspace import Workspace
from annotations.io.readers import IMAGE_SUFFIXES, mask_to_labels
from annotations.store import runs
from core.runtime import autocast, grad_scaler
from core.segmentation.defaults import (  # noqa: F401 (PRETRAIN_EPOCHS re-exported)
    EPOCHS,
    HEAD_PRIOR,
    INNER_FRACTION,
    PRETRAIN_EPOCHS,
    THRESHOLD,
    THRESHOLD_GRID,
    TUNED_PARTS,
    SegmenterConfig,
)
from core.segmentation.metrics import dice
from core.segmentation.model import (
    CHECKPOINT_NAME,
    INPUT_SIZE,
    RUN_KIND,
    TEST_FLIPS,
    TTA_FLIPS,
    Encoder,
    Segmenter,
    SegNet,
    encoder,
    flip,
    load_default,
    new_net,
    probability_map,
    to_batch,
)

#: Random views a workspace's run caches per photo besides the four flips: none (the clinic fine-tune measured).
AUGMENTED_VIEWS = 0
#: Random views the default (``--pretrain``) caches per photo besides the four flips, and their kind
#: (:data:`AUGMENTATIONS`): one close-up (issue 48, chosen by a rule fixed before its nested run).
PRETRAIN_AUGMENTED_VIEWS = 1
PRETRAIN_AUGMENTATION = "close"
#: The tuned encoder stages learn at this share of the decoder's rate.
ENCODER_LR_FACTOR = 0.1
_SERIES = re.compile(r"(.*\d)[-_]\d+")


@dataclass(frozen=True)
class Augmentation:
    """Ranges of the random views: crop side relative to the photo (log-uniform; > 1 zooms out), aspect-ratio
    (log), rotation (degrees), brightness/contrast/saturation (±share), hue (±turn), gamma (log) and the chance
    of a Gaussian blur of radius up to ``blur_radius`` px; ``on_wound``: the crop holds a random wound pixel
    (else it lies anywhere)."""

    scale: tuple[float, float]
    aspect: float
    rotation: float
    colour: float
    hue: float
    gamma: float
    blur: float
    blur_radius: float
    on_wound: bool = False


#: Strong photometric and geometric views (photos from other cameras, distances, light): the ablation's variant.
STRONG = Augmentation(scale=(0.5, 2.0), aspect=0.25, rotation=45.0, colour=0.4, hue=0.06, gamma=0.3, blur=0.3,
                      blur_radius=1.5)
#: Close-ups: a crop of 1/5 to all of the photo's side (log-uniform) that holds part of the wound, resized to the
#: input as a photo taken nearer would be (the wound fills more of it, at a lower resolution), mild colour jitter.
#: Clinical photos range from a whole limb to a wound filling the frame; fuseg-dev's are wide (median wound 0.7 %
#: of the photo), a close-up source's (Medetec: 9.8 %) are not.
CLOSE_UP = Augmentation(scale=(0.2, 1.0), aspect=0.1, rotation=0.0, colour=0.1, hue=0.02, gamma=0.1, blur=0.0,
                        blur_radius=0.0, on_wound=True)
#: The random views by name (``--views`` of the benchmark and of ``core.train_segmenter``).
AUGMENTATIONS = {"strong": STRONG, "close": CLOSE_UP}


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


def augment(image: Image.Image, mask: np.ndarray, rng: np.random.Generator,
            aug: Augmentation = STRONG) -> tuple[Image.Image, np.ndarray]:
    """A random rotated, scaled, reshaped, colour-jittered crop of a photo and its mask (flips are applied later)."""
    rgb, m = np.asarray(image.convert("RGB")), mask
    if aug.rotation:
        angle = float(rng.uniform(-aug.rotation, aug.rotation))
        h, w = m.shape
        pad = round(0.21 * max(h, w))  # the corners a 45° turn brings in are reflected skin, not black
        rgb = np.pad(rgb, ((pad, pad), (pad, pad), (0, 0)), mode="reflect")
        m = np.pad(m, pad, mode="reflect")
        rgb = np.asarray(Image.fromarray(rgb).rotate(angle, Image.Resampling.BILINEAR))[pad:pad + h, pad:pad + w]
        m = np.asarray(Image.fromarray(m).rotate(angle, Image.Resampling.NEAREST))[pad:pad + h, pad:pad + w]
    h, w = m.shape
    scale = float(np.exp(rng.uniform(*np.log(aug.scale))))
    aspect = float(np.exp(rng.uniform(-aug.aspect, aug.aspect)))
    cw, ch = max(8, round(w * scale * aspect ** 0.5)), max(8, round(h * scale / aspect ** 0.5))
    px, py = min(max(0, cw - w), w - 1), min(max(0, ch - h), h - 1)
    if px or py:
        rgb = np.pad(rgb, ((py, py), (px, px), (0, 0)), mode="reflect")
        m = np.pad(m, ((py, py), (px, px)), mode="reflect")
    cw, ch = min(cw, m.shape[1]), min(ch, m.shape[0])
    lo_x, hi_x, lo_y, hi_y = 0, m.shape[1] - cw, 0, m.shape[0] - ch
    if aug.on_wound and m.any():
        ys, xs = np.nonzero(m)
        k = int(rng.integers(len(xs)))
        lo_x, hi_x = max(0, int(xs[k]) - cw + 1), min(hi_x, int(xs[k]))
        lo_y, hi_y = max(0, int(ys[k]) - ch + 1), min(hi_y, int(ys[k]))
    x0, y0 = int(rng.integers(lo_x, hi_x + 1)), int(rng.integers(lo_y, hi_y + 1))
    out = Image.fromarray(np.ascontiguousarray(rgb[y0:y0 + ch, x0:x0 + cw]))
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        out = enhance(out).enhance(float(rng.uniform(1 - aug.colour, 1 + aug.colour)))
    hsv = np.asarray(out.convert("HSV")).copy()
    hsv[..., 0] = (hsv[..., 0].astype(np.int16) + round(rng.uniform(-aug.hue, aug.hue) * 255)) % 256
    out = Image.fromarray(hsv, "HSV").convert("RGB")
    if aug.gamma:
        gamma = float(np.exp(rng.uniform(-aug.gamma, aug.gamma)))
        out = out.point([round(255 * (v / 255) ** gamma) for v in range(256)] * 3)
    if rng.random() < aug.blur:
        out = out.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, aug.blur_radius))))
    return out, np.ascontiguousarray(m[y0:y0 + ch, x0:x0 + cw])


@dataclass
class FeatureCache:
    """Frozen encoder features (float16, CPU, strides 4 and 8) and targets (wound fraction of each stride-4 cell)
    for every sample × view; row ``i * views + v``, views 0–3 the photo under the four flips of
    :data:`~core.segmentation.model.TTA_FLIPS` (the test-time views), then the random ones."""

    levels: list[torch.Tensor]
    targets: torch.Tensor
    views: int
    size: int

    def row(self, sample: int, view: int = 0) -> int:
        """The row of ``levels`` and ``targets`` that holds view ``view`` of sample ``sample``."""
        return sample * self.views + view


def cache_features(samples: Sequence[Sample], enc: Encoder, size: int = INPUT_SIZE,
                   augmented: int = AUGMENTED_VIEWS, seed: int = 0, progress: bool = True,
                   aug: Augmentation = STRONG) -> FeatureCache:
    """Run the frozen encoder once per sample and view (the four flips, then ``augmented`` random views)."""
    levels: list[list[torch.Tensor]] = []
    targets = []
    rng = np.random.default_rng(seed)
    for s in tqdm(samples, desc="segmenter features", unit="photo", disable=not progress, leave=False):
        x = to_batch([s.image], size)
        views = [(x, s.mask, v) for v in TTA_FLIPS]
        for _ in range(augmented):
            image, mask = augment(s.image, s.mask, rng, aug)
            views.append((to_batch([image], size), mask, TTA_FLIPS[int(rng.integers(len(TTA_FLIPS)))]))
        for xv, mask, v in views:
            feats = enc(flip(xv, v))
            levels = levels or [[] for _ in feats]
            for store, f in zip(levels, feats):
                store.append(f.half().cpu())
            targets.append(flip(_target(mask, feats[0].shape[-2:]), v))
    return FeatureCache([torch.cat(level) for level in levels], torch.cat(targets), len(TTA_FLIPS) + augmented, size)


def _target(mask: np.ndarray, grid: tuple[int, int]) -> torch.Tensor:
    """Share of wound pixels in each cell of a ``grid`` laid over the mask (1×1×h×w, float16)."""
    m = torch.from_numpy(np.ascontiguousarray(mask, dtype=np.float32))[None, None]
    return F.interpolate(m, size=tuple(grid), mode="area").half()


def dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """Soft Dice loss per image, averaged over the batch."""
    p = torch.sigmoid(logits).flatten(1)
    t = target.flatten(1)
    return (1 - (2 * (p * t).sum(1) + eps) / (p.sum(1) + t.sum(1) + eps)).mean()


def fit_network(cache: FeatureCache, samples: Sequence[int], start: SegNet, epochs: int = EPOCHS,
                batch_size: int = 8, lr: float = 1e-3, encoder_lr_factor: float = ENCODER_LR_FACTOR, seed: int = 0,
                device: torch.device | str = "cpu", progress: bool = True,
                on_epoch: Callable[[int, list[float]], None] | None = None,
                dice_weight: float = 1.0, tune: str = "all") -> tuple[SegNet, list[float]]:
    """Train a copy of ``start`` on the cached views of ``samples`` (each photo once per epoch, in a random view;
    ``encoder_lr_factor=0`` keeps the encoder stages frozen; ``tune="head"`` trains the decoder's head alone, the
    rest frozen with its batch-norm statistics); returns it (eval mode) and the loss per epoch. The loss is
    cross-entropy + ``dice_weight`` × soft Dice (1, the recipe; 0, cross-entropy alone: a diagnosis)."""
    if not samples:
        raise ValueError("no training photos")
    if tune not in TUNED_PARTS:
        raise ValueError(f"tune must be one of {TUNED_PARTS}, got {tune!r}")
    device = torch.device(device)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    net = copy.deepcopy(start).to(device).to(memory_format=torch.channels_last)  # 1.5× faster CPU convolutions
    head = tune == "head"
    for p in net.parameters():
        p.requires_grad_(False)
    for p in (net.decoder.head if head else net.decoder).parameters():
        p.requires_grad_(True)
    for p in net.stages.parameters():
        p.requires_grad_(not head and encoder_lr_factor > 0)
    groups = [{"params": [p for p in net.decoder.parameters() if p.requires_grad], "lr": lr}]
    if not head and encoder_lr_factor > 0:
        groups.append({"params": list(net.stages.parameters()), "lr": lr * encoder_lr_factor})
    photos = torch.tensor(list(samples))
    steps_per_epoch = -(-len(photos) // batch_size)
    opt = torch.optim.AdamW(groups, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs * steps_per_epoch))
    losses: list[float] = []
    scaler = grad_scaler(device)
    bar = tqdm(range(epochs), desc="segmenter", unit="epoch", disable=not progress, leave=False)
    for epoch in bar:
        net.train()
        if head:  # the frozen decoder keeps its batch-norm statistics
            net.decoder.lateral.eval()
            net.decoder.smooth.eval()
        total = 0.0
        views = torch.randint(cache.views, (len(photos),), generator=gen)
        rows = photos * cache.views + views
        for batch in rows[torch.randperm(len(rows), generator=gen)].split(batch_size):
            feats = [level[batch].to(device).float().contiguous(memory_format=torch.channels_last)
                     for level in cache.levels]
            target = cache.targets[batch].to(device).float()
            with autocast(device):  # bf16 (or fp16 with the scaler) on CUDA, a no-op on the CPU
                logits = net(feats)
                loss = F.binary_cross_entropy_with_logits(logits, target)
                if dice_weight:
                    loss = loss + dice_weight * dice_loss(logits, target)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
            total += loss.item() * len(batch)
        losses.append(total / len(rows))
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if on_epoch is not None:
            on_epoch(epoch, losses)
    return net.to(memory_format=torch.contiguous_format).eval(), losses


@torch.no_grad()
def cached_probability(net: SegNet, cache: FeatureCache, sample: int, shape: tuple[int, int],
                       device: torch.device | str = "cpu", tta: int = TEST_FLIPS) -> np.ndarray:
    """Probability map (H, W) of one sample from its first ``tta`` cached flip views (the test-time augmentation
    of :meth:`Segmenter.probability`)."""
    rows = slice(cache.row(sample, 0), cache.row(sample, tta))
    logits = net([level[rows].to(device).float() for level in cache.levels])
    return probability_map(logits, shape, TTA_FLIPS[:tta])


def choose_threshold(net: SegNet, cache: FeatureCache, samples: Sequence[Sample], held_out: Sequence[int],
                     min_area: int, device: torch.device | str = "cpu",
                     grid: Sequence[float] = THRESHOLD_GRID) -> tuple[float, dict[str, float]]:
    """The threshold of ``grid`` with the best mean Dice per photo over the ``held_out`` samples (their outlines as
    suggestions show them: components of at least ``min_area`` px, holes filled; ties go to the value nearest 0.5),
    and the mean Dice at each threshold."""
    from core.segmentation.interactive import wound_components

    probs = [(cached_probability(net, cache, i, samples[i].mask.shape, device), samples[i].mask) for i in held_out]
    scores = {}
    for t in grid:
        per_photo = []
        for prob, mask in probs:
            comps = wound_components(prob, min_area, threshold=t)
            per_photo.append(dice(np.logical_or.reduce(comps) if comps else np.zeros_like(mask), mask))
        scores[f"{t:g}"] = float(np.mean(per_photo))
    best = max(grid, key=lambda t: (round(scores[f"{t:g}"], 6), -abs(t - 0.5)))
    return float(best), scores


def inner_threshold(cache: FeatureCache, samples: Sequence[Sample], train: Sequence[int], start: SegNet, epochs: int,
                    min_area: int, batch_size: int = 8, lr: float = 1e-3, seed: int = 0,
                    device: torch.device | str = "cpu", progress: bool = True) -> tuple[float, dict[str, Any]] | None:
    """The threshold an inner split of ``train`` chooses: a network trained from ``start`` without
    :data:`INNER_FRACTION` of those photos (whole series), :func:`choose_threshold` on that share; with its record
    (photos trained / held out, loss per epoch, mean Dice per threshold). None when ``train`` has a single series."""
    inner, held = split_groups([samples[i] for i in train], INNER_FRACTION, seed)
    if not held:
        return None
    net, losses = fit_network(cache, [train[i] for i in inner], start, epochs, batch_size, lr, seed=seed,
                              device=device, progress=progress)
    threshold, by_threshold = choose_threshold(net, cache, samples, [train[i] for i in held], min_area, device)
    return threshold, {"n_train": len(inner), "n_held_out": len(held), "loss": losses,
                       "dice_by_threshold": by_threshold}


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


def collect_samples(ws: Workspace, data: Sequence[str | Path] = (), workspace: bool = True) -> list[Sample]:
    """Workspace samples (unless ``workspace=False``) plus those of each dataset folder; none at all is a
    ValueError naming the sources."""
    samples = workspace_samples(ws) if workspace else []
    for root in data:
        samples += folder_samples(root)
    if not samples:
        sources = ([str(ws.root)] if workspace else []) + [str(d) for d in data]
        raise ValueError(f"no wound masks to train on in {', '.join(sources) or 'no folder (pass --data DIR)'}: "
                         "outline wounds first (or pass --data DIR with images/ and masks/)")
    return samples


def run_config(config: SegmenterConfig, data: Sequence[str | Path], device: torch.device | str, n_train: int,
               n_val: int) -> dict[str, Any]:
    """The ``segmenter`` run record's config: ``config``'s settings (its epochs resolved) and what the run was
    trained on (the run's seed is the record's own column)."""
    return {"data": [str(d) for d in data], "epochs": config.train_epochs, "batch_size": config.batch_size,
            "lr": config.lr, "tune": config.tuned,
            "encoder_lr_factor": ENCODER_LR_FACTOR if config.tuned == "all" else None,
            "device": torch.device(device).type,
            "val_fraction": config.val_fraction, "input_size": INPUT_SIZE,
            "augmented_views": PRETRAIN_AUGMENTED_VIEWS if config.pretrain else AUGMENTED_VIEWS,
            "augmentation": PRETRAIN_AUGMENTATION if config.pretrain else None,
            "head_prior": HEAD_PRIOR if config.pretrain else None,
            "start": "imagenet" if config.pretrain else "default", "n_train": n_train, "n_val": n_val}


def train_segmenter(ws: Workspace, data: Sequence[str | Path] = (), config: SegmenterConfig = SegmenterConfig(),
                    device: torch.device | str = "cpu", progress: bool = True) -> int:
    """Train the segmenter and record a ``segmenter`` run in the workspace.

    By default the workspace's masks (+ ``data`` folders) fine-tune the default segmenter's head
    (:data:`~core.segmentation.defaults.FINE_TUNE`; ``config.tune``: what it trains); with ``config.pretrain``
    only the ``data`` folders train it, from ImageNet (how the default is made). Whole groups (patients, file-name
    series) making up ``config.val_fraction`` of the photos are held out and the run's ``dice`` is their mean
    per-photo Dice (and, for a fine-tune, ``dice_start``: its start's on the same photos); with ``val_fraction=0``
    every photo trains and no Dice is reported. The checkpoint's threshold:
    with ``pretrain``, the one a network trained without :data:`INNER_FRACTION` of the training photos (whole
    series) scores best on them (:func:`choose_threshold`; then the network is trained again on all of them), else
    the start's. Bad input raises before anything is written.
    """
    pretrain, seed, epochs = config.pretrain, config.seed, config.train_epochs
    batch_size, lr = config.batch_size, config.lr
    if pretrain and not data:
        raise ValueError("--pretrain trains on dataset folders only: pass --data DIR (images/ and masks/)")
    samples = collect_samples(ws, data, workspace=not pretrain)
    train, val = split_groups(samples, config.val_fraction, seed)
    device = torch.device(device)
    record = run_config(config, data, device, len(train), len(val))
    with runs.recording(ws, RUN_KIND, record, seed=seed) as rec:
        run_id = rec.id
        enc = encoder(str(device))
        if pretrain:
            start, threshold = new_net(enc, seed=seed), THRESHOLD
        else:
            default = load_default(device)
            start, threshold = default.net, default.threshold
        cache = cache_features(samples, enc, seed=seed, progress=progress,
                               augmented=PRETRAIN_AUGMENTED_VIEWS if pretrain else AUGMENTED_VIEWS,
                               aug=AUGMENTATIONS[PRETRAIN_AUGMENTATION])
        metrics: dict = {"n_train": len(train), "n_val": len(val)}
        if pretrain:  # the threshold from a network trained without an inner share of the photos, scored on it
            chosen = inner_threshold(cache, samples, train, start, epochs, ws.min_wound_area, batch_size, lr,
                                     seed=seed, device=device, progress=progress)
            if chosen is not None:
                threshold, metrics["inner"] = chosen
                metrics["threshold"] = threshold
        net, losses = fit_network(
            cache, train, start, epochs, batch_size, lr, seed=seed, device=device, progress=progress,
            on_epoch=lambda ep, ls: ws.store.update_run(run_id, progress=(ep + 1) / epochs, metrics={"loss": ls}),
            tune=config.tuned)
        metrics["loss"] = losses
        if val:  # a fine-tune's start is scored on the same photos too: did the fine-tune help this clinic?
            for key, scored_net in ({"dice": net} if pretrain else {"dice": net, "dice_start": start.eval()}).items():
                metrics[key] = float(np.mean([dice(cached_probability(scored_net, cache, i, samples[i].mask.shape,
                                                                      device) >= threshold, samples[i].mask)
                                              for i in val]))
        path = Segmenter(net, enc, INPUT_SIZE, run_id, threshold=threshold).save(ws.run_dir(run_id) / CHECKPOINT_NAME)
        rec.metrics, rec.artifacts = metrics, {"checkpoint": str(path.relative_to(ws.root))}
    return run_id
