"""Embedding photos a trained run has not seen, in the run's own space.

A TriDerm-V run saves its head (``runs/<id>/head.pt``: configuration, backbone name with its layer, the
embedding centre); a new photo goes through the same frozen backbone at its input size, its
wounds' tokens (from its mask, or the whole photo when it has none) through the head, and its
embedding is normalised like the study's, so distances to the study's photos are comparable. A
fine-tune run (:mod:`core.vision.finetune`) saves its tuned last stage + head and the study's centre
(``runs/<id>/tail.pt``): a new photo goes through the frozen backbone up to stage 6, then the tuned
tail, its wounds' mean tokens averaged (:class:`TunedModel`). A frozen run (``vision-baseline``, what ``--mode
auto`` records without triplets) has no trained weights: a new photo is the mean of its wounds' backbone tokens,
centred on the study's centre (saved with the run's embedding) and scaled to unit length (:class:`FrozenModel`).

A run is shared with other centres as a model folder (Hugging Face's ``save_pretrained`` layout,
:class:`~huggingface_hub.PyTorchModelHubMixin`): ``model.safetensors`` (the head — a
:class:`SharedHead` — or the tuned tail — a :class:`SharedTail` — and the centre) and ``config.json``
(format, backbone, layer, normalisation, training recipe, metrics and a data summary of counts — no
photo, patient or wound id, no description) — a frozen run's folder is its centre (a :class:`SharedFrozen`) — and
``README.md``, the model card (:func:`core.vision.model_card.model_card`). :func:`open_model` opens a run id, such a
folder or an
``hf-hub:<org>/<repo>`` name; a folder is read through :mod:`core.vision.model_files` (self-contained, sizes bounded,
tensors checked against the model before they are read: one :class:`~core.vision.model_files.ModelFileError` otherwise).
"""
from __future__ import annotations

import copy
import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub import PyTorchModelHubMixin
from PIL import Image, ImageOps
from torch import nn

from annotations.store import runs
from annotations.io.readers import mask_to_labels, open_image
from annotations.infra.workspace import Workspace
from core.vision.model_files import (
    ModelFileError,
    backbone_in_folder,
    check_parameters,
    check_sizes,
    folder_file,
    load_weights,
    read_config,
)
from core.vision.model_card import model_card
from core.runtime import load_checkpoint, load_embeddings, numbers_only, write_model_folder
from core.vision.backbones import LITE0_TIMM, Backbone, canonical_name, load_backbone, model_folder, split_layer
from core.vision.baseline import centred_unit
from core.vision.augment import AugmentConfig, WoundAugment
from core.vision.features import forward_fp16, token_mask, view_features, wound_fractions
from core.vision.finetune import RUN_KIND as FINETUNE_RUN, TAIL_FILE, pooling_weights, tail_of
from core.vision.token_tail import token_pooled
from core.vision.pooling import MeanPooling, WoundHead
from core.vision.supervised import MetricHead
from core.vision.triderm import build_head, embedding_normalize
from core.vision.triderm_config import TriDermConfig

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")
HEAD_FORMAT = "triderm-v-head/1"
TAIL_FORMAT = "triderm-v-tail/1"
FROZEN_FORMAT = "triderm-v-frozen/1"
FROZEN_RUN = runs.VISION_BASELINE
#: Counts recorded in a run's configuration that describe its data without naming any of it.
DATA_COUNTS = ("n_images", "n_wounds", "n_expert_triplets", "synthetic")


class SharedHead(nn.Module, PyTorchModelHubMixin, library_name="triderm-studio",
                 tags=["triderm", "wound-embedding", "dermatology"]):
    """A TriDerm-V head and its embedding centre, saved and loaded as a Hugging Face model folder.

    The constructor's arguments are ``config.json``; the module's tensors ``model.safetensors``."""

    center: torch.Tensor  # a buffer

    def __init__(self, channels: int, dim: int, recipe: dict[str, Any], backbone: str, layer: str | None,
                 normalize: str, metrics: dict[str, Any] | None = None, data: dict[str, Any] | None = None,
                 model_format: str = HEAD_FORMAT) -> None:
        super().__init__()
        if model_format != HEAD_FORMAT:
            raise ValueError(f"config.json: model_format {model_format!r} is not {HEAD_FORMAT!r}")
        self.backbone_name, self.layer, self.normalize = backbone, layer, normalize
        self.head = build_head(int(channels), TriDermConfig.from_record(recipe))
        self.register_buffer("center", torch.zeros(int(dim)))


