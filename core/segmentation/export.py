"""The segmenter shared between centres: a Hugging Face model folder (``save_pretrained`` layout).

``model.safetensors`` holds the tuned encoder stages and the FPN decoder; ``config.json`` the encoder (name and
identity) it was trained over, its threshold, the decoder's shape, the input size, the run's metrics (numbers only) and a data summary of
counts (photos trained on and held out) — never a photo, patient or wound id, nor the paths of
the extra data folders the run read — and its model card (``README.md``, :func:`core.vision.model_card.model_card`).
:func:`load_shared_segmenter` opens such a folder (or an
``hf-hub:<org>/<repo>`` name) as a :class:`~core.segmentation.model.Segmenter`, read through
:mod:`core.vision.model_files` (self-contained, ``width`` and ``input_size`` bounded before the network is built,
tensors checked against it): a damaged or hostile folder is one :class:`SegmenterError`.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from annotations.infra.workspace import Workspace
from core.vision.model_card import model_card
from core.vision.model_files import check_sizes, folder_file, load_weights, read_config
from core.runtime import numbers_only, pick_device, write_model_folder
from core.segmentation.model import (
    DEFAULT_ENCODER,
    ENCODERS,
    RUN_KIND,
    TEST_FLIPS,
    THRESHOLD,
    Segmenter,
    SegmenterError,
    SegNet,
    encoder,
    run_checkpoint,
)
from core.vision.backbones import model_folder

SHARED_FORMAT = "triderm-segmenter-shared/1"
#: Counts of a segmenter run's configuration that describe its data without naming any of it.
DATA_COUNTS = ("n_train", "n_val", "val_fraction", "augmented_views")
RECIPE = ("epochs", "batch_size", "lr", "input_size")


class SharedSegmenter(nn.Module, PyTorchModelHubMixin, library_name="triderm-studio",
                      tags=["triderm", "wound-segmentation", "dermatology"]):
    """The trained part of a segmenter run (tuned encoder stages and decoder); the constructor's arguments
    are ``config.json``."""

    def __init__(self, backbone: str, channels: Sequence[int], width: int, input_size: int, tta: int = TEST_FLIPS,
                 recipe: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None,
                 data: dict[str, Any] | None = None, model_format: str = SHARED_FORMAT,
                 encoder_name: str = DEFAULT_ENCODER, threshold: float = THRESHOLD) -> None:
        super().__init__()
        if model_format != SHARED_FORMAT:
            raise ValueError(f"config.json: model_format {model_format!r} is not {SHARED_FORMAT!r}")
        if encoder_name not in ENCODERS:
            raise SegmenterError(f"config.json: encoder_name {encoder_name!r} is none of {sorted(ENCODERS)}")
        if not (isinstance(threshold, (int, float)) and 0 < threshold < 1):
            raise SegmenterError(f"config.json: threshold {threshold!r} must be a number in (0, 1)")
        self.encoder_name, self.threshold = encoder_name, float(threshold)
        enc = encoder("cpu", encoder_name)
        if backbone != enc.identity or list(channels) != enc.channels:
            raise SegmenterError(f"trained over backbone {backbone!r}, but the segmenter encoder here is "
                                 f"{enc.identity!r}")
        self.input_size, self.tta = int(input_size), int(tta)
        self.net = SegNet(enc.imagenet_stages(), list(channels), int(width))


def export_segmenter(ws: Workspace, run_id: int, out: str | Path) -> Path:
    """Write segmenter run ``run_id`` of ``ws`` as a :class:`SharedSegmenter` folder ``out`` (new or empty)."""
    run = ws.store.run(run_id)
    if run is None or run["kind"] != RUN_KIND:
        raise ValueError(f"run {run_id}: no segmenter run with that id in {ws.root}")
    seg = Segmenter.load(run_checkpoint(ws, run), device="cpu", run_id=run_id)
    cfg = run["config"]
    data = {k: cfg[k] for k in DATA_COUNTS if k in cfg}
    model = SharedSegmenter(seg.encoder.identity, seg.encoder.channels, seg.net.decoder.width,
                            seg.input_size, seg.tta, {k: cfg[k] for k in RECIPE if k in cfg},
                            numbers_only(run["metrics"]), data, encoder_name=seg.encoder.name, threshold=seg.threshold)
    model.net.load_state_dict(seg.net.state_dict())
    return write_model_folder(model, out, model_card(run, {**data, "synthetic": ws.is_synthetic},
                                                     ENCODERS[seg.encoder.name]))


def load_shared_segmenter(ref: str | Path, device: torch.device | str | None = None) -> Segmenter:
    """A :class:`Segmenter` from a shared folder or ``hf-hub:<org>/<repo>``; a folder of another kind or
    one trained over another encoder is a :class:`SegmenterError`."""
    try:
        folder = model_folder(ref)
        root = folder.parents[1] if str(ref).startswith("hf-hub:") else None  # a cache snapshot's links: its blobs
        meta = read_config(folder, root)
        if meta.get("model_format") != SHARED_FORMAT:
            raise SegmenterError(f"{ref}: config.json is not a shared TriDerm segmenter (model_format "
                                 f"{SHARED_FORMAT})")
        check_sizes(meta, f"{folder / 'config.json'}", ("width", "input_size"))
        if meta.get("tta", TEST_FLIPS) not in (1, 2, 4):
            raise SegmenterError(f"{folder / 'config.json'}: tta {meta.get('tta')!r} must be 1, 2 or 4")
        try:
            shared = SharedSegmenter(**meta)
        except (TypeError, ValueError) as e:
            raise SegmenterError(f"{folder / 'config.json'}: {e}") from None
        load_weights(shared, folder_file(folder, "model.safetensors", root))
    except SegmenterError:
        raise
    except ValueError as e:  # a ModelFileError, or model_folder's
        raise SegmenterError(str(e)) from None
    enc = encoder(str(torch.device(device) if device is not None else pick_device()), shared.encoder_name)
    return Segmenter(shared.net, enc, shared.input_size, source=str(ref), tta=shared.tta, threshold=shared.threshold)
