"""Token maps of a vision run: where on each photo's feature grid its embedding comes from, computed once by the
job that made the run and stored beside it (``runs/<id>/token_maps.npz``), so the Explore page only reads them.

- **Fine-tune** runs (:mod:`core.vision.finetune`, the default mode) pool each wound's tuned tokens by their mean
  and centre the photo's mean on the study's centre ``c``: the photo's pooled vector is ``p = Σ_t w_t f_t``
  (pooling weights ``w`` summing to 1) and its embedding ``e = (p − c) / |p − c|``. A token's **contribution**
  ``w_t ⟨f_t − c, e⟩ / |p − c|`` is its exact share of the embedding's length: the shares sum to 1 over the
  photo's wound tokens (a token pulling the other way has a negative share). A run with test-time views (the
  default) embeds a photo as the mean over its inference view and its augmented views; its map is the inference
  view's (the photo as shown, on the study's centre), the part of the embedding a clinician can see. An ensemble's
  map is the mean of its members' (its embedding is their unit embeddings concatenated over √members: the shares of
  its length are the members' shares averaged).
- **TriDerm-V** runs (:mod:`core.vision.triderm`) store each wound token's **attention** weight (summing to 1 per
  wound); a photo's map is their mean over its wounds (its embedding is the mean of its wounds'), summing to 1.

The file holds ``image_ids`` (N), ``maps`` (N×H×W float32, each photo's map summing to 1, all zero for a photo
without a wound token), ``grid`` (H, W) and ``kind`` (``contribution`` or ``attention``); the run's artifacts
name it under ``token_maps`` (:func:`core.eval.explore.stored_token_maps` reads it).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from annotations.store import runs
from annotations.infra.fileio import atomic_write
from annotations.infra.workspace import Workspace
from core.eval.explore import TOKEN_MAPS_ARTIFACT, attention_maps
from core.runtime import load_embeddings
from core.vision.finetune import RUN_KIND as FINETUNE_RUN, pooling_weights
from core.vision.features import FeatureCache, PhotoFeatures

#: a run's token maps, in its folder
MAPS_FILE = "token_maps.npz"
#: the run kinds whose maps this module computes
MAPPED_KINDS = (runs.VISION_FINETUNE, runs.VISION_TRIDERM)


def contribution_maps(tail: torch.nn.Module, photos: Sequence[PhotoFeatures], center: np.ndarray,
                      progress: bool = False, batch: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(maps N×H×W, pooled vectors N×C) of a fine-tuned ``tail`` on the photos' cached inference features
    (``batch`` photos per forward pass): each token's share of its photo's centred embedding (see the module
    docstring)."""
    device = next(tail.parameters()).device
    c = torch.as_tensor(center, dtype=torch.float64)
    maps, pooled = [], []
    with torch.no_grad():
        for start in tqdm(range(0, len(photos), batch), desc="token maps", unit="batch", disable=not progress,
                          leave=False):
            chunk = photos[start:start + batch]
            f = tail(torch.stack([p.eval_feat.float() for p in chunk]).to(device)).double().cpu()  # B×C×H×W
            w = torch.stack([pooling_weights(p.eval_frac) for p in chunk]).double()  # B×H×W, each summing to 1 or 0
            v = torch.einsum("bchw,bhw->bc", f, w)
            z = v - c
            norm = z.norm(dim=1).clamp_min(1e-12)
            e = z / norm[:, None]
            share = w * torch.einsum("bchw,bc->bhw", f - c[None, :, None, None], e) / norm[:, None, None]
            share[w.flatten(1).sum(1) == 0] = 0  # a photo without a wound token has no map
            maps.append(share.numpy().astype(np.float32))
            pooled.append(v.numpy())
    return np.concatenate(maps), np.concatenate(pooled)


def compute_token_maps(ws: Workspace, run_id: int, progress: bool = False) -> tuple[list[str], np.ndarray, str]:
    """(image ids, N×H×W maps, kind) of run ``run_id``: a fine-tune run's token contributions (its saved tail on
    the photos' cached features, computed where the cache lacks them) or a TriDerm-V run's attention."""
    run = ws.store.run(run_id)
    if run is None:
        raise KeyError(f"no run {run_id} in {ws.root}")
    if run["kind"] not in MAPPED_KINDS:
        raise ValueError(f"run {run_id} is a {run['kind']} run: token maps are made for "
                         f"{' and '.join(MAPPED_KINDS)} runs only")
    emb = load_embeddings(ws, run_id)
    if run["kind"] != FINETUNE_RUN:
        if emb["wound_keys"] is None or "token_weight" not in emb:
            raise ValueError(f"run {run_id} stored no token attention to map")
        return list(emb["image_ids"]), attention_maps(emb), "attention"
    from core.vision.inference import TunedModel

    model = TunedModel.load(ws, run_id)
    cache = FeatureCache(ws, model.backbone, seed=int(run["config"].get("seed") or 0))
    photos = cache.build(emb["image_ids"], 0, progress)
    tails = [model.tail, *model.members]
    chosen = [photos[i] for i in emb["image_ids"]]
    maps = np.mean([contribution_maps(t, chosen, c, progress)[0]
                    for t, c in zip(tails, np.split(model.center, len(tails)))], axis=0)
    return list(emb["image_ids"]), maps, "contribution"


def write_token_maps(ws: Workspace, run_id: int, progress: bool = False) -> Path:
    """Compute run ``run_id``'s token maps (:func:`compute_token_maps`), write them to ``runs/<id>/``
    :data:`MAPS_FILE` (compressed, atomic) and name the file in the run's artifacts; returns its path."""
    image_ids, maps, kind = compute_token_maps(ws, run_id, progress)
    if not np.isfinite(maps).all():
        raise FloatingPointError(f"run {run_id}: non-finite token maps")
    path = ws.run_dir(run_id) / MAPS_FILE
    with atomic_write(path, "wb", suffix=".npz") as fh:
        np.savez_compressed(fh, image_ids=np.asarray(image_ids, dtype=str), maps=maps,
                            grid=np.array(maps.shape[1:]), kind=np.array(kind))
    ws.store.update_run(run_id, artifacts={TOKEN_MAPS_ARTIFACT: str(path.relative_to(ws.root))})
    return path
