"""TriDerm-V (TriDerm §2.2, §3.2, METHODS.md §1): wound attention pooling + predictor on a frozen
backbone, trained on pairs of augmented views with VICReg (or InfoNCE / triplet for the ablation).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from annotations.infra.fileio import atomic_write
from annotations.infra.workspace import Workspace
from annotations.store import runs
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import evaluate
from core.eval.protocol import (
    Fold,
    cross_validate,
    oriented_expert,
    patient_folds,
    patient_of,
    repeated_folds,
    strict_cv_metrics,
)
from core.eval.retrieval import cv_retrieval, photo_types
from core.losses import InfoNCELoss, TripletLoss, VICRegLoss
from core.runtime import load_embeddings, pick_device, save_embeddings, torch_threads
from core.vision.augment import WoundAugment
from core.vision.backbones import Backbone, load_backbone
from core.vision.baseline import centred_folds, embed_baseline, image_means, mean_pooled, normalized
from core.vision.features import FeatureCache, TokenBank, token_mask, workspace_wounds, wound_fractions
from core.vision.pooling import WoundHead
from core.vision.recipe import SUPERVISED_CV
from core.vision.supervised import MetricHead, fit_metric_head
from core.vision.triderm_config import DEFAULT, TriDermConfig

LOSSES = {"vicreg": VICRegLoss, "contrastive": InfoNCELoss, "triplet": TripletLoss}  # keys: recipe.LOSS_NAMES


NO_CACHE_RETRIES = 5


def make_loss(name: str) -> torch.nn.Module:
    """The training loss named ``name`` (a key of :data:`LOSSES`); ValueError for any other name."""
    if name not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {name!r}")
    return LOSSES[name]()


class FreshViews:
    """The ``--no-cache`` path: augment and run the backbone for every step."""

    def __init__(self, ws: Workspace, backbone: Backbone, cache: FeatureCache, bank: TokenBank) -> None:
        self.backbone, self.bank, self.augment = backbone, bank, WoundAugment(cache.config)
        self.prepared = {i: self.augment.prepare(ws.load_image(i), ws.load_mask(i))
                         for i in sorted({k[0] for k in bank.wound_keys})}
        self.grid = backbone.grid(cache.config.size)

    def _view(self, wound: int, gen: torch.Generator) -> tuple[Tensor, Tensor] | None:
        image_id, index = self.bank.wound_keys[wound]
        for _ in range(NO_CACHE_RETRIES):
            with torch_threads(1):
                img, mask = self.augment.augment_prepared(*self.prepared[image_id], gen)
            frac = wound_fractions(mask, [index], self.grid)
            if frac.sum() > 0:
                return img, token_mask(frac)[0].flatten()
        return None

    def pair(self, wounds: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Tokens and segments of two fresh views per wound (inference view if a view lost it)."""
        views = [[self._view(int(w), gen) for w in wounds] for _ in range(2)]
        flat = [v for side in views for v in side if v is not None]
        feats = self.backbone(self.backbone.normalize(torch.stack([v[0] for v in flat]))).flatten(2).transpose(1, 2)
        out, k = [], 0
        for side in views:
            toks, segs = [], []
            for b, v in enumerate(side):
                if v is None:
                    sel = self.bank.eval_segment == wounds[b]
                    t = self.bank.eval_tokens[sel]
                else:
                    t = feats[k][v[1]]
                    k += 1
                toks.append(t)
                segs.append(torch.full((len(t),), b, dtype=torch.long))
            out += [torch.cat(toks), torch.cat(segs)]
        return out[0], out[1], out[2], out[3]


def _batches(wounds: Tensor, batch_size: int, gen: torch.Generator) -> list[Tensor]:
    perm = wounds[torch.randperm(len(wounds), generator=gen)]
    return [b for b in perm.split(batch_size) if len(b) >= 2]


