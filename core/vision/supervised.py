"""Learning from the expert's triplets, evaluated honestly (beyond the TriDerm paper).

**Patient-disjoint folds.** The patients (``patient_id`` of a photo; a photo without one is its
own patient) are dealt into K folds, and the dealing is repeated over several random splits
(:func:`repeated_folds`). A fold's *training* triplets are those that name no photo of the fold.

**Two protocols** (:func:`split_triplets`, :func:`score_folds`): a fold's model is scored on

- *strict* — triplets whose three photos are all in the fold: no photo was seen by training, the
  headline for every learned embedding (new patients);
- *anchor unseen* — the anchor in the fold, both references outside it (photos training saw):
  "a new photo among the study's photos", the retrieval use case, reported as its own row.

Triplets with one reference in the fold are in neither. With K folds only about 1/K² of the
triplets are strict, so the defaults use few, large folds (2) repeated over random splits.
Balanced agreement pools every fold's records per anchor; its 95 % CI resamples *patients*
(:func:`core.eval.metrics.patient_bootstrap_ci`).

**Linear metric** (:class:`LinearMetric`): the supervised baseline on frozen features — a linear
map learned with the same ordinal hinge (:class:`~core.losses.ExpertTripletLoss`); its
standardisation is fitted on the photos its training triplets name, never on test photos.

**Metric head** (:class:`MetricHead`, :func:`fit_metric_head`): the supervised TriDerm-V head —
wound pooling of the tokens, fixed standardisation by the training wounds, a linear map (by
default an ensemble of 5, trained side by side) — trained with the same hinge on the image means
of its wound embeddings, each wound seen through a random cached augmented view at every step
(the self-supervised recipe's views, used as data augmentation), the rate decayed on a cosine.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted
from tqdm.auto import tqdm

from core.eval.metrics import patient_bootstrap_ci, patient_of, patient_paired_test  # noqa: F401 (re-exported)
from core.losses import ExpertTripletLoss
from core.vision.features import TokenBank
from core.vision.pooling import AttentionPooling, MeanPooling
from core.vision.triderm_config import TriDermConfig


def patient_folds(image_ids: Sequence[str], patients: dict[str, str], k: int, seed: int = 0) -> list[list[str]]:
    """Deal the patients of ``image_ids`` into ``k`` folds of about equal photo counts (largest
    patients first, each to the currently smallest fold, ties broken by a seeded shuffle)."""
    groups: dict[str, list[str]] = {}
    for i in image_ids:
        groups.setdefault(patients[i], []).append(i)
    if k < 2:
        raise ValueError(f"--cv needs at least 2 folds, got {k}")
    if k > len(groups):
        raise ValueError(f"--cv {k} is larger than the number of patients ({len(groups)})")
    order = list(groups)
    np.random.default_rng(seed).shuffle(order)
    order.sort(key=lambda p: -len(groups[p]))
    folds: list[list[str]] = [[] for _ in range(k)]
    for p in order:
        min(folds, key=len).extend(groups[p])
    return [sorted(f) for f in folds]


def fold_rows(image_ids: Sequence[str], patients: dict[str, str], k: int, seed: int = 0,
              among: Sequence[int] | None = None) -> list[np.ndarray]:
    """:func:`patient_folds` of the photos ``image_ids`` (or of its rows ``among`` only), as row indices of
    ``image_ids``."""
    row = {i: n for n, i in enumerate(image_ids)}
    ids = image_ids if among is None else [image_ids[r] for r in among]
    return [np.array([row[i] for i in fold]) for fold in patient_folds(ids, patients, k, seed)]


def repeated_folds(image_ids: Sequence[str], patients: dict[str, str], k: int, repeats: int,
                   seed: int = 0) -> list[list[np.ndarray]]:
    """``repeats`` random patient-disjoint splits into ``k`` folds (seeds ``seed``, ``seed + 1``, …), as row
    indices of ``image_ids`` (:func:`fold_rows`)."""
    if repeats < 1:
        raise ValueError(f"need at least 1 repeat of the folds, got {repeats}")
    return [fold_rows(image_ids, patients, k, seed + r) for r in range(repeats)]


def split_triplets(triplets: np.ndarray, test_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean (train, strict, anchor-unseen) masks over oriented triplets ``[i, j, k]`` for a fold
    whose photos are the row indices ``test_rows``: train = no photo of the fold; strict = all three
    photos in the fold; anchor-unseen = the anchor in the fold, both references outside it."""
    in_fold = np.isin(triplets, test_rows)
    # numpy's stubs type .any/.all over an axis as "scalar or array" (shape unknown); these are 1-D arrays
    return ~in_fold.any(1), in_fold.all(1), in_fold[:, 0] & ~in_fold[:, 1:].any(1)  # type: ignore[return-value]


