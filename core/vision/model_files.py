"""Model files from elsewhere (a shared model folder, a segmenter checkpoint): one clear error, before anything big.

A model folder (``config.json`` + ``model.safetensors``, Hugging Face's ``save_pretrained`` layout) is read only
through here:

- every file it names is a regular file inside the folder: a link, or a name resolving outside the folder
  (``../``, an absolute path), is refused. A Hugging Face cache snapshot's files are the cache's own links into
  its repository folder (its ``root``), where they must resolve;
- ``config.json`` is a JSON object of at most :data:`MAX_CONFIG_BYTES`; the numbers that size a module are
  integers within :data:`LIMITS`, checked before any module is built (no 1 TB allocation from a typo), and a
  shared head has at most :data:`MAX_PARAMETERS` parameters (counted on the meta device);
- a backbone named by file (``file:…``, a ``.pt``/``.pth`` path, an open_clip weights path) is a file of the
  folder; a registry name (``efficientnet-lite0``, ``timm:…``, ``hf-hub:…``) names no file;
- ``model.safetensors``'s header must be readable and list exactly the module's tensors with their shapes before
  any tensor is read (a truncated, fake or mismatched file is refused).

Every refusal is a :class:`ModelFileError` naming the file and the field.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

#: Largest ``config.json`` read.
MAX_CONFIG_BYTES = 1 << 20
#: Allowed range of each size field of a model's configuration (inclusive): the photo side a model resizes to,
#: a decoder's width, feature channels and embedding or hidden dimensions, heads of a metric ensemble.
LIMITS: dict[str, tuple[int, int]] = {"input_size": (32, 2048), "width": (1, 1024), "channels": (1, 8192),
                                      "dim": (1, 8192), "hidden": (1, 8192), "supervise_dim": (1, 8192),
                                      "supervise_heads": (1, 64)}
#: Most parameters a shared head may have (float32: 256 MiB), counted before it is built for real.
MAX_PARAMETERS = 64 << 20


class ModelFileError(ValueError):
    """A model file that cannot be used; the message names the file and the field."""


def folder_file(folder: Path, name: str, root: Path | None = None) -> Path:
    """``folder/name`` as a regular file inside ``root`` (default: ``folder``, where no link is followed)."""
    base = Path(folder).resolve()
    path = base / name
    try:
        resolved = path.resolve()
    except (OSError, ValueError, RuntimeError) as e:  # a NUL byte, a link loop
        raise ModelFileError(f"{folder}: {name!r} is not a file name of the model folder ({e})") from None
    inside = Path(root).resolve() if root is not None else base
    if not resolved.is_relative_to(inside):
        raise ModelFileError(f"{folder}: {name!r} resolves outside the model folder ({resolved}); a model folder "
                             "is self-contained")
    if root is None:
        for part in [path, *path.parents]:
            if part == base:
                break
            if part.is_symlink():
                raise ModelFileError(f"{folder}: {name!r} is a link ({part}); a model folder holds its own files")
    if not resolved.is_file():
        raise ModelFileError(f"{folder}: {name!r} is not a file of the model folder")
    return resolved


def read_config(folder: Path, root: Path | None = None) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict (at most :data:`MAX_CONFIG_BYTES`, a JSON object)."""
    path = folder_file(folder, "config.json", root)
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ModelFileError(f"{path}: {path.stat().st_size:,} bytes, more than the {MAX_CONFIG_BYTES:,} a model "
                             "configuration may have")
    try:
        config = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise ModelFileError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(config, dict):
        raise ModelFileError(f"{path}: not a JSON object but a {type(config).__name__}")
    return config


def sized(value: Any, field: str, where: str) -> int:
    """``value`` as the size field ``field`` (an integer within :data:`LIMITS`; digits in a string are read as
    safetensors metadata writes them)."""
    low, high = LIMITS[field]
    number = int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
        raise ModelFileError(f"{where}: {field} {value!r} must be an integer from {low} to {high}")
    return number


def check_sizes(config: dict[str, Any], where: str, fields: tuple[str, ...]) -> None:
    """Every field of ``fields`` present in ``config`` within :data:`LIMITS` (a missing one is the builder's to
    name)."""
    for field in fields:
        if field in config:
            sized(config[field], field, where)


def check_parameters(module: nn.Module, where: str) -> None:
    """At most :data:`MAX_PARAMETERS` parameters in ``module`` (built on the meta device: nothing allocated)."""
    count = sum(p.numel() for p in module.parameters())
    if count > MAX_PARAMETERS:
        raise ModelFileError(f"{where}: the sizes make a model of {count:,} parameters, more than the "
                             f"{MAX_PARAMETERS:,} allowed")


def backbone_in_folder(spec: Any, folder: Path, where: str, root: Path | None = None) -> str:
    """The backbone name ``spec`` of a model folder, a file it names replaced by that file's absolute path
    (resolved in ``folder``; refused outside it or through a link)."""
    from core.vision.backbones import canonical_name, split_layer

    if not isinstance(spec, str) or not spec:
        raise ModelFileError(f"{where}: backbone {spec!r} is not a backbone name")
    base, layer = split_layer(spec)
    base = canonical_name(base)
    at = f"@{layer}" if layer else ""
    if base.startswith("open_clip:"):
        model_name, _, tag = base[len("open_clip:"):].partition(":")
        if model_name.startswith("local-dir") or ":" in tag:
            raise ModelFileError(f"{where}: backbone {spec!r} names a folder outside the model folder")
        weights = (".pt", ".pth", ".bin", ".safetensors")
        if tag and (any(c in tag for c in "/\\\0") or Path(tag).suffix.lower() in weights
                    or _exists(Path(folder) / tag) or _exists(Path(tag))):  # open_clip reads a tag naming a file
            return f"open_clip:{model_name}:{folder_file(folder, tag, root)}{at}"
        return spec
    if base.startswith("file:") or (base.partition(":")[0] not in ("timm", "hf-hub")  # as load_backbone tells a file
                                    and Path(base).suffix.lower() in (".pt", ".pth")):
        path = folder_file(folder, base.removeprefix("file:"), root)
        return f"file:{path}{at}"
    if any(c in base for c in "\\") or ".." in base or base.startswith(("/", "local-dir:")):
        raise ModelFileError(f"{where}: backbone {spec!r} names a path outside the model folder")
    return spec


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long for the file system
        return False


def load_weights(module: nn.Module, path: Path) -> None:
    """Load safetensors ``path`` into ``module``: its header must list exactly the module's tensors with their
    shapes (checked before any tensor is read)."""
    from safetensors import SafetensorError, safe_open

    expected = module.state_dict()
    try:
        with safe_open(str(path), framework="pt") as fh:
            names = set(fh.keys())
            missing, extra = sorted(expected.keys() - names), sorted(names - expected.keys())
            if missing or extra:
                raise ModelFileError(f"{path}: the tensors do not fit the model (missing {missing[:3]}, "
                                     f"unexpected {extra[:3]})")
            for name, tensor in expected.items():
                shape = tuple(fh.get_slice(name).get_shape())
                if shape != tuple(tensor.shape):
                    raise ModelFileError(f"{path}: tensor {name!r} has shape {shape}, the model's is "
                                         f"{tuple(tensor.shape)}")
            state = {name: fh.get_tensor(name) for name in expected}
        module.load_state_dict(state, strict=True)
    except ModelFileError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError) as e:
        raise ModelFileError(f"{path}: not a readable safetensors file of this model ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else e!r})") from None