def fit(head: WoundHead, bank: TokenBank, criterion: torch.nn.Module, cfg: TriDermConfig,
        gen: torch.Generator, device: torch.device, fresh: FreshViews | None = None, progress: bool = True,
        on_epoch: Callable[[int, list[float]], None] | None = None, wounds: Tensor | None = None) -> list[float]:
    """AdamW + cosine schedule over all steps; returns the mean loss per epoch. ``wounds``
    restricts the batches to those bank rows."""
    wounds = torch.arange(len(bank)) if wounds is None else wounds
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps = cfg.epochs * max(1, len(_batches(wounds, cfg.batch_size, torch.Generator())))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    losses: list[float] = []
    bar = tqdm(range(cfg.epochs), desc=f"TriDerm-V {cfg.pooling}/{cfg.loss}", unit="epoch",
               disable=not progress)
    head.train()
    for epoch in bar:
        total, count = 0.0, 0
        for batch in _batches(wounds, cfg.batch_size, gen):
            if fresh is None:
                v1, v2 = bank.sample_views(batch, gen)
                (x1, s1), (x2, s2) = bank.gather(batch, v1), bank.gather(batch, v2)
            else:
                x1, s1, x2, s2 = fresh.pair(batch, gen)
            z1, _ = head(x1.to(device), s1.to(device), len(batch))
            z2, _ = head(x2.to(device), s2.to(device), len(batch))
            loss = criterion(z1, z2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(batch)
            count += len(batch)
        losses.append(total / max(count, 1))
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if on_epoch is not None:
            on_epoch(epoch, losses)
    head.eval()
    return losses


def check_workspace(ws: Workspace, cfg: TriDermConfig) -> None:
    """Raise ValueError when ``ws`` cannot serve ``cfg``: no wounds, ``supervise`` without
    expert triplets, ``cv`` folds beyond the number of patients."""
    image_ids, keys = workspace_wounds(ws)
    if not keys:
        raise ValueError(f"{ws.root}: no wounds outlined — nothing to train on")
    if cfg.supervise and not len(oriented_expert(ws, image_ids)):
        raise ValueError(f"{ws.root}: --supervise triplets needs expert triplets (j/k answers), "
                         "and the workspace has none")
    if cfg.cv:
        patient_folds(image_ids, patient_of(ws.store.images()), cfg.cv)


def auto_mode(ws: Workspace) -> tuple[str, str]:
    """The mode ``--mode auto`` picks (:data:`~core.vision.recipe.MODES`) and why: ``fine-tune`` (the best mode on
    azh-dev's new patients) when the expert's triplets over outlined photos span at least :data:`SUPERVISED_CV`
    patients (its folds), else ``frozen``: without labels no training beat the frozen centred embedding on new
    patients."""
    image_ids, _ = workspace_wounds(ws)
    n = len(oriented_expert(ws, image_ids))
    patient = patient_of(ws.store.images())
    patients = len({patient[i] for i in image_ids})
    if n and patients >= SUPERVISED_CV:
        return "fine-tune", f"{n} expert triplets over outlined photos of {patients} patients"
    return "frozen", ("no expert triplets over outlined photos" if not n else
                      f"outlined photos of {patients} patient(s), too few for {SUPERVISED_CV} patient-disjoint folds")


def embedding_normalize(cfg: TriDermConfig) -> str:
    """How a run's image embeddings are normalised: the supervised metric head's raw space, else
    ``cfg.normalize``."""
    return "none" if cfg.supervise else cfg.normalize


def metric_head(channels: int, cfg: TriDermConfig) -> MetricHead:
    """The untrained supervised :class:`MetricHead` of ``cfg``."""
    return MetricHead(channels, cfg.supervise_dim, cfg.supervise_pooling, cfg.hidden, cfg.supervise_heads)


def wound_head(channels: int, cfg: TriDermConfig) -> WoundHead:
    """The untrained self-supervised :class:`WoundHead` of ``cfg``."""
    return WoundHead(channels, cfg.dim, cfg.pooling, cfg.hidden)


def build_head(channels: int, cfg: TriDermConfig) -> WoundHead | MetricHead:
    """The untrained head a run of ``cfg`` learns: the :func:`metric_head` with ``cfg.supervise``, else
    the :func:`wound_head`."""
    return metric_head(channels, cfg) if cfg.supervise else wound_head(channels, cfg)


def effective_epochs(cfg: TriDermConfig, n_wounds: int) -> int:
    """``epochs``, raised so that training takes at least ``min_steps`` optimiser steps."""
    per_epoch = max(1, n_wounds // cfg.batch_size + (n_wounds % cfg.batch_size >= 2))
    return max(cfg.epochs, math.ceil(cfg.min_steps / per_epoch))


class TriDermTrainer:
    """One training set-up (bank, config, device) that fits heads on subsets of wounds and
    triplets and embeds every photo with them."""

    def __init__(self, bank: TokenBank, cfg: TriDermConfig, device: torch.device, image_ids: list[str],
                 fresh: FreshViews | None = None) -> None:
        self.bank, self.cfg, self.device, self.fresh = bank, cfg, device, fresh
        self.image_ids = image_ids
        row = {i: n for n, i in enumerate(image_ids)}
        self.wound_image = torch.tensor([row[k[0]] for k in bank.wound_keys], dtype=torch.long)

    def fit(self, train_rows: np.ndarray | None = None, triplets: np.ndarray | None = None,
            progress: bool = False, on_epoch: Callable[[int, list[float]], None] | None = None
            ) -> tuple[WoundHead | MetricHead, list[float]]:
        """The self-supervised head on the wounds of ``train_rows`` (all by default); with
        ``triplets`` (image rows), the supervised :class:`MetricHead` instead."""
        cfg = self.cfg
        wounds = (torch.arange(len(self.bank)) if train_rows is None
                  else torch.nonzero(torch.isin(self.wound_image, torch.from_numpy(train_rows)), as_tuple=True)[0])
        torch.manual_seed(cfg.seed)
        gen = torch.Generator().manual_seed(cfg.seed)
        if triplets is not None:
            metric = metric_head(self.bank.channels, cfg)
            losses = fit_metric_head(metric, self.bank, self.wound_image, len(self.image_ids), wounds,
                                     torch.from_numpy(triplets), cfg, gen, self.device, progress)
            if on_epoch is not None:
                on_epoch(0, losses)
            return metric, losses
        head = wound_head(self.bank.channels, cfg).to(self.device)
        run_cfg = replace(cfg, epochs=effective_epochs(cfg, len(wounds)))
        losses = fit(head, self.bank, make_loss(cfg.loss), run_cfg, gen, self.device, self.fresh, progress,
                     on_epoch, wounds)
        return head, losses

    def frozen_images(self) -> np.ndarray:
        """The frozen mean-pool image embedding, rows in ``image_ids`` order (the baseline of the folds)."""
        _, ids, image_emb = mean_pooled(self.bank)
        assert ids == self.image_ids
        return image_emb

    def embed(self, head: WoundHead | MetricHead, fit_rows: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(wound embeddings, image embeddings in ``image_ids`` order, attention weights, centre);
        the centre of ``center-l2`` comes from the photos ``fit_rows`` (all by default). A
        :class:`MetricHead`'s space is used as learned (raw Euclidean: its hinge sets the scale)."""
        bank = self.bank
        with torch.no_grad():
            z, weights = head(bank.eval_tokens.to(self.device), bank.eval_segment.to(self.device), len(bank))
        wound_emb = z.float().cpu().numpy()
        ids, image_emb = image_means(bank.wound_keys, wound_emb)
        assert ids == self.image_ids
        image_emb, center = normalized(image_emb, embedding_normalize(self.cfg), fit_rows)
        return wound_emb, image_emb, weights.float().cpu().numpy(), center

    def cross_validate(self, triplets: np.ndarray, patients: dict[str, str], k: int, repeats: int = 1,
                       budget: int | None = None, progress: bool = True) -> list[Fold]:
        """Every fold of ``repeats`` random patient-disjoint splits into ``k`` folds: (the fold's
        photo rows, the distances of a model fitted without them; see :func:`core.eval.protocol.score_folds`)."""
        splits = repeated_folds(self.image_ids, patients, k, repeats, self.cfg.seed)
        everyone = np.arange(len(self.image_ids))
        bar = tqdm(total=k * repeats, desc=f"cv {repeats}×{k} folds", unit="fold", disable=not progress, leave=False)

        def fit_fold(train_triplets: np.ndarray, test_rows: np.ndarray) -> np.ndarray:
            train_rows = np.setdiff1d(everyone, test_rows)
            head, _ = self.fit(train_rows, train_triplets)
            return pairwise_euclidean(self.embed(head, train_rows)[1])

        folds = cross_validate(splits, triplets, fit_fold, budget, self.cfg.seed, progress=lambda f: bar.update())
        bar.close()
        return folds


def train(ws: Workspace, cfg: TriDermConfig = DEFAULT, progress: bool = True, **overrides: Any) -> int:
    """Train TriDerm-V on ``ws`` with ``cfg`` and any field of it in ``overrides`` (``backbone`` may
    also be a loaded :class:`Backbone`); returns the run id, whose record's config is ``asdict(cfg)``
    plus the resolved backbone and the data counts. With ``supervise="triplets"`` the expert's
    triplets train a metric head, and ``cv=K`` first scores ``cv_repeats`` random patient-disjoint
    K-fold splits: ``metrics["cv"]`` holds the strict figure (all three photos unseen;
    patient-bootstrap CI), ``anchor_unseen`` and ``frozen_centred`` (the strongest simple baseline on
    the same strict triplets, with the paired test of the run against it:
    :func:`core.eval.protocol.versus_frozen`)."""
    unknown = set(overrides) - {f.name for f in fields(TriDermConfig)}
    if unknown:
        raise TypeError(f"unknown training options: {sorted(unknown)}")
    loaded = overrides.pop("backbone") if isinstance(overrides.get("backbone"), Backbone) else None
    cfg = replace(cfg, **overrides, **({"backbone": loaded.name} if loaded is not None else {}))
    device = pick_device()
    check_workspace(ws, cfg)
    image_ids, keys = workspace_wounds(ws)
    triplets = oriented_expert(ws, image_ids) if cfg.supervise else None
    patients = patient_of(ws.store.images())
    backbone = loaded or load_backbone(cfg.backbone, device=device, layer=cfg.layer)
    with runs.recording(ws, runs.VISION_TRIDERM, {
            **asdict(cfg), "backbone": backbone.name, "layer": backbone.layer, "modality": "vision",
            "device": str(device), "n_images": len(image_ids), "n_wounds": len(keys),
            "n_expert_triplets": 0 if triplets is None else len(triplets), "synthetic": ws.is_synthetic},
            seed=cfg.seed) as rec:
        run_id = rec.id
        timing: dict[str, float] = {}
        metrics: dict[str, Any] = {}
        t0 = time.perf_counter()
        cache = FeatureCache(ws, backbone, seed=cfg.seed)
        photos = cache.build(image_ids, 0 if cfg.no_cache else cfg.views, progress)
        # token bookkeeping and the cached training loop are many tiny ops: on CPU one thread
        # is fastest (no per-op fork/join, no oversubscription of shared cores)
        small_ops = 1 if device.type == "cpu" else torch.get_num_threads()
        with torch_threads(small_ops):
            bank = TokenBank(photos, keys)
        timing["features_s"] = time.perf_counter() - t0
        fresh = FreshViews(ws, backbone, cache, bank) if cfg.no_cache else None
        trainer = TriDermTrainer(bank, cfg, device, image_ids, fresh)
        t1 = time.perf_counter()
        with torch_threads(small_ops if fresh is None else torch.get_num_threads()):
            if cfg.cv:
                assert triplets is not None  # cv implies supervise (TriDermConfig checks)
                folds = trainer.cross_validate(triplets, patients, cfg.cv, cfg.cv_repeats, progress=progress)
                # the run's figure is the strict one: no photo of a scored triplet was seen by training
                frozen = centred_folds(trainer.frozen_images(), folds)
                metrics["cv"] = {**strict_cv_metrics(image_ids, triplets, folds, frozen, patients, cfg.cv,
                                                     cfg.cv_repeats, cfg.seed),
                                 **cv_retrieval(image_ids, folds, photo_types(ws.store.images(), image_ids), patients,
                                                cfg.seed)}
            epochs = 1 if cfg.supervise else effective_epochs(cfg, len(bank))
            head, losses = trainer.fit(triplets=triplets, progress=progress, on_epoch=lambda ep, ls: ws.store.update_run(
                run_id, progress=(ep + 1) / epochs, metrics={"loss": ls}))
        timing["train_s"] = time.perf_counter() - t1
        wound_emb, image_emb, weights, center = trainer.embed(head)
        save_embeddings(ws, run_id, image_ids, image_emb=image_emb, wound_keys=bank.wound_keys, wound_emb=wound_emb,
                        token_wound=bank.eval_segment.numpy(), token_pos=bank.eval_pos.numpy(),
                        token_weight=weights, grid=np.array(bank.grid), input_size=np.array(backbone.input_size),
                        center=center)
        with atomic_write(ws.run_dir(run_id) / "head.pt", "wb", suffix=".pt") as fh:
            torch.save({"config": {k: v for k, v in asdict(cfg).items() if k != "backbone"}, "backbone": backbone.name,
                        "channels": bank.channels, "center": torch.from_numpy(center), "head": head.state_dict()}, fh)
        if not all(math.isfinite(x) for x in losses):
            raise FloatingPointError(f"non-finite training loss: {losses[-5:]}")
        rec.metrics = {"loss": losses, "timing": timing, **metrics}
        rec.artifacts = {"head": str((ws.run_dir(run_id) / "head.pt").relative_to(ws.root))}
    return run_id


def baseline_run(ws: Workspace, backbone: str | Backbone, progress: bool = True) -> int:
    """Latest finished raw frozen baseline of ``backbone`` (a registry name or a loaded backbone,
    matched on the recorded name), computed when there is none."""
    name = backbone.name if isinstance(backbone, Backbone) else backbone
    for run in ws.store.runs(kind=runs.VISION_BASELINE):
        if (run["status"] == "done" and run["config"].get("backbone") == name
                and run["config"].get("normalize", "none") == "none"):
            return int(run["id"])
    bb = backbone if isinstance(backbone, Backbone) else load_backbone(backbone)
    return embed_baseline(ws, bb, progress=progress)


def describe(cfg: TriDermConfig, backbone: str) -> str:
    """One line naming what a run of ``cfg`` on ``backbone`` trains and how it measures distances."""
    head = (f"{cfg.supervise_heads} metric head(s) on the expert triplets: {cfg.supervise_pooling} pooling, "
            f"{cfg.supervise_dim}-d each, {cfg.supervise_steps} steps (cv {cfg.cv})" if cfg.supervise else
            f"{cfg.epochs} epochs" + (f" (at least {cfg.min_steps} training steps)" if cfg.min_steps else "")
            + f", {cfg.pooling} pooling, {cfg.dim}-d")
    return f"{backbone}, {cfg.views} views, {head}, distances {embedding_normalize(cfg)}"


def compare_with_baseline(ws: Workspace, run_id: int, backbone: Backbone, cfg: TriDermConfig
                          ) -> list[tuple[str, int, dict[str, Any]]]:
    """(label, run id, agreement with the expert) of the frozen mean-pool baseline of ``backbone``
    (computed when missing) and of TriDerm-V run ``run_id``, both recorded on the run: the
    baseline's under ``baseline``, the run's under ``agreement`` or, for a supervised run, under
    ``agreement_in_sample`` (scored on the triplets it was trained on: never the run's figure,
    which is the strict out-of-fold one in ``metrics["cv"]``)."""
    base_id = baseline_run(ws, backbone)
    label = (f"TriDerm-V metric head ({cfg.supervise_pooling}) on expert triplets" if cfg.supervise
             else f"TriDerm-V {cfg.pooling}/{cfg.loss}")
    rows = [(f"frozen {backbone.name} mean-pool (run {base_id})", base_id, run_agreement(ws, base_id)),
            (f"{label} (run {run_id})", run_id, run_agreement(ws, run_id))]
    fit_key = "agreement_in_sample" if cfg.supervise else "agreement"
    ws.store.update_run(run_id, metrics={fit_key: rows[1][2], "baseline": {"run": base_id, **rows[0][2]}})
    return rows


def run_agreement(ws: Workspace, run_id: int) -> dict[str, Any]:
    """Agreement of a run's image embedding with the workspace's expert triplets."""
    emb = load_embeddings(ws, run_id)
    return evaluate(emb["image_ids"], pairwise_euclidean(emb["image_emb"]), ws.store.expert_triplets())