def subsample(triplets: np.ndarray, n: int | None, seed: int) -> np.ndarray:
    """``n`` triplets drawn without replacement (all when ``n`` is None or too large)."""
    if n is None or n >= len(triplets):
        return triplets
    return triplets[np.sort(np.random.default_rng(seed).choice(len(triplets), n, replace=False))]


#: a fold's result: (its photos' rows, the n×n distances of the model trained without them)
Fold = tuple[np.ndarray, np.ndarray]


def cross_validate(splits: Sequence[Sequence[np.ndarray]], triplets: np.ndarray,
                   fit_fold: Callable[[np.ndarray, np.ndarray], np.ndarray], budget: int | None = None,
                   seed: int = 0, progress: Callable[[int], None] | None = None) -> list[Fold]:
    """Every fold of every split (rows of each fold's photos): ``fit_fold(train_triplets, test_rows)``
    returns the fold model's n×n distances; ``budget`` caps the training triplets of each fold."""
    out: list[Fold] = []
    for rows in (r for split in splits for r in split):
        train, _, _ = split_triplets(triplets, rows)
        out.append((rows, fit_fold(subsample(triplets[train], budget, seed + len(out)), rows)))
        if progress is not None:
            progress(len(out) - 1)
    return out


PROTOCOLS = ("strict", "anchor_unseen")


def score_folds(triplets: np.ndarray, folds: Sequence[Fold]) -> dict[str, np.ndarray]:
    """Protocol → (m, 2) records ``[anchor row, correct]``: every fold's strict and anchor-unseen
    triplets scored with that fold's distances (correct: the chosen reference strictly closer)."""
    out: dict[str, list[np.ndarray]] = {p: [] for p in PROTOCOLS}
    for rows, D in folds:
        _, strict, anchor = split_triplets(triplets, rows)
        for name, mask in zip(PROTOCOLS, (strict, anchor)):
            i, j, k = triplets[mask].T
            out[name].append(np.stack([i, (D[i, j] < D[i, k]).astype(np.int64)], 1))
    return {p: np.concatenate(v) if v else np.zeros((0, 2), np.int64) for p, v in out.items()}


def strict_tallies(triplets: np.ndarray, folds: Sequence[Fold]) -> np.ndarray:
    """(m, 5) rows ``[i, j, k, correct, scored]`` of the oriented triplets scored strictly in at least one fold
    (all three photos in the fold): how often the fold's distances put the chosen ``j`` strictly closer, of
    how often the triplet was scored over folds and splits; the records a paired comparison with another
    run on common triplets needs (:mod:`core.eval.verdict`)."""
    correct = np.zeros(len(triplets), np.int64)
    scored = np.zeros(len(triplets), np.int64)
    for rows, D in folds:
        _, strict, _ = split_triplets(triplets, rows)
        i, j, k = triplets[strict].T
        scored[strict] += 1
        correct[strict] += (D[i, j] < D[i, k]).astype(np.int64)
    keep = scored > 0
    return np.concatenate([triplets[keep], correct[keep, None], scored[keep, None]], 1)


