"""Frozen vision baseline (TriDerm §3.3, METHODS.md §1): a wound's embedding is the mean of its
backbone tokens, an image's the mean of its wounds; recorded as a ``vision-baseline`` run, raw or
centred on the study's photos and scaled to unit length (the frozen centred embedding, the
strongest simple baseline on real wounds).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from annotations.infra.workspace import Workspace
from annotations.store import runs
from core.eval.distances import pairwise_euclidean
from core.eval.protocol import Fold
from core.runtime import save_embeddings
from core.vision.backbones import Backbone
from core.vision.features import FeatureCache, TokenBank, workspace_wounds
from core.vision.pooling import MeanPooling


def image_means(wound_keys: list[tuple[str, int]], wound_emb: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Image ids (sorted) and the mean of each image's wound embeddings."""
    ids = sorted({k[0] for k in wound_keys})
    row = {i: n for n, i in enumerate(ids)}
    index = np.array([row[k[0]] for k in wound_keys])
    sums = np.zeros((len(ids), wound_emb.shape[1]))
    np.add.at(sums, index, wound_emb)
    return ids, sums / np.bincount(index, minlength=len(ids))[:, None]


def mean_pooled(bank: TokenBank) -> tuple[np.ndarray, list[str], np.ndarray]:
    """The frozen backbone's embeddings: (each wound's mean token, image ids (sorted), each image's mean of
    its wounds')."""
    with torch.no_grad():
        wound_emb, _ = MeanPooling()(bank.eval_tokens, bank.eval_segment, len(bank))
    return wound_emb.numpy(), *image_means(bank.wound_keys, wound_emb.numpy())


def normalized(emb: np.ndarray, how: str, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(embedding, centre): ``center-l2`` subtracts the mean of ``rows`` (all by default) and
    scales every row to unit length, so distances compare directions; ``none`` keeps ``emb``."""
    if how == "none":
        return emb, np.zeros(emb.shape[1])
    center = emb[rows if rows is not None else slice(None)].mean(0)
    return centred_unit(emb, center), center


def centred_unit(emb: np.ndarray, center: np.ndarray) -> np.ndarray:
    """``emb`` (one embedding or a row per photo) minus ``center``, each scaled to unit length."""
    z = emb - center
    return z / np.linalg.norm(z, axis=-1, keepdims=True).clip(min=1e-12)


def centred_folds(emb: np.ndarray, folds: Sequence[Fold]) -> list[Fold]:
    """The frozen centred baseline on a run's ``folds``: each fold's rows with the distances of ``emb`` (a row per
    photo) centred on the fold's training photos (every other row) and scaled to unit length (:func:`normalized`)."""
    everyone = np.arange(len(emb))
    return [(rows, pairwise_euclidean(normalized(emb, "center-l2", np.setdiff1d(everyone, rows))[0]))
            for rows, _ in folds]


def embed_baseline(ws: Workspace, backbone: Backbone, bank: TokenBank | None = None, progress: bool = True,
                   normalize: str = "none") -> int:
    """Record the frozen mean-pool baseline of ``backbone`` as a run; returns its id. With
    ``normalize="center-l2"`` the photos' embeddings are centred on their mean and scaled to unit
    length (:func:`normalized`; the centre is stored with them)."""
    config = {"modality": "vision", "backbone": backbone.name, "pooling": "mean", "input_size": backbone.input_size,
              "token_rule": "cell area fraction >= 0.5, else the wound's best cell", "normalize": normalize,
              "synthetic": ws.is_synthetic}
    name = "frozen, centred unit length" if normalize == "center-l2" else None
    with runs.recording(ws, runs.VISION_BASELINE, config, name=name) as rec:
        if bank is None:
            image_ids, keys = workspace_wounds(ws)
            bank = TokenBank(FeatureCache(ws, backbone).build(image_ids, 0, progress), keys)
        wound_emb, ids, image_emb = mean_pooled(bank)
        image_emb, center = normalized(image_emb, normalize)
        save_embeddings(ws, rec.id, ids, image_emb=image_emb, wound_keys=bank.wound_keys, wound_emb=wound_emb,
                        center=center)
        rec.metrics = {"n_images": len(ids), "n_wounds": len(bank)}
    return rec.id