class SharedTail(nn.Module, PyTorchModelHubMixin, library_name="triderm-studio",
                 tags=["triderm", "wound-embedding", "dermatology", "fine-tuned"]):
    """A fine-tune run's tuned last stage + head (:data:`~core.vision.finetune.TAIL`) and the study's centre,
    saved and loaded as a Hugging Face model folder (the backbone's frozen stages come from ``backbone``)."""

    center: torch.Tensor  # a buffer

    def __init__(self, dim: int, recipe: dict[str, Any], backbone: str, metrics: dict[str, Any] | None = None,
                 data: dict[str, Any] | None = None, model_format: str = TAIL_FORMAT) -> None:
        super().__init__()
        if model_format != TAIL_FORMAT:
            raise ValueError(f"config.json: model_format {model_format!r} is not {TAIL_FORMAT!r}")
        if canonical_name(split_layer(backbone)[0]).partition(".")[0] != LITE0_TIMM:
            raise ValueError(f"config.json: backbone {backbone!r} is not EfficientNet-Lite0, the only backbone a "
                             "fine-tuned tail is made for")
        self.backbone_name, self.recipe = backbone, recipe
        self.tail = tail_of(load_backbone(backbone, device="cpu", pretrained=False, layer="stage6"))
        self.members = nn.ModuleList(copy.deepcopy(self.tail) for _ in range(int(recipe.get("members", 1)) - 1))
        self.register_buffer("center", torch.zeros(int(dim)))


class SharedFrozen(nn.Module, PyTorchModelHubMixin, library_name="triderm-studio",
                   tags=["triderm", "wound-embedding", "dermatology", "frozen"]):
    """A frozen run's embedding centre, saved and loaded as a Hugging Face model folder (the backbone, with its
    layer, comes from ``backbone``; nothing was trained)."""

    center: torch.Tensor  # a buffer

    def __init__(self, dim: int, backbone: str, normalize: str, metrics: dict[str, Any] | None = None,
                 data: dict[str, Any] | None = None, model_format: str = FROZEN_FORMAT) -> None:
        super().__init__()
        if model_format != FROZEN_FORMAT:
            raise ValueError(f"config.json: model_format {model_format!r} is not {FROZEN_FORMAT!r}")
        if normalize not in ("center-l2", "none"):
            raise ValueError(f"config.json: normalize {normalize!r} is not 'center-l2' or 'none'")
        self.backbone_name, self.normalize = backbone, normalize
        self.register_buffer("center", torch.zeros(int(dim)))


def _data_summary(ws: Workspace, run: dict[str, Any]) -> dict[str, Any]:
    """The counts of :data:`DATA_COUNTS` a run recorded (a frozen run: in its metrics; it used no triplets), and
    its workspace's patients."""
    if run["kind"] == FROZEN_RUN:
        data = {"n_images": run["metrics"]["n_images"], "n_wounds": run["metrics"]["n_wounds"],
                "n_expert_triplets": 0, "synthetic": run["config"]["synthetic"]}
    else:
        data = {k: run["config"][k] for k in DATA_COUNTS if k in run["config"]}
    data["n_patients"] = len({i["patient_id"] for i in ws.store.images() if i["patient_id"]})
    return data


def export_tail(ws: Workspace, run_id: int, out: str | Path) -> Path:
    """Write fine-tune run ``run_id`` as a :class:`SharedTail` folder ``out`` (new or empty); returns it.

    The recipe holds :class:`~core.vision.finetune.FineTuneConfig`'s fields, the metrics their numbers, the
    data summary the counts of :data:`DATA_COUNTS` and the patients'."""
    run = ws.store.run(run_id)
    assert run is not None, run_id
    blob = _tail_blob(ws, run_id)
    data = _data_summary(ws, run)
    model = SharedTail(int(blob["center"].numel()), blob["config"], blob["backbone"], numbers_only(run["metrics"]),
                       data, model_format=TAIL_FORMAT)
    model.tail.load_state_dict(blob["tail"])
    for member, state in zip(model.members, blob.get("members", [])):
        member.load_state_dict(state)
    model.center.copy_(blob["center"])
    return write_model_folder(model, out, model_card(run, data, f"{blob['backbone']}@stage6"))


