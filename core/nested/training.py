"""SLIMP training (METHODS.md §2): distributed set-up, the nested loss of a batch, checkpoints
and the evaluation of a trained model (retrieval, probes).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from annotations.fileio import atomic_write
from core.losses.nested import inner_losses, outer_loss, symmetric_infonce
from core.nested.model import (
    SLIMP,
    NestedData,
    NestedInputs,
    embed_all,
    make_inputs,
    photo_embeddings,
    probe,
    retrieval_recall,
)
from core.runtime import autocast, grad_scaler, load_checkpoint

FRACTIONS = (0.01, 0.1, 1.0)


def gather_rows(t: Tensor, group: Any, world: int) -> Tensor:
    """Concatenate every process's rows of ``t`` (row counts may differ), keeping gradients."""
    if world == 1:
        return t
    from torch.distributed.nn.functional import all_gather

    n = torch.tensor([t.shape[0]], device=t.device)
    counts = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(counts, n, group=group)
    rows = max(int(c) for c in counts)
    padded = F.pad(t, (0, 0, 0, rows - t.shape[0]))
    parts = all_gather(padded, group=group)
    return torch.cat([p[: int(c)] for p, c in zip(parts, counts)])


def batch_loss(core: SLIMP, out: dict[str, Tensor | None], inputs: NestedInputs, n_global: int,
               group: Any, world: int) -> tuple[Tensor, dict[str, float]]:
    """(loss to back-propagate on this process, global loss figures for logging).

    Full SLIMP: λ · mean_p L_inner^p + (1 − λ) · L_outer (eq. 3); without wound metadata only
    L_outer; without patient metadata the flat variant (InfoNCE over all wounds of the batch).
    """
    scale = core.criterion.logit_scale
    w, h, z, x = out["w"], out["h"], out["z"], out["x"]
    if x is None:
        flat = symmetric_infonce(gather_rows(w, group, world), gather_rows(h, group, world), scale)
        return flat, {"loss": flat.item()}
    outer = outer_loss(gather_rows(z, group, world), gather_rows(x, group, world), scale)
    if h is None:
        return outer, {"loss": outer.item(), "outer": outer.item()}
    lam = core.criterion.lam
    inner_sum = inner_losses(w, h, inputs.patient_index, inputs.n_patients, scale).sum()
    total_sum = inner_sum.detach().clone()
    if world > 1:
        dist.all_reduce(total_sum, group=group)
    inner = float(total_sum) / n_global
    backprop = lam * world * inner_sum / n_global + (1 - lam) * outer
    return backprop, {"loss": lam * inner + (1 - lam) * outer.item(), "inner": inner, "outer": outer.item()}


def checkpoint_path(ws: Any, ref: str) -> Path:
    path = Path(ref)
    if ref.isdigit() and not path.exists():
        path = ws.runs_dir / ref / "checkpoint.pt"
    return path


def load_init(model: SLIMP, path: Path) -> list[str]:
    """Copy every tensor of a SLIMP checkpoint whose name and shape match; return the skipped names."""
    blob = load_checkpoint(path)
    try:
        state = dict(blob["model"])
    except (TypeError, KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"{path}: not a SLIMP checkpoint (no 'model' state dict)") from exc
    own = model.state_dict()
    keep = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(keep, strict=False)
    return sorted(set(own) - set(keep))


def param_groups(params: list[nn.Parameter]) -> list[dict[str, Any]]:
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay}, {"params": rest, "weight_decay": 0.0}) if g["params"]]


