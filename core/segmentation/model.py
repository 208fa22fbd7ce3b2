"""The wound segmenter: frozen EfficientNet-Lite0 pyramid (strides 4–32) + a light FPN decoder.

The encoder is timm ``tf_efficientnet_lite0`` built with ``features_only``; its ImageNet weights are
the offline backbone's (:func:`core.vision.backbones.load_backbone`), copied by parameter name, so
the segmenter sees exactly the features TriDerm-V uses. The decoder is Panoptic FPN's semantic
branch, narrowed to ``width`` channels: lateral 1×1 convolutions, a top-down pathway, one 3×3
convolution per level, the levels summed at stride 4, and a 3×3 + 1×1 head giving wound logits.
A checkpoint holds the decoder only, with the identity (architecture + weights fingerprint) of the
encoder it was trained on; loading it over another encoder is a :class:`SegmenterError`.
"""
from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from annotations.fileio import atomic_write
from annotations.workspace import Workspace
from core.runtime import pick_device
from core.vision.backbones import OFFLINE_DEFAULT, load_backbone

RUN_KIND = "segmenter"
CHECKPOINT_NAME = "segmenter.pt"
FORMAT = "triderm-segmenter/1"
#: Photos are resized to a square of this side before the encoder (strides 4..32 → 96..12 cells).
INPUT_SIZE = 384
#: timm feature indices of ``tf_efficientnet_lite0`` used: strides 4, 8, 16, 32.
LEVELS = (1, 2, 3, 4)
WIDTH = 32
THRESHOLD = 0.5
RECENT_MAPS = 4


class SegmenterError(ValueError):
    """A segmenter that cannot be used: no trained run, an unreadable or mismatched checkpoint."""


