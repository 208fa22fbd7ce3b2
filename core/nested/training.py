"""SLIMP training (METHODS.md §2): distributed set-up, the nested loss of a batch, checkpoints,
resuming, the epoch loop (:class:`EpochLoop`) and the evaluation of a trained model (retrieval,
probes).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from annotations.infra.fileio import atomic_write
from annotations.store import runs
from core.losses.nested import inner_losses, outer_loss, symmetric_infonce
from core.nested.config import TRAIN_KEYS, SlimpConfig
from core.nested.model import (
    SLIMP,
    NestedData,
    NestedInputs,
    embed_all,
    epoch_batches,
    frozen_features,
    make_inputs,
    photo_embeddings,
    probe,
    retrieval_recall,
    wound_crops,
)
from core.nested.tabular import TabularSchema
from core.runtime import autocast, grad_scaler, load_checkpoint

FRACTIONS = (0.01, 0.1, 1.0)
SCHEMA_FILES = ("wound_schema.json", "patient_schema.json")


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
    assert w is not None, "every wound has an image embedding"
    if x is None:
        assert h is not None, "without patient metadata SLIMP has wound metadata"
        flat = symmetric_infonce(gather_rows(w, group, world), gather_rows(h, group, world), scale)
        return flat, {"loss": flat.item()}
    assert z is not None, "phenotypes z come with patient metadata x"
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
    """The checkpoint ``ref`` names: a file path, or a run id (digits) of the workspace when no such file exists."""
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
    """AdamW parameter groups: matrices with weight decay, vectors and scalars (biases, norms,
    temperature) without; empty groups left out."""
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay}, {"params": rest, "weight_decay": 0.0}) if g["params"]]


def evaluate_model(ws: Any, model: SLIMP, data: NestedData, images: Tensor, masks: Tensor | None, wound_tab: Any,
                   patient_tab: Any, device: torch.device, cfg: SlimpConfig, run_id: int) -> dict[str, Any]:
    """Probe / kNN / retrieval / triplet agreement (``cfg``'s target, seed, permutations and ablation); saves the
    embeddings of run ``run_id``."""
    from core.eval.distances import pairwise_euclidean
    from core.eval.metrics import evaluate
    from core.runtime import save_embeddings

    emb = embed_all(model, images, masks, wound_tab, patient_tab, device)
    w_emb = emb["w"]
    assert w_emb is not None, "every wound has an image embedding"
    w = w_emb.numpy()
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
    if cfg.target:
        labels, level = data.labels(cfg.target)
        full = np.concatenate([a for a in (w, h, x) if a is not None], axis=1)
        kw: dict[str, Any] = {"seed": cfg.seed, "level": level, "permutations": cfg.permutations}
        metrics["probe"] = {"target": cfg.target, "level": level,
                            **probe(full, labels, data.wound_patient, FRACTIONS, **kw)}
        if cfg.ablation:
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


def train_epoch(net: nn.Module, model: SLIMP, optimizer: torch.optim.Optimizer,
                batches: list[list[tuple[int, np.ndarray]]],
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


def save_checkpoint(path: Path, cfg: SlimpConfig, model: SLIMP, optimizer: torch.optim.Optimizer,
                    epoch: int, losses: list[float], history: dict[str, list[float]], run_id: int) -> None:
    """Write the resumable state after ``epoch`` epochs (temporary file, then an atomic replace); its ``"args"``
    are ``cfg``'s :data:`~core.nested.config.TRAIN_KEYS` settings."""
    with atomic_write(path, "wb", suffix=".pt") as fh:
        torch.save({"args": {k: getattr(cfg, k) for k in TRAIN_KEYS}, "model_config": model.config, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(), "epoch": epoch, "losses": losses, "history": history,
                    "run_id": run_id}, fh)


def read_resume(ws: Any, run_id: int) -> dict[str, Any]:
    """The checkpoint of SLIMP run ``run_id``, its ``"args"`` the :data:`~core.nested.config.TRAIN_KEYS` settings (a pre-0.2
    ``batch_patients`` read as ``batch_size``); ValueError when the run has no readable checkpoint."""
    path = ws.runs_dir / str(run_id) / "checkpoint.pt"
    run = ws.store.run(run_id)
    if run is None or run["kind"] != runs.SLIMP or not path.exists():
        raise ValueError(f"--resume {run_id}: no SLIMP run with a checkpoint at {path}")
    state = load_checkpoint(path)
    saved = {"batch_size": state["args"].get("batch_patients"), **state["args"]}
    state["args"] = {k: saved[k] for k in TRAIN_KEYS}
    return state


def resumed_schemas(state: dict[str, Any]) -> tuple[TabularSchema | None, TabularSchema | None]:
    """The (wound, patient) metadata schemas a checkpoint was trained with."""
    config = state["model_config"]
    wound, patient = (None if config[k] is None else TabularSchema.from_dict(config[k])
                      for k in ("wound_schema", "patient_schema"))
    return wound, patient


def image_inputs(ws: Any, data: NestedData, bb: Any, size: int, continual: bool, rank: int
                 ) -> tuple[Tensor, Tensor | None, nn.Module | None, list[nn.Parameter]]:
    """(images, masks, trunk, stem parameters). ``continual``: the normalised wound crops and their
    masks, with the backbone's trunk and stem; else the frozen backbone's pooled features, cached on
    disk by rank 0 before the other processes of a distributed run read them."""
    if continual:
        crops, masks = wound_crops(ws, data, size)
        return bb.preprocess(crops, size=size).cpu(), masks, bb._features, bb.stem_parameters()
    distributed = dist.is_initialized()
    if rank == 0:
        images = frozen_features(ws, data, bb, size)
    if distributed:
        dist.barrier()
    if rank != 0:
        images = frozen_features(ws, data, bb, size)
    return images, None, None, []


def make_optimizer(model: SLIMP, continual: bool, stem: list[nn.Parameter], lr: float,
                   resume: dict[str, Any] | None = None) -> torch.optim.Optimizer:
    """AdamW over what the mode trains (``continual``: only the stem and the tabular input
    embeddings, everything else frozen); a resumed run's model and optimizer state loaded."""
    if continual:
        for p in model.parameters():
            p.requires_grad_(False)
        trainable = model.continual_parameters(stem)
        for p in trainable:
            p.requires_grad_(True)
    else:
        trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(param_groups(trainable), lr=lr)
    if resume is not None:
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
    return optimizer


def open_run(ws: Any, run_id: int | None, config: dict[str, Any], seed: int, name: str | None, start_epoch: int,
             schemas: tuple[TabularSchema | None, TabularSchema | None]) -> int:
    """Start the ``slimp`` run record (or note the resume of run ``run_id``) and save its schemas."""
    if run_id is None:
        run_id = ws.store.start_run(runs.SLIMP, config, seed=seed, name=name)
    else:
        ws.store.update_run(run_id, message=f"resumed at epoch {start_epoch}")
    for schema, filename in zip(schemas, SCHEMA_FILES):
        if schema is not None:
            schema.save(ws.run_dir(run_id) / filename)
    return run_id


@dataclass
class EpochLoop:
    """One process's share of SLIMP training: each epoch trains on its shard of the global batches;
    rank 0 then writes the checkpoint and the run record (``run_id``), so a killed run resumes."""

    ws: Any
    model: SLIMP
    net: nn.Module  # the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    tensors: tuple[Any, Any, Any, Any]  # images, masks, wound_tab, patient_tab
    cfg: SlimpConfig  # the run's config, its crop size resolved
    device: torch.device
    run_id: int | None = None
    group: Any = None
    rank: int = 0
    world: int = 1
    losses: list[float] = field(default_factory=list)
    history: dict[str, list[float]] = field(default_factory=lambda: {"inner": [], "outer": []})
    epoch_seconds: list[float] = field(default_factory=list)  # this session's epochs (a resumed run: the new ones)

    @property
    def opened_run(self) -> int:
        """The run record's id: rank 0 opens it (``open_run``) before training."""
        assert self.run_id is not None, "rank 0 opens the run record before training"
        return self.run_id

    @property
    def checkpoint(self) -> Path:
        """The run's resumable checkpoint file."""
        return self.ws.run_dir(self.opened_run) / "checkpoint.pt"

    def run(self, patient_wounds: list[np.ndarray], start_epoch: int, epochs: int) -> None:
        """Train epochs ``start_epoch … epochs − 1`` (a tqdm bar on rank 0)."""
        a = self.cfg
        bar = tqdm(range(start_epoch, epochs), desc="slimp", unit="epoch", disable=self.rank != 0,
                   initial=start_epoch, total=epochs)
        for epoch in bar:
            t0 = time.perf_counter()
            batches = epoch_batches(patient_wounds, a.batch_size, a.max_wounds, a.seed, epoch)
            sums = train_epoch(self.net, self.model, self.optimizer, batches, self.tensors, self.device,
                               self.group, self.rank, self.world)
            self.losses.append(sums["loss"])
            self.epoch_seconds.append(round(time.perf_counter() - t0, 4))
            for k in ("inner", "outer"):
                if k in sums:
                    self.history[k].append(sums[k])
            if self.rank == 0:
                bar.set_postfix(loss=f"{sums['loss']:.4f}", tau=f"{1 / self.model.criterion.logit_scale.item():.4f}")
                self._record(epoch + 1, epochs)

    def _record(self, done: int, epochs: int) -> None:
        save_checkpoint(self.checkpoint, self.cfg, self.model, self.optimizer, done, self.losses,
                        self.history, self.opened_run)
        self.ws.store.update_run(self.opened_run, progress=done / epochs,
                                 metrics={"loss": self.losses, **self.history,
                                          "temperature": 1 / self.model.criterion.logit_scale.item(),
                                          "epoch_seconds": self.epoch_seconds},
                                 artifacts={"checkpoint": str(self.checkpoint)})

    def finish(self, data: NestedData) -> dict[str, Any]:
        """Evaluate the trained model (:func:`evaluate_model`) and close the run record; its metrics."""
        metrics = evaluate_model(self.ws, self.model, data, *self.tensors, self.device, self.cfg, self.opened_run)
        run_dir = self.ws.run_dir(self.opened_run)
        artifacts = {"checkpoint": str(self.checkpoint)}
        for name in SCHEMA_FILES:
            if (run_dir / name).exists():
                artifacts[name.removesuffix(".json")] = str(run_dir / name)
        self.ws.store.finish_run(self.opened_run, metrics={"loss": self.losses, **self.history, "eval": metrics},
                                 artifacts=artifacts)
        return metrics
