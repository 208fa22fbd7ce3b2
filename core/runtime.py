"""Shared plumbing of every job: device choice, opening a workspace, run artifacts.

- **Device**: CUDA when available, else the CPU; a job's ``--device`` fixes it for the whole process
  (:func:`use_device`, called by :func:`core.cli.parse_args`).
- **Precision**: on CUDA, autocast in bf16 where ``torch.cuda.is_bf16_supported()``, else in fp16 with a
  loss scaler (:func:`grad_scaler`); ``fp32`` turns it off. A job's ``--precision`` chooses (:func:`use_precision`),
  else ``$TRIDERM_CUDA_PRECISION``, else ``auto``; on the CPU it is always fp32 (faster and exact there).
- **Workspace**: :func:`open_workspace` opens the ``--workspace`` of a job, importing the
  SYNTHETIC phantom demo into an empty one, and turns user errors into one clear ``parser``
  error (:func:`user_errors`).
- **Shared models**: :func:`write_model_folder` writes a ``save_pretrained`` model folder for
  ``python -m core.export_model``; :func:`numbers_only` keeps a run's metrics free of text.
- **Run artifacts**: every run that produces an image embedding writes
  ``runs/<id>/embeddings.npz`` through :func:`save_embeddings`; evaluation, fusion, retrieval
  and the explorer read it back with :func:`load_embeddings`. The run record itself (config,
  seed, git sha, metrics) is the store's (:meth:`annotations.store.store.Store.start_run`).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import logging
import math
import pickle
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from annotations.infra.fileio import atomic_write, staged_folder
from annotations.infra.workspace import Workspace
from annotations.store.run_records import git_sha

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # torch is imported where a device or checkpoint is used: reading embeddings needs none
    import torch

__all__ = [
    "DEMO_SEED",
    "DEVICES",
    "PRECISIONS",
    "PRECISION_ENV",
    "amp_dtype",
    "autocast",
    "ensure_images",
    "git_sha",
    "grad_scaler",
    "init_distributed",
    "json_safe",
    "load_checkpoint",
    "load_embeddings",
    "numbers_only",
    "open_workspace",
    "pick_device",
    "resolve_device",
    "save_embeddings",
    "source_fingerprint",
    "torch_threads",
    "use_device",
    "use_precision",
    "user_errors",
    "write_model_folder",
]

DEMO_SEED = 0
EMBEDDINGS_FILE = "embeddings.npz"


DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
PRECISION_ENV = "TRIDERM_CUDA_PRECISION"  # one of PRECISIONS: the CUDA precision when --precision is auto
_chosen_device: torch.device | None = None
_chosen_precision: str | None = None


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """``auto``/``None``: ``cuda`` when a GPU is available, else ``cpu``; ``cpu``/``cuda`` as asked
    (``cuda`` without a GPU is a ValueError, never a silent fall-back)."""
    import torch

    if spec is None or str(spec) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type not in DEVICES:
        raise ValueError(f"device {spec!r}: choose from {', '.join(DEVICES)}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (use --device cpu or auto)")
    return device


def use_device(spec: str | torch.device | None) -> torch.device:
    """Set the process's device (a job's ``--device``) and return it: after ``cpu``/``cuda`` every
    :func:`pick_device` returns that device, so one job never mixes devices; ``auto``/``None``
    clears the choice (``pick_device`` then takes CUDA when available, the same for the whole job)."""
    global _chosen_device
    device = resolve_device(spec)
    _chosen_device = None if spec is None or str(spec) == "auto" else device
    return device


def pick_device() -> torch.device:
    """The device fixed by :func:`use_device`, else ``cuda`` when a GPU is available, else ``cpu``."""
    return _chosen_device if _chosen_device is not None else resolve_device("auto")


def init_distributed() -> tuple[int, int, torch.device]:
    """(rank, world size, device) of this process: under ``torchrun`` (``LOCAL_RANK`` set, one
    process or many) it initialises the default process group (nccl on ``cuda:LOCAL_RANK``, gloo
    on the CPU); callers run collectives when ``torch.distributed.is_initialized()``."""
    import os

    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if "LOCAL_RANK" not in os.environ:
        return 0, 1, pick_device()
    if pick_device().type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        return dist.get_rank(), world, torch.device("cuda", local)
    dist.init_process_group("gloo")
    return dist.get_rank(), world, torch.device("cpu")


def use_precision(spec: str | None, device: torch.device | str | None = None) -> str:
    """Set the process's CUDA precision (a job's ``--precision``; ``auto``/``None`` clears it) and return the
    precision ``device`` (default: :func:`pick_device`) then computes in: ``fp32``, ``bf16`` or ``fp16``. An
    unknown name, or ``bf16`` on a GPU without it, is a ValueError."""
    global _chosen_precision
    if spec is not None and spec not in PRECISIONS:
        raise ValueError(f"precision {spec!r}: choose from {', '.join(PRECISIONS)}")
    _chosen_precision = None if spec in (None, "auto") else spec
    return precision_name(pick_device() if device is None else device)


def precision_name(device: torch.device | str) -> str:
    """The precision ``device`` computes in (:func:`amp_dtype`): ``fp32``, ``bf16`` or ``fp16``."""
    import torch

    dtype = amp_dtype(device)
    return "fp32" if dtype is None else "bf16" if dtype == torch.bfloat16 else "fp16"


def amp_dtype(device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype on ``device``, ``None`` for fp32: always on the CPU; on CUDA the precision chosen by
    :func:`use_precision`, else ``$TRIDERM_CUDA_PRECISION``, else ``auto`` — bf16 where
    ``torch.cuda.is_bf16_supported()``, else fp16 (train with :func:`grad_scaler`)."""
    import os

    import torch

    precision = _chosen_precision or os.environ.get(PRECISION_ENV) or "auto"
    if precision not in PRECISIONS:
        raise ValueError(f"{PRECISION_ENV}={precision!r}: choose from {', '.join(PRECISIONS)}")
    if torch.device(device).type != "cuda" or precision == "fp32":
        return None
    bf16 = torch.cuda.is_bf16_supported()
    if precision == "bf16" and not bf16:
        raise ValueError("precision bf16: this GPU does not support bfloat16 (use fp16 or auto)")
    return torch.bfloat16 if precision == "bf16" or (precision == "auto" and bf16) else torch.float16


