"""The segmenter shared between centres: a Hugging Face model folder (``save_pretrained`` layout).

``model.safetensors`` holds the FPN decoder; ``config.json`` the encoder identity it was trained
over, the decoder's shape, the input size, the run's metrics (numbers only) and a data summary of
counts (photos trained on and held out) — never a photo, patient or wound id, nor the paths of
the extra data folders the run read. :func:`load_shared_segmenter` opens such a folder (or an
``hf-hub:<org>/<repo>`` name) as a :class:`~core.segmentation.model.Segmenter`.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from annotations.workspace import Workspace
from core.runtime import load_checkpoint, numbers_only, pick_device, write_model_folder
from core.segmentation.model import FORMAT, RUN_KIND, FPNDecoder, Segmenter, SegmenterError, encoder
from core.vision.backbones import model_folder

SHARED_FORMAT = "triderm-segmenter-shared/1"
#: Counts of a segmenter run's configuration that describe its data without naming any of it.
DATA_COUNTS = ("n_train", "n_val", "val_fraction", "augmented_views")
RECIPE = ("epochs", "batch_size", "lr", "input_size")


class SharedSegmenter(nn.Module, PyTorchModelHubMixin, library_name="triderm-studio",
                      tags=["triderm", "wound-segmentation", "dermatology"]):
    """The decoder of a segmenter run; the constructor's arguments are ``config.json``."""

    def __init__(self, backbone: str, channels: Sequence[int], width: int, input_size: int,
                 recipe: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None,
                 data: dict[str, Any] | None = None, model_format: str = SHARED_FORMAT) -> None:
        super().__init__()
        if model_format != SHARED_FORMAT:
            raise ValueError(f"config.json: model_format {model_format!r} is not {SHARED_FORMAT!r}")
        self.backbone_identity, self.channels, self.input_size = backbone, list(channels), int(input_size)
        self.decoder = FPNDecoder(self.channels, int(width))


def export_segmenter(ws: Workspace, run_id: int, out: str | Path) -> Path:
    """Write segmenter run ``run_id`` of ``ws`` as a :class:`SharedSegmenter` folder ``out`` (new or empty)."""
    run = ws.store.run(run_id)
    if run is None or run["kind"] != RUN_KIND:
        raise ValueError(f"run {run_id}: no segmenter run with that id in {ws.root}")
    rel = (run.get("artifacts") or {}).get("checkpoint")
    if rel is None:
        raise ValueError(f"segmenter run {run_id} has no checkpoint artifact")
    blob = load_checkpoint(ws.root / rel)
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise ValueError(f"{ws.root / rel}: not a TriDerm segmenter checkpoint (expected format {FORMAT})")
    cfg = run["config"]
    model = SharedSegmenter(blob["backbone"], list(blob["channels"]), int(blob["width"]), int(blob["input_size"]),
                            {k: cfg[k] for k in RECIPE if k in cfg}, numbers_only(run["metrics"]),
                            {k: cfg[k] for k in DATA_COUNTS if k in cfg}, model_format=SHARED_FORMAT)
    model.decoder.load_state_dict(blob["state_dict"])
    return write_model_folder(model, out)


def load_shared_segmenter(ref: str | Path, device: torch.device | str | None = None) -> Segmenter:
    """A :class:`Segmenter` from a shared folder or ``hf-hub:<org>/<repo>``; a folder of another kind or
    one trained over another encoder is a :class:`SegmenterError`."""
    try:
        folder = model_folder(ref)
        meta = json.loads((folder / "config.json").read_text())
    except (ValueError, OSError) as e:
        raise SegmenterError(str(e) if isinstance(e, ValueError) else f"{ref}: no readable config.json ({e})") from None
    if not isinstance(meta, dict) or meta.get("model_format") != SHARED_FORMAT:
        raise SegmenterError(f"{ref}: config.json is not a shared TriDerm segmenter (model_format {SHARED_FORMAT})")
    shared = SharedSegmenter.from_pretrained(folder, strict=True)
    enc = encoder(str(torch.device(device) if device is not None else pick_device()))
    if shared.backbone_identity != enc.identity or shared.channels != list(enc.channels):
        raise SegmenterError(f"{ref}: trained over backbone {shared.backbone_identity!r}, but the segmenter encoder "
                             f"here is {enc.identity!r}")
    return Segmenter(shared.decoder, enc, shared.input_size)