def protocol_summary(records: np.ndarray, image_ids: Sequence[str], patients: dict[str, str],
                     n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Balanced agreement of ``records`` (:func:`score_folds`; an anchor's accuracy pools all its
    records over folds and splits) with its patient-bootstrap 95 % CI, the counts, and
    ``per_anchor`` (image id → accuracy) for paired tests."""
    if not len(records):
        return {"balanced": None, "ci": None, "n": 0, "n_anchors": 0, "n_patients": 0, "per_anchor": {}}
    anchors, inv = np.unique(records[:, 0], return_inverse=True)
    acc = np.bincount(inv, weights=records[:, 1].astype(float)) / np.bincount(inv)
    per_anchor = {image_ids[a]: float(x) for a, x in zip(anchors, acc)}
    return {"balanced": float(acc.mean()), "ci": patient_bootstrap_ci(per_anchor, patients, n_boot, seed),
            "n": len(records), "n_anchors": len(anchors),
            "n_patients": len({patients[a] for a in per_anchor}), "per_anchor": per_anchor}


def fused_distances(D_a: np.ndarray, D_b: np.ndarray, weight: float, rows: np.ndarray) -> np.ndarray:
    """``(1 − weight)·D_a + weight·D_b``, each first divided by its median distance between the
    photos ``rows`` (the training photos: the scales never look at test photos)."""
    def scaled(D: np.ndarray) -> np.ndarray:
        sub = D[np.ix_(rows, rows)][~np.eye(len(rows), dtype=bool)]
        return D / max(float(np.median(sub)), 1e-12)

    if weight == 0:
        return scaled(D_a)
    if weight == 1:
        return scaled(D_b)
    return (1 - weight) * scaled(D_a) + weight * scaled(D_b)


class LinearMetric(TransformerMixin, BaseEstimator):
    """A linear map ``z = (x − μ)/σ · W`` learned from oriented triplets ``[i, j, k]`` ("i is
    closer to j than to k") with the ordinal hinge on squared distances (margin 1, the scale of
    the map; weight decay keeps it small); Adam, full batch. Distances are Euclidean in ``z``.
    ``μ``, ``σ`` are fitted on the photos the triplets name only (rows of ``X`` no triplet names —
    held-out photos — do not move them).

    ``fit(X, y=triplets)``; fitted attributes ``mean_``, ``scale_``, ``components_``.
    """

    def __init__(self, n_components: int = 64, margin: float = 1.0, lr: float = 1e-2, epochs: int = 300,
                 weight_decay: float = 1e-2, random_state: int | None = 0) -> None:
        self.n_components = n_components
        self.margin = margin
        self.lr = lr
        self.epochs = epochs
        self.weight_decay = weight_decay
        self.random_state = random_state

    def fit(self, X: np.ndarray, y: np.ndarray) -> LinearMetric:
        """Learn the map from the oriented triplets ``y`` on the features ``X``."""
        X = np.asarray(X, dtype=np.float64)
        trip = np.asarray(y, dtype=np.int64)
        if X.ndim != 2:
            raise ValueError(f"X must be n_samples × n_features, got shape {X.shape}")
        if trip.ndim != 2 or trip.shape[1] != 3 or len(trip) == 0:
            raise ValueError(f"y must be a non-empty (m, 3) array of triplets [i, j, k], got shape {trip.shape}")
        if trip.min() < 0 or trip.max() >= len(X):
            raise ValueError(f"triplet indices must lie in [0, {len(X)})")
        # the standardisation sees the photos the training triplets name, never a held-out photo
        seen = X[np.unique(trip)]
        self.mean_ = seen.mean(0)
        self.scale_ = seen.std(0) + 1e-6
        gen = torch.Generator().manual_seed(0 if self.random_state is None else int(self.random_state))
        x = torch.from_numpy((X - self.mean_) / self.scale_).float()
        d = x.shape[1]
        w = torch.nn.Parameter(torch.randn(d, self.n_components, generator=gen) / np.sqrt(d))
        opt = torch.optim.Adam([w], lr=self.lr, weight_decay=self.weight_decay)
        loss_fn, t = ExpertTripletLoss(self.margin, normalize=False), torch.from_numpy(trip)
        for _ in range(self.epochs):
            loss = loss_fn(x @ w, t)
            opt.zero_grad()
            loss.backward()
            opt.step()
        self.components_ = w.detach().numpy().astype(np.float64)
        return self

    def transform(self, X: np.ndarray) -> np.ndarray:
        """Map the features ``X`` into the learned space."""
        check_is_fitted(self, "components_")
        return ((np.asarray(X, dtype=np.float64) - self.mean_) / self.scale_) @ self.components_


class MetricHead(torch.nn.Module):
    """``z = ((pool(tokens) − μ) / σ) · W``: wound pooling (mean, or attention that starts as the
    mean — its last layer is zero), standardisation by the training wounds' mean-pooled tokens
    (buffers ``mean``/``scale``, set by :func:`fit_metric_head`), a bias-free linear map to
    ``heads`` independent blocks of ``dim`` (an ensemble: each block is trained with its own hinge,
    see :func:`fit_metric_head`; squared distances add over the blocks)."""

    mean: torch.Tensor  # buffers
    scale: torch.Tensor

    def __init__(self, channels: int, dim: int = 64, pooling: str = "mean", hidden: int = 128,
                 heads: int = 1) -> None:
        super().__init__()
        if pooling == "attention":
            pool = AttentionPooling(channels, hidden)
            score = pool.score[2]
            assert isinstance(score, torch.nn.Linear)
            torch.nn.init.zeros_(score.weight)
            torch.nn.init.zeros_(score.bias)
            self.pool: torch.nn.Module = pool
        elif pooling == "mean":
            self.pool = MeanPooling()
        else:
            raise ValueError(f"pooling must be 'attention' or 'mean', got {pooling!r}")
        if heads < 1:
            raise ValueError(f"heads must be ≥ 1, got {heads}")
        self.dim, self.heads = dim, heads
        self.register_buffer("mean", torch.zeros(channels))
        self.register_buffer("scale", torch.ones(channels))
        self.proj = torch.nn.Linear(channels, heads * dim, bias=False)
        torch.nn.init.normal_(self.proj.weight, std=channels ** -0.5)

    def forward(self, tokens: torch.Tensor, segment: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(wound embeddings n×(heads·dim), attention weight per token)."""
        pooled, w = self.pool(tokens, segment, n)
        return self.project(pooled), w

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """Pooled wound tokens (…×channels) → the metric space (…×heads·dim)."""
        return self.proj((pooled - self.mean) / self.scale)


def image_rows_mean(z: torch.Tensor, rows: torch.Tensor, n_images: int) -> torch.Tensor:
    """n_images×d means of the wound embeddings ``z`` grouped by their image row (0 when none)."""
    sums = z.new_zeros((n_images, z.shape[1])).index_add_(0, rows, z)
    return sums / torch.bincount(rows, minlength=n_images).clamp(min=1).to(z.dtype)[:, None]


def view_means(bank: TokenBank, wounds: torch.Tensor, eval_means: torch.Tensor) -> torch.Tensor:
    """len(wounds)×(1 + views)×C mean tokens: column 0 the inference view (``eval_means``), column
    v + 1 augmented view v (the inference view where the wound is lost in view v)."""
    cols = [eval_means]
    for v in range(bank.n_views):
        views = torch.where(bank.valid[wounds, v], v, -1)
        pooled, _ = MeanPooling()(*bank.gather(wounds, views), len(wounds))
        cols.append(pooled)
    return torch.stack(cols, 1)


def fit_metric_head(head: MetricHead, bank: TokenBank, wound_image: torch.Tensor, n_images: int,
                    wounds: torch.Tensor, triplets: torch.Tensor, cfg: TriDermConfig, gen: torch.Generator,
                    device: torch.device, progress: bool = False) -> list[float]:
    """Train ``head`` on the bank rows ``wounds`` with the ordinal hinge (margin 1 on squared
    distances) over ``triplets`` (image rows): full batch, one random augmented view per wound and
    step (the inference view when ``cfg.supervise_augment`` is false), Adam for ``cfg.supervise_steps``
    steps (lr ``supervise_lr`` decayed to 0 on a cosine, weight decay ``supervise_weight_decay``).
    With ``head.heads`` > 1 every block has its own hinge and, with mean pooling, its own view
    draws (attention pooling pools once per step, so its blocks share the step's views). Returns
    the loss of every step (the mean over the blocks)."""
    head = head.to(device)
    with torch.no_grad():
        pooled, _ = MeanPooling()(bank.eval_tokens, bank.eval_segment, len(bank))
        pooled = pooled[wounds]
        head.mean.copy_(pooled.mean(0))
        std = pooled.std(0)
        # a channel (near) constant over the training wounds but not over their augmented views
        # would blow up: floor the scale at a tenth of the typical channel's
        head.scale.copy_(std.clamp_min(0.1 * float(std.mean()) + 1e-6))
        # mean pooling has no parameters: pool every (wound, view) once, then a step is an index
        means = view_means(bank, wounds, pooled).to(device) if isinstance(head.pool, MeanPooling) else None
    opt = torch.optim.Adam(head.parameters(), lr=cfg.supervise_lr, weight_decay=cfg.supervise_weight_decay)
    # the views make every step's loss noisy: decaying the rate lets the head settle (on small sets
    # a constant rate kept the hinge jumping between 10² and 10³ to the last step)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.supervise_steps)
    loss_fn, trip, rows = ExpertTripletLoss(1.0, normalize=False), triplets.to(device), wound_image[wounds].to(device)
    losses: list[float] = []
    no_view = torch.full((len(wounds),), -1)
    head.train()
    for _ in tqdm(range(cfg.supervise_steps), desc="metric head", unit="step", disable=not progress, leave=False):
        if means is None:  # attention pooling: one draw of views, pooled once, for every block
            views = bank.sample_views(wounds, gen)[0] if cfg.supervise_augment else no_view
            x, s = bank.gather(wounds, views)
            zs = [head(x.to(device), s.to(device), len(wounds))[0]] * head.heads
        else:  # each block of the ensemble sees its own view of every wound: block h of zs[h]
            views = (torch.stack([bank.sample_views(wounds, gen)[0] for _ in range(head.heads)])
                     if cfg.supervise_augment else no_view.expand(head.heads, -1))
            zs = list(head.project(means[torch.arange(len(wounds)), views + 1]))
        loss = torch.stack([loss_fn(image_rows_mean(z[:, h * head.dim:(h + 1) * head.dim], rows, n_images), trip)
                            for h, z in enumerate(zs)]).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(float(loss.detach()) / head.heads)
    head.eval()
    return losses