def autocast(device: torch.device | str) -> contextlib.AbstractContextManager:
    """Autocast to :func:`amp_dtype` on CUDA; a no-op context for fp32 (always on the CPU)."""
    import torch

    dtype = amp_dtype(device)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type="cuda", dtype=dtype)


def grad_scaler(device: torch.device | str) -> torch.amp.GradScaler:
    """The loss scaler of a training loop on ``device``: enabled only under fp16 autocast (bf16 and fp32 need
    none). Disabled it passes through (``scale(loss)`` is ``loss``, ``step(opt)`` is ``opt.step()``), so a loop
    always runs ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``."""
    import torch

    return torch.amp.GradScaler(torch.device(device).type, enabled=amp_dtype(device) == torch.float16)


#: glibc's ``mallopt`` parameters: above ``M_MMAP_THRESHOLD`` bytes a block is mapped and unmapped at each free
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_allocator_tuned = False


def keep_freed_memory() -> bool:
    """Let glibc's malloc (PyTorch's CPU allocator) keep freed blocks of up to 1 GiB for reuse; returns whether it
    applies (glibc only; idempotent). By default a block over 32 MiB is unmapped at each free, so every training step
    page-faults its activations in again: 225,000 page faults and 0.5 s of kernel time in a 2.0 s fine-tune step
    (docs/profiles/FINETUNE.md); the heap grows 256 MiB at a time, so it settles within a few steps. The price: the
    process keeps freed memory mapped (+0.3 GB in a demo fit)."""
    global _allocator_tuned
    if not _allocator_tuned:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _allocator_tuned = all(libc.mallopt(option, value) for option, value in (
                (_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 1 << 31), (_M_TOP_PAD, 1 << 28)))
        except (OSError, AttributeError):  # not glibc (macOS, Windows, musl without mallopt)
            return False
    return _allocator_tuned


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Temporarily set torch's intra-op CPU threads (tiny ops run fastest on one thread:
    no fork/join per op, and no oversubscription when other processes share the cores)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def source_fingerprint(*modules: str) -> str:
    """Short hash of the source of ``modules`` (dotted names): part of every cache key, so
    changing the code that computes cached values invalidates them (a commit alone does not)."""
    h = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(name)
        h.update(name.encode() + b"\0" + Path(spec.origin).read_bytes())
    return h.hexdigest()[:10]


def ensure_images(ws: Workspace, progress: bool = True) -> dict | None:
    """Build and import the phantom demo when the workspace has no photos; its summary or None."""
    if ws.store.images():
        return None
    from annotations.io.dataset import import_dataset
    from core.phantoms import build

    with tempfile.TemporaryDirectory(prefix="triderm-demo-") as tmp:
        build(tmp, seed=DEMO_SEED, progress=progress)
        return import_dataset(ws, tmp)


@contextlib.contextmanager
def user_errors(parser: argparse.ArgumentParser, *errors: type[BaseException]) -> Iterator[None]:
    """Turn ``errors`` raised inside the block into one ``parser.error`` (message, exit 2)."""
    try:
        yield
    except errors as e:
        parser.error(str(e))


def open_workspace(workspace: str | None, parser: argparse.ArgumentParser | None = None,
                   require_wounds: bool = False) -> Workspace:
    """Open a job's workspace, importing the SYNTHETIC phantom demo into an empty one; with
    ``require_wounds``, a workspace without outlined wounds exits through ``parser``."""
    ws = Workspace(workspace)
    demo = ensure_images(ws)
    if demo:
        log.info("empty workspace: imported the SYNTHETIC phantom demo (%s photos, %s wounds, %s expert "
                 "triplets)", demo["images"], demo["wounds"], demo["triplets"])
    if require_wounds and not ws.store.wounds():
        message = f"{ws.root}: no wounds outlined yet — draw wound masks first"
        if parser is None:
            raise ValueError(message)
        parser.error(message)
    return ws