def export_head(ws: Workspace, run_id: int, out: str | Path) -> Path:
    """Write TriDerm-V run ``run_id`` as a :class:`SharedHead` folder ``out`` (new or empty); returns it.

    The recipe holds the training options only (:class:`~core.vision.triderm_config.TriDermConfig`'s fields), the
    metrics their numbers, the data summary the counts of :data:`DATA_COUNTS` and the patients'."""
    blob = _head_blob(ws, run_id)
    run = ws.store.run(run_id)
    assert run is not None, run_id  # just recorded
    cfg = TriDermConfig.from_record(blob["config"])
    recipe = {k: v for k, v in asdict(cfg).items() if k != "backbone"}
    data = _data_summary(ws, run)
    model = SharedHead(int(blob["channels"]), int(blob["center"].numel()), recipe, blob["backbone"],
                       run["config"].get("layer"), embedding_normalize(cfg), numbers_only(run["metrics"]),
                       data, model_format=HEAD_FORMAT)
    model.head.load_state_dict(blob["head"])
    model.center.copy_(blob["center"])
    return write_model_folder(model, out, model_card(run, data, blob["backbone"]))


def export_frozen(ws: Workspace, run_id: int, out: str | Path) -> Path:
    """Write frozen run ``run_id`` (``vision-baseline``: backbone name with its layer, normalisation, the study's
    centre) as a :class:`SharedFrozen` folder ``out`` (new or empty); returns it."""
    run, center = _frozen_record(ws, run_id)
    data = _data_summary(ws, run)
    model = SharedFrozen(len(center), run["config"]["backbone"], run["config"]["normalize"],
                         numbers_only(run["metrics"]), data, model_format=FROZEN_FORMAT)
    model.center.copy_(torch.from_numpy(center))
    return write_model_folder(model, out, model_card(run, data, run["config"]["backbone"]))


def _frozen_record(ws: Workspace, run_id: int) -> tuple[dict[str, Any], np.ndarray]:
    """Frozen run ``run_id``'s record and its centre (zeros for a raw, ``none``-normalised run)."""
    run = ws.store.run(run_id)
    if run is None or run["kind"] != FROZEN_RUN:
        raise ValueError(f"--model {run_id}: no frozen (vision-baseline) run with that id in {ws.root}")
    center = load_embeddings(ws, run_id).get("center")
    if center is None:
        raise ValueError(f"--model {run_id}: the frozen run saved no embedding centre; it predates centre saving: "
                         "run `python -m core.train_triderm --mode frozen` again")
    return run, np.asarray(center, dtype=np.float32)


def _head_blob(ws: Workspace, run_id: int) -> dict[str, Any]:
    run = ws.store.run(run_id)
    if run is None or run["kind"] != runs.VISION_TRIDERM:
        raise ValueError(f"--model {run_id}: no TriDerm-V (vision-triderm) run with that id in {ws.root}")
    path = ws.run_dir(run_id) / "head.pt"
    if not path.exists():
        raise ValueError(f"--model {run_id}: the run has no saved head ({path}); it predates head saving")
    blob = load_checkpoint(path)
    if blob["config"]["supervise"] and "supervise_dim" not in blob["config"]:
        raise ValueError(f"--model {run_id}: a supervised run from before the metric head (its head mixes "
                         "VICReg and expert terms and is no longer built); train it again")
    return blob


@dataclass
class TrainedHead:
    """A TriDerm-V run's frozen backbone, trained head and embedding centre."""

    run_id: int | None
    backbone: Backbone
    head: WoundHead | MetricHead
    center: np.ndarray
    normalize: str

    @classmethod
    def load(cls, ws: Workspace, run_id: int, device: torch.device | str | None = None) -> TrainedHead:
        """Load run ``run_id``'s trained head and its backbone."""
        blob = _head_blob(ws, run_id)
        cfg = TriDermConfig.from_record(blob["config"])
        backbone = load_backbone(blob["backbone"], device=device)
        head = build_head(int(blob["channels"]), cfg)
        head.load_state_dict(blob["head"])
        return cls(run_id, backbone, head.to(backbone.device).eval(), blob["center"].numpy(),
                   embedding_normalize(cfg))

    @classmethod
    def from_folder(cls, folder: Path, device: torch.device | str | None = None,
                    root: Path | None = None) -> TrainedHead:
        """A :class:`SharedHead` folder's head, centre and backbone (``root``: see :func:`shared_model`)."""
        shared = shared_model(SharedHead, folder, root)
        assert isinstance(shared, SharedHead)
        backbone = load_backbone(shared.backbone_name, device=device, layer=shared.layer)
        return cls(None, backbone, shared.head.to(backbone.device).eval(), shared.center.numpy(), shared.normalize)

    def embed(self, image: Image.Image, labels: np.ndarray | None = None, sha256: str | None = None) -> np.ndarray:
        """One photo's embedding: the mean over its wounds (label values > 0; the whole photo
        when ``labels`` is None or empty), normalised like the run's study photos (``sha256``: unused, no views)."""
        x, labels, wounds = model_input(self.backbone, image, labels)
        with torch.no_grad():
            feat = self.backbone(self.backbone.normalize(x))[0]
            grid_h, grid_w = feat.shape[-2:]
            mask = token_mask(wound_fractions(labels, wounds, (grid_h, grid_w))).flatten(1)
            seg, loc = torch.nonzero(mask, as_tuple=True)
            z, _ = self.head(feat.flatten(1).T[loc].to(self.backbone.device), seg.to(self.backbone.device),
                             len(wounds))
        emb = z.float().cpu().numpy().mean(0)
        return centred_unit(emb, self.center) if self.normalize == "center-l2" else emb


