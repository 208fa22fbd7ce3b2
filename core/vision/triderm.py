"""TriDerm-V (TriDerm §2.2, §3.2, METHODS.md §1): wound attention pooling + predictor on a frozen
backbone, trained on pairs of augmented views with VICReg (or InfoNCE / triplet for the ablation).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from annotations.workspace import Workspace
from core.eval.distances import pairwise_euclidean
from core.eval.metrics import evaluate
from core.losses import InfoNCELoss, TripletLoss, VICRegLoss
from core.runtime import load_embeddings, pick_device, save_embeddings, torch_threads
from core.vision.augment import WoundAugment
from core.vision.backbones import OFFLINE_DEFAULT, Backbone, load_backbone
from core.vision.baseline import embed_baseline, image_means
from core.vision.features import FeatureCache, TokenBank, token_mask, workspace_wounds, wound_fractions
from core.vision.pooling import WoundHead

DEFAULTS: dict[str, Any] = {
    "backbone": OFFLINE_DEFAULT, "pooling": "attention", "loss": "vicreg", "epochs": 50, "batch_size": 32,
    "lr": 1e-2, "weight_decay": 1e-5, "views": 16, "seed": 0, "no_cache": False, "dim": 512, "hidden": 128,
}


LOSSES = {"vicreg": VICRegLoss, "contrastive": InfoNCELoss, "triplet": TripletLoss}


NO_CACHE_RETRIES = 5


def make_loss(name: str) -> torch.nn.Module:
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


def _batches(n: int, batch_size: int, gen: torch.Generator) -> list[Tensor]:
    perm = torch.randperm(n, generator=gen)
    return [b for b in perm.split(batch_size) if len(b) >= 2]


def fit(head: WoundHead, bank: TokenBank, criterion: torch.nn.Module, cfg: dict[str, Any],
        gen: torch.Generator, device: torch.device, fresh: FreshViews | None = None, progress: bool = True,
        on_epoch: Callable[[int, list[float]], None] | None = None) -> list[float]:
    """AdamW + cosine schedule over all steps; returns the mean loss per epoch."""
    opt = torch.optim.AdamW(head.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    steps = cfg["epochs"] * max(1, len(_batches(len(bank), cfg["batch_size"], torch.Generator())))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    losses: list[float] = []
    bar = tqdm(range(cfg["epochs"]), desc=f"TriDerm-V {cfg['pooling']}/{cfg['loss']}", unit="epoch",
               disable=not progress)
    head.train()
    for epoch in bar:
        total, count = 0.0, 0
        for wounds in _batches(len(bank), cfg["batch_size"], gen):
            if fresh is None:
                v1, v2 = bank.sample_views(wounds, gen)
                (x1, s1), (x2, s2) = bank.gather(wounds, v1), bank.gather(wounds, v2)
            else:
                x1, s1, x2, s2 = fresh.pair(wounds, gen)
            z1, _ = head(x1.to(device), s1.to(device), len(wounds))
            z2, _ = head(x2.to(device), s2.to(device), len(wounds))
            loss = criterion(z1, z2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(wounds)
            count += len(wounds)
        losses.append(total / max(count, 1))
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if on_epoch is not None:
            on_epoch(epoch, losses)
    head.eval()
    return losses


def check_config(cfg: dict[str, Any]) -> None:
    """Raise ValueError naming the first out-of-range option."""
    minimum = {"epochs": 1, "batch_size": 2, "views": 1 if cfg["no_cache"] else 2, "dim": 1}
    for key, low in minimum.items():
        if int(cfg[key]) < low:
            raise ValueError(f"{key} must be ≥ {low}, got {cfg[key]}")
    if cfg["lr"] <= 0 or cfg["weight_decay"] < 0:
        raise ValueError(f"need lr > 0 and weight_decay ≥ 0, got {cfg['lr']} and {cfg['weight_decay']}")
    if cfg["pooling"] not in ("attention", "mean"):
        raise ValueError(f"pooling must be 'attention' or 'mean', got {cfg['pooling']!r}")
    if cfg["loss"] not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {cfg['loss']!r}")


def train(ws: Workspace, progress: bool = True, **config: Any) -> int:
    """Train TriDerm-V on ``ws`` (options as in :data:`DEFAULTS`; ``backbone`` may be a
    registry name or a loaded :class:`Backbone`); returns the run id."""
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown training options: {sorted(unknown)}")
    cfg = {**DEFAULTS, **config}
    check_config(cfg)
    criterion = make_loss(cfg["loss"])
    device = pick_device()
    torch.manual_seed(cfg["seed"])
    gen = torch.Generator().manual_seed(cfg["seed"])
    image_ids, keys = workspace_wounds(ws)
    if not keys:
        raise ValueError(f"{ws.root}: no wounds outlined — nothing to train on")
    backbone = cfg["backbone"] if isinstance(cfg["backbone"], Backbone) else load_backbone(cfg["backbone"], device=device)
    run_id = ws.store.start_run("vision-triderm", {
        **cfg, "backbone": backbone.name, "modality": "vision", "device": str(device),
        "n_images": len(image_ids), "n_wounds": len(keys), "synthetic": ws.is_synthetic}, seed=cfg["seed"])
    try:
        timing: dict[str, float] = {}
        t0 = time.perf_counter()
        cache = FeatureCache(ws, backbone)
        photos = cache.build(image_ids, 0 if cfg["no_cache"] else cfg["views"], progress)
        # token bookkeeping and the cached training loop are many tiny ops: on CPU one thread
        # is fastest (no per-op fork/join, no oversubscription of shared cores)
        small_ops = 1 if device.type == "cpu" else torch.get_num_threads()
        with torch_threads(small_ops):
            bank = TokenBank(photos, keys)
        timing["features_s"] = time.perf_counter() - t0
        fresh = FreshViews(ws, backbone, cache, bank) if cfg["no_cache"] else None
        head = WoundHead(bank.channels, cfg["dim"], cfg["pooling"], cfg["hidden"]).to(device)
        t1 = time.perf_counter()
        with torch_threads(small_ops if fresh is None else torch.get_num_threads()):
            losses = fit(head, bank, criterion, cfg, gen, device, fresh, progress,
                         on_epoch=lambda ep, ls: ws.store.update_run(
                             run_id, progress=(ep + 1) / cfg["epochs"], metrics={"loss": ls}))
        timing["train_s"] = time.perf_counter() - t1
        with torch.no_grad():
            z, weights = head(bank.eval_tokens.to(device), bank.eval_segment.to(device), len(bank))
        wound_emb = z.float().cpu().numpy()
        ids, image_emb = image_means(bank.wound_keys, wound_emb)
        save_embeddings(ws, run_id, ids, image_emb=image_emb, wound_keys=bank.wound_keys, wound_emb=wound_emb,
                        token_wound=bank.eval_segment.numpy(), token_pos=bank.eval_pos.numpy(),
                        token_weight=weights.float().cpu().numpy(), grid=np.array(bank.grid),
                        input_size=np.array(backbone.input_size))
        if not all(math.isfinite(x) for x in losses):
            raise FloatingPointError(f"non-finite training loss: {losses[-5:]}")
        ws.store.finish_run(run_id, metrics={"loss": losses, "timing": timing})
    except BaseException as e:
        ws.store.finish_run(run_id, status="stopped" if isinstance(e, KeyboardInterrupt) else "failed",
                            metrics={"error": f"{type(e).__name__}: {e}"})
        raise
    return run_id


def baseline_run(ws: Workspace, backbone: str | Backbone, progress: bool = True) -> int:
    """Latest finished frozen baseline of ``backbone`` (a registry name or a loaded backbone,
    matched on the recorded name), computed when there is none."""
    name = backbone.name if isinstance(backbone, Backbone) else backbone
    for run in ws.store.runs(kind="vision-baseline"):
        if run["status"] == "done" and run["config"].get("backbone") == name:
            return int(run["id"])
    bb = backbone if isinstance(backbone, Backbone) else load_backbone(backbone)
    return embed_baseline(ws, bb, progress=progress)


def run_agreement(ws: Workspace, run_id: int) -> dict[str, Any]:
    """Agreement of a run's image embedding with the workspace's expert triplets."""
    emb = load_embeddings(ws, run_id)
    return evaluate(emb["image_ids"], pairwise_euclidean(emb["image_emb"]), ws.store.expert_triplets())