def evaluate_model(ws: Any, model: SLIMP, data: NestedData, images: Tensor, masks: Tensor | None, wound_tab: Any,
                   patient_tab: Any, device: torch.device, args: argparse.Namespace, run_id: int) -> dict[str, Any]:
    """Probe / kNN / retrieval / triplet agreement; saves the embeddings of run ``run_id``."""
    from core.eval.distances import pairwise_euclidean
    from core.eval.metrics import evaluate
    from core.runtime import save_embeddings

    emb = embed_all(model, images, masks, wound_tab, patient_tab, device)
    w = emb["w"].numpy()
    h = None if emb["h"] is None else emb["h"].numpy()
    x = None if emb["x"] is None else emb["x"].numpy()[data.wound_patient]
    wh = w if h is None else np.concatenate([w, h], axis=1)
    ids, photo = photo_embeddings(data.wound_keys, wh)
    extra = {"wound_w": w, "patient_ids": np.array(data.patient_ids, dtype=str)}
    if h is not None:
        extra["wound_h"] = h
    if emb["x"] is not None:
        extra["patient_x"] = emb["x"].numpy()
    save_embeddings(ws, run_id, ids, image_emb=photo, wound_keys=data.wound_keys, wound_emb=wh, **extra)
    metrics: dict[str, Any] = {"n_wounds": len(w), "n_patients": len(data.patient_ids), "n_photos": len(ids)}
    rows = ws.store.expert_triplets()
    if rows:
        metrics["triplets"] = evaluate(ids, pairwise_euclidean(photo), rows)
    if h is not None:
        metrics["retrieval"] = {**retrieval_recall(w, h), "chance@1": 1.0 / len(w)}
    if args.target:
        labels, level = data.labels(args.target)
        full = np.concatenate([a for a in (w, h, x) if a is not None], axis=1)
        kw = {"seed": args.seed, "level": level, "permutations": args.permutations}
        metrics["probe"] = {"target": args.target, "level": level,
                            **probe(full, labels, data.wound_patient, FRACTIONS, **kw)}
        if args.ablation:
            with torch.no_grad():
                raw = torch.cat([model.image_features(images[s:s + 32].to(device),
                                                      None if masks is None else masks[s:s + 32].to(device)).cpu()
                                 for s in range(0, len(images), 32)]).numpy()
            sets = {"frozen backbone features (no SLIMP)": raw, "image w": w}
            if h is not None:
                sets["image w + wound meta h"] = np.concatenate([w, h], axis=1)
            if x is not None:
                sets["w + h + patient meta x" if h is not None else "image w + patient meta x"] = full
            metrics["ablation"] = {k: probe(v, labels, data.wound_patient, FRACTIONS, **kw) for k, v in sets.items()}
    return metrics



def train_epoch(net: nn.Module, model: SLIMP, optimizer: torch.optim.Optimizer, batches: list[list[int]],
                tensors: tuple[Any, Any, Any, Any], device: torch.device, group: Any, rank: int,
                world: int) -> dict[str, float]:
    """One epoch over ``batches`` of patients, each split over the ``world`` processes (this one
    takes shard ``rank``); ``tensors`` are (images, masks, wound_tab, patient_tab). Returns the
    epoch means of the loss and its parts."""
    images, masks, wound_tab, patient_tab = tensors
    sums: dict[str, float] = {}
    scaler = grad_scaler(device)  # fp16 only: its loss scale restarts each epoch (a few skipped steps at most)
    for batch in batches:
        shard = [batch[i] for i in np.array_split(np.arange(len(batch)), world)[rank]]
        inputs = make_inputs(shard, images, masks, wound_tab, patient_tab, device)
        with autocast(device):  # bf16 on CUDA, a no-op on the CPU
            loss, stats = batch_loss(model, net(inputs), inputs, len(batch), group, world)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + v / len(batches)
    return sums


def save_checkpoint(path: Path, train_args: dict[str, Any], model: SLIMP, optimizer: torch.optim.Optimizer,
                    epoch: int, losses: list[float], history: dict[str, list[float]], run_id: int) -> None:
    """Write the resumable state after ``epoch`` epochs (temporary file, then an atomic replace)."""
    with atomic_write(path, "wb", suffix=".pt") as fh:
        torch.save({"args": train_args, "model_config": model.config, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(), "epoch": epoch, "losses": losses, "history": history,
                    "run_id": run_id}, fh)