@dataclass
class TunedModel:
    """A fine-tune run's frozen backbone up to stage 6, its tuned last stage + head and the study's centre; with
    ``views`` > 0 a photo's embedding is averaged over its inference view and its first ``views`` augmented views
    (drawn like the run's feature cache: from the photo's sha256, the backbone's default augmentation and ``seed``);
    an ensemble's photo is its members' unit embeddings concatenated, scaled by 1/√members."""

    run_id: int | None
    backbone: Backbone
    tail: nn.Module
    center: np.ndarray
    views: int = 0
    seed: int = 0
    members: tuple[nn.Module, ...] = ()  # an ensemble's other tails (the centre: every member's, concatenated)
    normalize: str = "center-l2"

    @classmethod
    def load(cls, ws: Workspace, run_id: int, device: torch.device | str | None = None) -> TunedModel:
        """Load fine-tune run ``run_id``'s tuned weights and its backbone."""
        blob = _tail_blob(ws, run_id)
        backbone = load_backbone(blob["backbone"], device=device, layer="stage6")
        tails = []
        for state in [blob["tail"], *blob.get("members", [])]:
            tails.append(copy.deepcopy(tail_of(backbone)))
            tails[-1].load_state_dict(state)
            tails[-1].to(backbone.device).eval()
        return cls(run_id, backbone, tails[0], blob["center"].numpy(), *_views(blob["config"]), tuple(tails[1:]))

    @classmethod
    def from_folder(cls, folder: Path, device: torch.device | str | None = None,
                    root: Path | None = None) -> TunedModel:
        """A :class:`SharedTail` folder's tuned tail, centre and backbone (``root``: see :func:`shared_model`)."""
        shared = shared_model(SharedTail, folder, root)
        assert isinstance(shared, SharedTail)
        backbone = load_backbone(shared.backbone_name, device=device, layer="stage6")
        return cls(None, backbone, shared.tail.to(backbone.device).eval(), shared.center.numpy(),
                   *_views(shared.recipe), tuple(m.to(backbone.device).eval() for m in shared.members))

    def embed(self, image: Image.Image, labels: np.ndarray | None = None, sha256: str | None = None) -> np.ndarray:
        """One photo's embedding as the run embedded its study photos: the tuned tail's tokens averaged
        per wound, then over wounds (the whole photo when ``labels`` is None or empty), over the inference view and
        ``views`` augmented views (drawn from ``sha256``: the stored photo's, else its pixels'), centred, unit
        length."""
        image = ImageOps.exif_transpose(image).convert("RGB")
        x, labels, wounds = model_input(self.backbone, image, labels)
        with torch.no_grad():
            feats = forward_fp16(self.backbone, x).float()  # the feature cache's precision
            weights = pooling_weights(wound_fractions(labels, wounds, (feats.shape[-2], feats.shape[-1])))[None]
            if self.views:
                sha = sha256 or hashlib.sha256(np.asarray(image).tobytes()).hexdigest()
                augment = WoundAugment(AugmentConfig(size=self.backbone.input_size))
                views, frac = view_features(augment, image, labels, wounds, sha, range(self.views), self.seed,
                                            lambda v: forward_fp16(self.backbone, v), self.backbone.device)
                view_w = torch.stack([pooling_weights(f) for f in frac])
                kept = view_w.flatten(1).sum(1) > 0  # a view where no wound kept a token: the inference view's
                feats = torch.cat([feats, torch.where(kept[:, None, None, None], views.float(), feats)])
                weights = torch.cat([weights, torch.where(kept[:, None, None], view_w, weights)])
            dev = self.backbone.device
            tails = [self.tail, *self.members]
            embs = [token_pooled(t, feats.to(dev), weights.to(dev)).mean(0).double().cpu().numpy() for t in tails]
        centres = np.split(self.center, len(tails))
        return np.concatenate([centred_unit(e, c) for e, c in zip(embs, centres)]) / np.sqrt(len(tails))


