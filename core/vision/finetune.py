"""Partial fine-tuning of the backbone's last stage with the expert's triplets (issue 30 §4).

EfficientNet-Lite0's stem and stages 1–6 stay frozen; their output (the ``stage6`` layer, cached
with the self-supervised recipe's augmented views) feeds a trainable copy of the last stage
(``blocks[6]``) and the head (``conv_head`` + ``bn2``, batch-norm statistics kept at ImageNet's).
A photo's embedding is the mean over its wounds of their mean tokens (the frozen baseline's
pooling) — by default averaged over its inference view and its cached augmented views (test-time views,
:attr:`~core.vision.triderm_config.FineTuneConfig.test_views`: +3.1 pp strict on azh-dev's new patients,
``benchmarks.real_vision_directions``) — centred on the training photos' mean and scaled to unit length. Each step shows every
training photo through one of its views drawn at random (the inference view or an augmented one)
and takes the ordinal hinge (:class:`~core.losses.ExpertTripletLoss`) on a batch of the training
triplets; the tail is evaluated only at the cells the pooled embedding reads
(:func:`~core.vision.token_tail.token_pooled`: 5.3× fewer FLOPs, the same modules). Only triplets and photos of the training fold are used (patient-disjoint in the
benchmark); the held-out photos are embedded like every photo (their cached views were never trained on). A run saves the tuned
weights and the study's centre (``runs/<id>/tail.pt``), so new photos can be placed among the study's
(:class:`~core.vision.inference.TunedModel`). :meth:`LastStageTuner.adapt` trains the same tail without labels
(VICReg between two cached views of each photo), measured by ``benchmarks.real_vision_adapt``.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from annotations.store import runs
from annotations.infra.fileio import atomic_write
from annotations.infra.workspace import Workspace
from core.eval.distances import pairwise_euclidean
from core.eval.protocol import cross_validate, oriented_expert, patient_of, repeated_folds, strict_cv_metrics
from core.eval.retrieval import cv_retrieval, photo_types
from core.losses import ExpertTripletLoss, VICRegLoss
from core.runtime import keep_freed_memory, pick_device, save_embeddings
from core.vision.backbones import Backbone, load_backbone
from core.vision.baseline import centred_folds, centred_unit, mean_pooled
from core.vision.features import FeatureCache, PhotoFeatures, TokenBank, token_mask, workspace_wounds
from core.vision.triderm_config import FineTuneConfig  # the fine-tune mode's options (torch-free)
from core.vision.recipe import OFFLINE_DEFAULT, SUPERVISED_CV
from core.vision.token_tail import step_flops, token_pooled

#: the run kind of :func:`train_finetuned`
RUN_KIND = runs.VISION_FINETUNE
#: a run's tuned weights: backbone name, the tail's state, the study's centre, the configuration
TAIL_FILE = "tail.pt"
#: member m of an ensemble (:attr:`FineTuneConfig.members`) is fitted with seed ``seed + SEED_STRIDE · m``
SEED_STRIDE = 1000
#: the tuned modules of EfficientNet-Lite0 (last stage + head), in forward order
TAIL = ("blocks.6", "conv_head", "bn2")


@dataclass(frozen=True)
class AdaptConfig:
    """Self-supervised adaptation of the last stage + head (:meth:`LastStageTuner.adapt`): steps, AdamW rate,
    photos per batch, projector width, seed."""

    steps: int = 150
    lr: float = 1e-4
    batch_photos: int = 64
    projector: int = 512
    seed: int = 0


def pooling_weights(frac: Tensor) -> Tensor:
    """H×W weights whose weighted sum of a token map is the mean over wounds of their mean tokens
    (``frac``: E×H×W wound area fractions; wounds without a token are left out; all zero if none)."""
    mask = token_mask(frac.float()).float()
    n = mask.flatten(1).sum(1)
    present = n > 0
    if not present.any():
        return torch.zeros(frac.shape[1:])
    return (mask[present] / n[present, None, None]).sum(0) / present.sum()


def tail_of(backbone: Backbone) -> nn.Sequential:
    """The last stage + head (:data:`TAIL`) of an EfficientNet-Lite0 backbone (any layer: its model holds
    them), as the modules themselves."""
    return nn.Sequential(*(backbone.model.get_submodule(name) for name in TAIL))


class LastStageTuner:
    """The last stage + head of EfficientNet-Lite0, tuned on stage-6 features.

    ``photos`` are the rows' stage-6 features (:class:`~core.vision.features.PhotoFeatures`, in row
    order); ``fit(triplets, fit_rows)`` trains on the oriented triplets (all rows in ``fit_rows``);
    ``transform()`` embeds every row (test-time views unless the config says not), centred on the mean embedding
    of ``fit_rows`` (:meth:`centre`), unit length.
    """

    def __init__(self, backbone: Backbone, photos: list[PhotoFeatures], config: FineTuneConfig = FineTuneConfig(),
                 device: torch.device | str = "cpu", start: nn.Module | None = None) -> None:
        self.device = torch.device(device)
        self.start = start if start is not None else tail_of(backbone)
        self.config = config
        self.eval_x = torch.stack([p.eval_feat.float() for p in photos])
        self.eval_w = torch.stack([pooling_weights(p.eval_frac) for p in photos])
        views = [torch.cat([p.eval_feat[None].float(), p.views.float()]) for p in photos]
        weights = [torch.stack([self.eval_w[n], *(pooling_weights(f) for f in p.view_frac)])
                   for n, p in enumerate(photos)]
        # a view where no wound kept a token falls back to the inference view
        self.view_x = torch.stack([torch.where(w.flatten(1).sum(1)[:, None, None, None] > 0, v, v[:1])
                                   for v, w in zip(views, weights)])
        self.view_w = torch.stack([torch.where(w.flatten(1).sum(1)[:, None, None] > 0, w, w[:1]) for w in weights])
        self.eval_x, self.eval_w, self.view_x, self.view_w = (
            t.to(self.device) for t in (self.eval_x, self.eval_w, self.view_x, self.view_w))
        self.tail: nn.Module = self.start
        self.tails: list[nn.Module] = [self.start]  # the ensemble's members (one unless config.members says more)
        self.losses: list[float] = []
        self.fit_rows_ = np.zeros(0, np.int64)
        self._embedded: dict[bool, list[np.ndarray]] = {}  # the members' embeddings, by test_views, until a refit
        #: wall seconds and counted floating-point operations of the last :meth:`fit`
        self.fit_s_ = 0.0
        self.fit_flops_ = 0
        self.fit_photos_ = 0
        if self.device.type == "cpu":
            keep_freed_memory()

    def _trainable_copy(self) -> nn.Module:
        """A copy of the starting tail on the device, weights trainable, batch-norm statistics kept (ImageNet's)."""
        tail = copy.deepcopy(self.start).to(self.device)
        tail.eval()
        return tail.requires_grad_(True)

    def _embed(self, x: Tensor, w: Tensor, tail: nn.Module | None = None) -> Tensor:
        return token_pooled(self.tail if tail is None else tail, x, w)

    def fit(self, triplets: np.ndarray, fit_rows: np.ndarray, seed: int | None = None) -> LastStageTuner:
        """Tune ``members`` fresh copies of the last stage + head on ``triplets`` over the photos ``fit_rows``,
        member m with seed ``seed + SEED_STRIDE·m`` (``seed`` overrides the config's)."""
        cfg = self.config if seed is None else replace(self.config, seed=seed)
        rows = np.asarray(fit_rows)
        local = {int(r): n for n, r in enumerate(rows)}
        if not len(triplets) or not set(np.unique(triplets).tolist()) <= local.keys():
            raise ValueError("fine-tuning needs training triplets whose photos are all in fit_rows")
        t = torch.tensor([[local[int(i)] for i in tr] for tr in triplets]).to(self.device)
        index = torch.from_numpy(rows).to(self.device)
        self.losses = []
        self.fit_photos_ = len(rows)
        self.fit_flops_ = cfg.members * cfg.steps * step_flops(self.start, self.view_w[index, 0])
        started = time.perf_counter()
        self.tails = [self._fit_member(t, index, cfg, cfg.seed + SEED_STRIDE * m) for m in range(cfg.members)]
        self.fit_s_ = time.perf_counter() - started
        self.fit_rows_ = rows
        self._embedded = {}
        return self

    def _fit_member(self, t: Tensor, index: Tensor, cfg: FineTuneConfig, seed: int) -> nn.Module:
        """One tuned copy of the starting tail (its losses appended to :attr:`losses`)."""
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.tail = self._trainable_copy()
        opt = torch.optim.AdamW(self.tail.parameters(), lr=cfg.lr, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.steps)
        loss_fn = ExpertTripletLoss(cfg.margin, normalize=True)
        for _ in range(cfg.steps):
            view = torch.randint(self.view_x.shape[1], (len(index),), generator=gen).to(self.device)
            emb = self._embed(self.view_x[index, view], self.view_w[index, view])
            batch = t[torch.randint(len(t), (min(cfg.batch_triplets, len(t)),), generator=gen).to(self.device)]
            loss = loss_fn(emb - emb.mean(0), batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            self.losses.append(loss.item())
        return self.tail

    def untuned(self, fit_rows: np.ndarray) -> LastStageTuner:
        """Keep the starting tail as it is (no training, one member) and centre on the photos ``fit_rows``."""
        self.tail = self.start.to(self.device)
        self.tails = [self.tail]
        self.fit_rows_ = np.asarray(fit_rows)
        self._embedded = {}
        return self

    def adapt(self, config: AdaptConfig = AdaptConfig(), progress: bool = False) -> nn.Module:
        """A copy of the starting tail adapted without labels on every row (VICReg between two cached views of
        each photo in a batch, through a projector that is then dropped); returns it (the losses in ``losses``)."""
        loss_fn, n, n_views = VICRegLoss(), len(self.view_x), self.view_x.shape[1]
        if n < 2 or n_views < 2:
            raise ValueError(f"adapting needs at least 2 photos with augmented views, got {n} photos × {n_views} views")
        gen = torch.Generator().manual_seed(config.seed)
        torch.manual_seed(config.seed)
        tail = self._trainable_copy()
        with torch.no_grad():
            channels = int(tail(self.eval_x[:1]).shape[1])
        projector = nn.Sequential(nn.Linear(channels, config.projector), nn.BatchNorm1d(config.projector), nn.ReLU(),
                                  nn.Linear(config.projector, config.projector)).to(self.device)
        params = [*tail.parameters(), *projector.parameters()]
        opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=config.steps)
        self.losses = []
        for _ in tqdm(range(config.steps), desc="adapting the last stage", unit="step", disable=not progress):
            rows = torch.randperm(n, generator=gen)[:config.batch_photos].to(self.device)
            first = torch.randint(n_views, (len(rows),), generator=gen)
            second = (first + torch.randint(1, n_views, (len(rows),), generator=gen)) % n_views
            z1, z2 = (projector(token_pooled(tail, self.view_x[rows, v.to(self.device)],
                                             self.view_w[rows, v.to(self.device)])) for v in (first, second))
            loss = loss_fn(z1, z2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            self.losses.append(loss.item())
        return tail.requires_grad_(False)

    def _embeddings(self, test_views: bool) -> list[np.ndarray]:
        """Every row's tuned embedding by each member: the inference view's, or its mean over the inference view
        and the cached augmented views (``test_views``); computed once per fit (:meth:`transform` and :meth:`save`
        share it)."""
        if test_views in self._embedded:
            return self._embedded[test_views]
        with torch.no_grad():
            self._embedded[test_views] = [
                (torch.stack([self._embed(self.view_x[:, v], self.view_w[:, v], tail)
                              for v in range(self.view_x.shape[1])]).mean(0) if test_views
                 else self._embed(self.eval_x, self.eval_w, tail)).double().cpu().numpy() for tail in self.tails]
        return self._embedded[test_views]

    def centre(self) -> np.ndarray:
        """The study's centre: each member's mean embedding of the training photos (after :meth:`fit`), concatenated
        (what :meth:`transform` subtracts)."""
        return np.concatenate([e[self.fit_rows_].mean(0) for e in self._embeddings(self.config.test_views)])

    @property
    def embedded_views(self) -> int:
        """The augmented views averaged with the inference view in an embedding (0: the inference view alone)."""
        return self.view_x.shape[1] - 1 if self.config.test_views else 0

    def transform(self, test_views: bool | None = None) -> np.ndarray:
        """Every row's embedding (with test-time views unless ``test_views`` — default the config's — is False):
        each member's centred on the training photos' mean of it and unit length, the members' concatenated and
        scaled by 1/√members (unit length; squared distances are the members' mean) (after :meth:`fit`)."""
        parts = self._embeddings(self.config.test_views if test_views is None else test_views)
        return np.hstack([centred_unit(e, e[self.fit_rows_].mean(0)) for e in parts]) / np.sqrt(len(parts))

    def save(self, path: Path, backbone: str) -> None:
        """Write the tuned tail (``tail``: member 0; ``members``: the others'), the centre (the members' concatenated)
        and the configuration (with :attr:`embedded_views`) to ``path`` (``torch.save``, plain tensors)."""
        config: dict[str, Any] = {**asdict(self.config), "embedded_views": self.embedded_views}
        with atomic_write(path, "wb", suffix=".pt") as fh:
            torch.save({"backbone": backbone, "tail": self.tails[0].state_dict(),
                        "members": [t.state_dict() for t in self.tails[1:]], "center": torch.from_numpy(self.centre()),
                        "config": config}, fh)


def fit_timing(tuner: LastStageTuner) -> dict[str, float]:
    """The last fit's wall seconds, counted GFLOP (:func:`step_flops` × steps) and photos, for the run record."""
    return {"s": round(tuner.fit_s_, 2), "gflop": round(tuner.fit_flops_ / 1e9, 1), "photos": tuner.fit_photos_}


def train_finetuned(ws: Workspace, views: int, cv: int = SUPERVISED_CV, cv_repeats: int = 3,
                    config: FineTuneConfig = FineTuneConfig(), progress: bool = True,
                    frozen: Backbone | None = None) -> int:
    """Fine-tune the last stage + head on the workspace's expert triplets and record a ``vision-finetune`` run;
    returns its id. With ``cv`` (and photos of at least ``cv`` patients) the run's figure comes first: ``cv``
    patient-disjoint folds × ``cv_repeats`` random splits, scored strict (all three photos unseen), with the
    frozen centred embedding of ``frozen`` (default: the offline default's full network) on the same folds
    (:func:`~core.eval.protocol.versus_frozen`); then the model
    trained on every triplet embeds every photo (test-time views unless the config says not, centred on the
    study's photos, unit length)."""
    image_ids, keys = workspace_wounds(ws)
    triplets = oriented_expert(ws, image_ids)
    if not len(triplets):
        raise ValueError("fine-tuning needs expert triplets over outlined photos: the Triplets page collects them")
    patients = patient_of(ws.store.images())
    device = pick_device()
    stage6 = load_backbone(OFFLINE_DEFAULT, device=device, layer="stage6")
    with runs.recording(ws, RUN_KIND, {
            **asdict(config), "modality": "vision", "backbone": OFFLINE_DEFAULT, "tuned": " + ".join(TAIL),
            "supervise": "triplets", "views": views, "cv": cv, "cv_repeats": cv_repeats, "device": str(device),
            "n_images": len(image_ids), "n_wounds": len(keys), "n_expert_triplets": len(triplets),
            "synthetic": ws.is_synthetic}, seed=config.seed) as rec:
        run_id = rec.id
        photos = FeatureCache(ws, stage6, seed=config.seed).build(image_ids, views, progress)
        tuner = LastStageTuner(stage6, [photos[i] for i in image_ids], config, device)
        everyone = np.arange(len(image_ids))
        metrics: dict = {}
        fits: list[dict[str, float]] = []
        if cv and len({patients[i] for i in image_ids}) >= cv:
            splits = repeated_folds(image_ids, patients, cv, cv_repeats, config.seed)
            bar = tqdm(total=cv * cv_repeats, desc="fine-tuning folds", unit="fold", disable=not progress)

            def fit_fold(train: np.ndarray, rows: np.ndarray) -> np.ndarray:
                bar.update()
                emb = tuner.fit(train, np.setdiff1d(everyone, rows)).transform()
                fits.append(fit_timing(tuner))
                return pairwise_euclidean(emb)

            folds = cross_validate(splits, triplets, fit_fold)
            bar.close()
            full = frozen if frozen is not None else load_backbone(OFFLINE_DEFAULT, device=device, layer="full")
            frozen_emb = mean_pooled(TokenBank(FeatureCache(ws, full, seed=config.seed).build(image_ids, 0, progress),
                                               keys))[2]
            metrics["cv"] = {**strict_cv_metrics(image_ids, triplets, folds, centred_folds(frozen_emb, folds),
                                                 patients, cv, cv_repeats, config.seed),
                             **cv_retrieval(image_ids, folds, photo_types(ws.store.images(), image_ids), patients,
                                            config.seed)}
        image_emb = tuner.fit(triplets, everyone).transform()
        fits.append(fit_timing(tuner))
        metrics["timing"] = {"fits": fits, "fit_s": sum(f["s"] for f in fits),
                             "fit_gflop": round(sum(f["gflop"] for f in fits), 1)}
        if not all(math.isfinite(x) for x in tuner.losses):
            raise FloatingPointError(f"non-finite training loss: {tuner.losses[-5:]}")
        save_embeddings(ws, run_id, image_ids, image_emb=image_emb)
        tuner.save(ws.run_dir(run_id) / TAIL_FILE, OFFLINE_DEFAULT)
        rec.metrics = {"loss": tuner.losses, **metrics}
        rec.artifacts = {"tail": str((ws.run_dir(run_id) / TAIL_FILE).relative_to(ws.root))}
    return run_id
