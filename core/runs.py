"""Run artifacts: embeddings and distance matrices saved beside a run record.

Every run that produces an image embedding writes ``runs/<id>/embeddings.npz`` through
:func:`save_embeddings`; evaluation, fusion, retrieval and the explorer read it back with
:func:`load_embeddings` / :func:`image_distances`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from annotations.store import git_sha
from annotations.workspace import Workspace

__all__ = ["save_embeddings", "load_embeddings", "image_distances", "pairwise_euclidean", "json_safe",
           "git_sha"]

EMBEDDINGS_FILE = "embeddings.npz"


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
    if wound_keys is not None:
        if len(wound_keys) != len(wound_emb):
            raise ValueError(f"{len(wound_keys)} wound keys for {len(wound_emb)} wound embeddings")
        arrays["wound_image_ids"] = np.asarray([k[0] for k in wound_keys], dtype=str)
        arrays["wound_indices"] = np.asarray([int(k[1]) for k in wound_keys], dtype=np.int64)
        arrays["wound_emb"] = np.asarray(wound_emb, dtype=np.float32)
    path = ws.run_dir(run_id) / EMBEDDINGS_FILE
    tmp = path.with_name("embeddings.tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)
    ws.store.update_run(run_id, artifacts={"embeddings": str(path.relative_to(ws.root))})
    return path


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


def pairwise_euclidean(x: np.ndarray) -> np.ndarray:
    """n×n Euclidean distances (exactly 0 on the diagonal)."""
    x = np.asarray(x, dtype=np.float64)
    sq = (x * x).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * x @ x.T, 0.0)
    np.fill_diagonal(d2, 0.0)
    return np.sqrt(d2)


def image_distances(emb: dict[str, Any]) -> tuple[list[str], np.ndarray]:
    """(image ids, distance matrix): the stored matrix, else Euclidean on the image embedding."""
    if emb.get("distance") is not None:
        return emb["image_ids"], np.asarray(emb["distance"], dtype=np.float64)
    return emb["image_ids"], pairwise_euclidean(emb["image_emb"])


def json_safe(value: Any) -> Any:
    """``value`` with NaN/inf floats replaced by ``None`` (strict JSON), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