def _views(recipe: dict[str, Any]) -> tuple[int, int]:
    """(augmented views averaged in an embedding, the feature cache's seed) of a fine-tune run's saved config
    (a run saved before test-time views: none)."""
    return int(recipe.get("embedded_views", 0)), int(recipe.get("seed", 0))


@dataclass
class FrozenModel:
    """A frozen run's backbone (with its layer) and the study's centre: no trained weights."""

    run_id: int | None
    backbone: Backbone
    center: np.ndarray
    normalize: str

    @classmethod
    def load(cls, ws: Workspace, run_id: int, device: torch.device | str | None = None) -> FrozenModel:
        """Frozen run ``run_id``'s backbone and centre."""
        run, center = _frozen_record(ws, run_id)
        return cls(run_id, load_backbone(run["config"]["backbone"], device=device), center,
                   run["config"]["normalize"])

    @classmethod
    def from_folder(cls, folder: Path, device: torch.device | str | None = None,
                    root: Path | None = None) -> FrozenModel:
        """A :class:`SharedFrozen` folder's centre and backbone (``root``: see :func:`shared_model`)."""
        shared = shared_model(SharedFrozen, folder, root)
        assert isinstance(shared, SharedFrozen)
        return cls(None, load_backbone(shared.backbone_name, device=device), shared.center.numpy(), shared.normalize)

    def embed(self, image: Image.Image, labels: np.ndarray | None = None, sha256: str | None = None) -> np.ndarray:
        """One photo's embedding as the run embedded its study photos: each wound's mean token (the whole photo
        when ``labels`` is None or empty), their mean, centred and unit length for a ``center-l2`` run
        (``sha256``: unused, no views)."""
        x, labels, wounds = model_input(self.backbone, image, labels)
        with torch.no_grad():
            feat = self.backbone(self.backbone.normalize(x))[0].half().float()  # the feature cache's precision
            mask = token_mask(wound_fractions(labels, wounds, (feat.shape[-2], feat.shape[-1]))).flatten(1)
            seg, loc = torch.nonzero(mask, as_tuple=True)
            wound_emb, _ = MeanPooling()(feat.flatten(1).T[loc].cpu(), seg, len(wounds))
        emb = wound_emb.double().numpy().mean(0)
        return centred_unit(emb, self.center) if self.normalize == "center-l2" else emb


Model = TrainedHead | TunedModel | FrozenModel


def open_model(ws: Workspace, ref: str, device: torch.device | str | None = None) -> Model:
    """The model ``--model ref`` names: a TriDerm-V, fine-tune or frozen run id of ``ws``, or a folder written by
    :func:`export_head` / :func:`export_tail` / :func:`export_frozen` (local or an ``hf-hub:<org>/<repo>`` name),
    told by its format."""
    if ref.isdigit():
        run = ws.store.run(int(ref))
        kind = None if run is None else run["kind"]
        if kind == FINETUNE_RUN:
            return TunedModel.load(ws, int(ref), device)
        return FrozenModel.load(ws, int(ref), device) if kind == FROZEN_RUN else TrainedHead.load(ws, int(ref), device)
    folder = model_folder(ref)
    root = folder.parents[1] if ref.startswith("hf-hub:") else None  # a cache snapshot's links: its repo's blobs
    meta = read_config(folder, root)
    model_format = meta.get("model_format")
    if model_format == HEAD_FORMAT:
        return TrainedHead.from_folder(folder, device, root)
    if model_format == TAIL_FORMAT:
        return TunedModel.from_folder(folder, device, root)
    if model_format == FROZEN_FORMAT:
        return FrozenModel.from_folder(folder, device, root)
    raise ValueError(f"--model {ref}: config.json is not a TriDerm-V head, fine-tuned tail or frozen embedding "
                     f"(model_format {HEAD_FORMAT}, {TAIL_FORMAT} or {FROZEN_FORMAT})")