def save_embeddings(ws: Workspace, run_id: int, image_ids: Sequence[str],
                    image_emb: np.ndarray | None = None, distance: np.ndarray | None = None,
                    wound_keys: Sequence[tuple[str, int]] | None = None,
                    wound_emb: np.ndarray | None = None, **extra: np.ndarray) -> Path:
    """Write a run's image embedding (or distance matrix), optional wound embeddings and extra
    arrays to ``runs/<run_id>/embeddings.npz`` and register the file in the run's artifacts."""
    n = len(image_ids)
    if image_emb is None and distance is None:
        raise ValueError("give image_emb or distance")
    if image_emb is not None and len(image_emb) != n:
        raise ValueError(f"image_emb has {len(image_emb)} rows for {n} image ids")
    if distance is not None and np.shape(distance) != (n, n):
        raise ValueError(f"distance must be {n}×{n}, got {np.shape(distance)}")
    if (wound_keys is None) != (wound_emb is None):
        raise ValueError("wound_keys and wound_emb go together")
    arrays: dict[str, Any] = {"image_ids": np.asarray(list(image_ids), dtype=str), **extra}
    if image_emb is not None:
        arrays["image_emb"] = np.asarray(image_emb, dtype=np.float32)
    if distance is not None:
        arrays["distance"] = np.asarray(distance, dtype=np.float64)
    if wound_keys is not None and wound_emb is not None:  # both or neither (checked above)
        if len(wound_keys) != len(wound_emb):
            raise ValueError(f"{len(wound_keys)} wound keys for {len(wound_emb)} wound embeddings")
        arrays["wound_image_ids"] = np.asarray([k[0] for k in wound_keys], dtype=str)
        arrays["wound_indices"] = np.asarray([int(k[1]) for k in wound_keys], dtype=np.int64)
        arrays["wound_emb"] = np.asarray(wound_emb, dtype=np.float32)
    path = ws.run_dir(run_id) / EMBEDDINGS_FILE
    with atomic_write(path, "wb", suffix=".npz") as fh:
        np.savez_compressed(fh, **arrays)
    ws.store.update_run(run_id, artifacts={"embeddings": str(path.relative_to(ws.root))})
    return path


def load_checkpoint(path: str | Path) -> Any:
    """A user-given checkpoint, loaded with ``weights_only=True`` (tensors, containers and plain
    values only): a file whose pickle would build other objects — or run code — is refused with
    one ValueError naming it, before anything in it executes."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path}: refused — not a plain weights checkpoint ({reason})") from exc


def load_embeddings(ws: Workspace, run_id: int) -> dict[str, Any]:
    """The arrays saved for a run; ``image_ids`` a list of str, ``wound_keys`` a list of
    (image_id, wound_index) when wound embeddings exist, absent arrays ``None``."""
    run = ws.store.run(run_id)
    if run is None:
        raise KeyError(f"no run {run_id} in {ws.root}")
    rel = run["artifacts"].get("embeddings")
    if rel is None:
        raise KeyError(f"run {run_id} ({run['kind']}) has no embeddings")
    with np.load(ws.root / rel, allow_pickle=False) as data:
        out: dict[str, Any] = {k: data[k] for k in data.files}
    out["image_ids"] = [str(s) for s in out["image_ids"]]
    out.setdefault("image_emb", None)
    out.setdefault("distance", None)
    if "wound_emb" in out:
        out["wound_keys"] = list(zip((str(s) for s in out.pop("wound_image_ids")),
                                     (int(i) for i in out.pop("wound_indices"))))
    else:
        out["wound_keys"], out["wound_emb"] = None, None
    return out


def json_safe(value: Any) -> Any:
    """``value`` with NaN/inf floats replaced by ``None`` (strict JSON), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def numbers_only(value: Any) -> Any:
    """``value`` (dicts and lists of metrics) with every string dropped and NaN/inf as ``None``:
    what a shared model may carry of a run's metrics (a message could name a photo)."""
    if isinstance(value, dict):
        kept = {k: numbers_only(v) for k, v in value.items() if not isinstance(v, str)}
        return {k: v for k, v in kept.items() if v != {}}
    if isinstance(value, (list, tuple)):
        return [numbers_only(v) for v in value if not isinstance(v, str)]
    return json_safe(value) if isinstance(value, (bool, int, float)) else None


def write_model_folder(model: Any, out: str | Path, card: str) -> Path:
    """``model.save_pretrained`` with ``card`` as its ``README.md`` (:func:`core.vision.model_card.model_card`) into the
    new (or empty) folder ``out``, atomically: written beside it and renamed in, so a failure leaves ``out`` as
    it was."""
    with staged_folder(out) as stage:
        Path(stage, "README.md").write_text(card, encoding="utf-8")  # save_pretrained keeps a README it finds
        model.save_pretrained(stage)
    return Path(out)