class Encoder(nn.Module):
    """Frozen EfficientNet-Lite0 feature pyramid with the offline backbone's ImageNet weights."""

    def __init__(self, device: torch.device) -> None:
        import timm

        super().__init__()
        source = load_backbone(OFFLINE_DEFAULT, device="cpu")
        net = timm.create_model("tf_efficientnet_lite0", features_only=True, out_indices=LEVELS, pretrained=False)
        missing, _ = net.load_state_dict(source.model.state_dict(), strict=False)
        if missing:
            raise SegmenterError(f"offline backbone weights lack encoder tensors {missing[:3]}…")
        self.net = net.to(device, memory_format=torch.channels_last).eval()
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.identity = f"{source.arch}:{source.weights}"
        self.channels: list[int] = list(net.feature_info.channels())
        self.device = device
        self.register_buffer("mean", torch.tensor(source.mean, device=device).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(source.std, device=device).view(1, 3, 1, 1))

    def train(self, mode: bool = True) -> Encoder:  # always frozen, always in eval mode
        return super().train(False)

    @torch.no_grad()
    def forward(self, x: Tensor) -> list[Tensor]:
        """A uint8-range float batch B×3×S×S in [0, 1] → feature maps at strides 4, 8, 16, 32."""
        x = ((x.to(self.device) - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        return [f.contiguous() for f in self.net(x)]


@functools.lru_cache(maxsize=2)
def encoder(device: str = "cpu") -> Encoder:
    """The shared frozen encoder on ``device`` (built once per process)."""
    return Encoder(torch.device(device))


class FPNDecoder(nn.Module):
    """Panoptic-FPN semantic branch over a feature pyramid → one wound logit map at the finest stride."""

    def __init__(self, channels: Sequence[int], width: int = WIDTH) -> None:
        super().__init__()
        self.lateral = nn.ModuleList(nn.Conv2d(c, width, 1) for c in channels)
        self.smooth = nn.ModuleList(self._conv(width) for _ in channels)
        self.head = nn.Sequential(self._conv(width), nn.Conv2d(width, 1, 1))

    @staticmethod
    def _conv(width: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                             nn.ReLU(inplace=True))

    def forward(self, feats: Sequence[Tensor]) -> Tensor:
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


def probability_map(logits: Tensor, shape: tuple[int, int]) -> np.ndarray:
    """Logits of a photo and of its horizontal flip (2×1×h×w) → the photo's mean probability at ``shape``
    (horizontal-flip test-time augmentation)."""
    mean = (logits[0:1] + logits[1:2].flip(-1)) / 2
    mean = F.interpolate(mean.float(), size=tuple(shape), mode="bilinear", align_corners=False)
    return torch.sigmoid(mean)[0, 0].cpu().numpy().astype(np.float32)


def to_batch(images: Sequence[Image.Image], size: int = INPUT_SIZE) -> Tensor:
    """PIL photos → float batch B×3×size×size in [0, 1] (square bilinear resize)."""
    arrs = [np.asarray(im.convert("RGB").resize((size, size), Image.BILINEAR)) for im in images]
    return torch.from_numpy(np.stack(arrs)).permute(0, 3, 1, 2).float() / 255.0


class Segmenter:
    """A trained decoder over the frozen encoder; :meth:`probability` gives a photo's wound map."""

    def __init__(self, decoder: FPNDecoder, enc: Encoder, input_size: int = INPUT_SIZE,
                 run_id: int | None = None) -> None:
        self.encoder = enc
        self.decoder = decoder.to(enc.device).eval()
        self.input_size = int(input_size)
        self.run_id = run_id
        self.device = enc.device
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()

    def __repr__(self) -> str:
        return f"Segmenter(run {self.run_id}, {self.encoder.identity}, {self.input_size}px, {self.device})"

    @torch.no_grad()
    def probability(self, image: Image.Image) -> np.ndarray:
        """Wound probability per pixel of ``image``: (H, W) float32 in [0, 1], the mean over the photo and its
        horizontal flip (the last few photos' maps are kept, so repeated clicks on one photo run the network
        once; treat the result as read-only)."""
        rgb = image.convert("RGB")
        key = hashlib.sha1(rgb.tobytes()).hexdigest() + repr(rgb.size)
        if key in self._recent:
            self._recent.move_to_end(key)
            return self._recent[key]
        x = to_batch([rgb], self.input_size)
        prob = probability_map(self.decoder(self.encoder(torch.cat([x, x.flip(-1)]))), (rgb.height, rgb.width))
        self._recent[key] = prob
        while len(self._recent) > RECENT_MAPS:
            self._recent.popitem(last=False)
        return prob

    def save(self, path: str | Path) -> Path:
        """Atomically write the decoder with the encoder identity it was trained on."""
        path = Path(path)
        blob = {"format": FORMAT, "backbone": self.encoder.identity, "input_size": self.input_size,
                "width": self.decoder.lateral[0].out_channels, "channels": list(self.encoder.channels),
                "state_dict": {k: v.detach().cpu() for k, v in self.decoder.state_dict().items()}}
        with atomic_write(path, "wb", suffix=".pt") as fh:
            torch.save(blob, fh)
        return path

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str | None = None,
             run_id: int | None = None) -> Segmenter:
        """Read a checkpoint written by :meth:`save`; another backbone's checkpoint → :class:`SegmenterError`."""
        path = Path(path)
        if not path.is_file():
            raise SegmenterError(f"segmenter checkpoint not found: {path}")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 — any unpickling failure is the same user error
            raise SegmenterError(f"{path}: cannot be read as a segmenter checkpoint ({e})") from None
        if not isinstance(blob, dict) or blob.get("format") != FORMAT:
            what = "a backbone file" if isinstance(blob, dict) and "triderm_backbone" in blob else "not one"
            raise SegmenterError(f"{path}: not a TriDerm segmenter checkpoint ({what}; expected format {FORMAT})")
        enc = encoder(str(torch.device(device) if device is not None else pick_device()))
        if blob["backbone"] != enc.identity or list(blob["channels"]) != enc.channels:
            raise SegmenterError(f"{path}: trained over backbone {blob['backbone']!r}, but the segmenter encoder "
                                 f"here is {enc.identity!r}; retrain it (python -m core.train_segmenter)")
        decoder = FPNDecoder(enc.channels, int(blob["width"]))
        decoder.load_state_dict(blob["state_dict"])
        return cls(decoder, enc, int(blob["input_size"]), run_id=run_id)


def latest_run(ws: Workspace) -> dict | None:
    """The newest finished ``segmenter`` run of the workspace, or None."""
    return next((r for r in ws.store.runs(kind=RUN_KIND) if r["status"] == "done"), None)


def load_segmenter(ws: Workspace, device: torch.device | str | None = None) -> Segmenter | None:
    """The segmenter of the workspace's latest finished run; None when none was trained."""
    run = latest_run(ws)
    if run is None:
        return None
    rel = (run.get("artifacts") or {}).get("checkpoint")
    if rel is None:
        raise SegmenterError(f"segmenter run {run['id']} has no checkpoint artifact")
    return Segmenter.load(ws.root / rel, device=device, run_id=run["id"])