Shared = SharedHead | SharedTail | SharedFrozen


def shared_model(kind: type[Shared], folder: Path, root: Path | None = None) -> Shared:
    """A model folder's :class:`SharedHead`, :class:`SharedTail` or :class:`SharedFrozen`: its ``config.json``
    checked (sizes bounded, the backbone's file inside the folder) before the module is built, then
    ``model.safetensors`` checked and loaded. ``root`` is where a Hugging Face snapshot's links may point (else no
    link is followed)."""
    config = read_config(folder, root)
    where = f"{folder / 'config.json'}"
    check_sizes(config, where, ("channels", "dim"))
    recipe = config.get("recipe")
    if kind is SharedHead:
        if not isinstance(recipe, dict):
            raise ModelFileError(f"{where}: recipe {recipe!r} is not an object of training options")
        check_sizes(recipe, f"{where} (recipe)", ("dim", "hidden", "supervise_dim", "supervise_heads"))
    if "backbone" in config:
        config["backbone"] = backbone_in_folder(config["backbone"], folder, where, root)
    if kind is SharedHead:  # the head's sizes multiply: counted on the meta device (nothing allocated) first
        with torch.device("meta"):
            check_parameters(_build(kind, config, where), where)
    model = _build(kind, config, where)
    load_weights(model, folder_file(folder, "model.safetensors", root))
    return model.eval()


def _build(kind: type[Shared], config: dict[str, Any], where: str) -> Shared:
    """``kind(**config)``; a missing, unknown or invalid field is a :class:`~core.vision.model_files.ModelFileError`."""
    try:
        return kind(**config)
    except (TypeError, ValueError, KeyError) as e:
        raise ModelFileError(f"{where}: {e}") from None


def _tail_blob(ws: Workspace, run_id: int) -> dict[str, Any]:
    path = ws.run_dir(run_id) / TAIL_FILE
    if not path.exists():
        raise ValueError(f"--model {run_id}: the fine-tune run has no saved weights ({path}); it predates "
                         "weight saving: train it again")
    return load_checkpoint(path)


def model_input(backbone: Backbone, image: Image.Image, labels: np.ndarray | None) -> tuple[torch.Tensor, np.ndarray,
                                                                                             list[int]]:
    """A photo as ``backbone``'s inference input (upright RGB resized to its square, in [0, 1], 1×3×S×S), its
    label map (the whole photo is one wound when ``labels`` is None or empty) and its wound values."""
    image = ImageOps.exif_transpose(image).convert("RGB")
    if labels is None or not (labels > 0).any():
        labels = np.ones((image.height, image.width), dtype=np.int32)
    if labels.shape != (image.height, image.width):
        raise ValueError(f"mask shape {labels.shape} differs from the photo's {(image.height, image.width)}")
    s = backbone.input_size
    x = torch.from_numpy(np.asarray(image.resize((s, s), Image.Resampling.BILINEAR)).copy()).permute(2, 0, 1)
    return x.float()[None] / 255, labels, [int(v) for v in np.unique(labels) if v > 0]


def photo_files(folder: Path) -> list[tuple[str, Path, Path | None]]:
    """(name, photo, mask or None) for the photos of ``folder`` (or its ``images/``), masks from
    ``masks/<name>.png`` beside them when present. No symbolic links are followed."""
    folder = Path(folder)
    images = folder / "images" if (folder / "images").is_dir() else folder
    if not images.is_dir():
        raise ValueError(f"--images {folder}: not a folder")
    out = []
    for p in sorted(images.iterdir()):
        if p.suffix.lower() not in IMAGE_SUFFIXES or not p.is_file() or p.is_symlink():
            continue
        mask = folder / "masks" / f"{p.stem}.png"
        out.append((p.stem, p, mask if mask.is_file() and not mask.is_symlink() else None))
    if not out:
        raise ValueError(f"--images {folder}: no photos ({', '.join(IMAGE_SUFFIXES)})")
    return out


def read_labels(path: Path | None) -> np.ndarray | None:
    """A mask file as a label map (binary masks split into connected wounds, as on import), read as import reads
    a mask (:func:`~annotations.io.readers.open_image`: the pixel budget, one DatasetError naming the file)."""
    if path is None:
        return None
    _, mask, _ = open_image(Path(path).read_bytes(), str(path), ".png")
    return mask_to_labels(np.asarray(mask))
