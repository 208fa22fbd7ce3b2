"""Learning from the expert's triplets (beyond the TriDerm paper), scored by the evaluation protocol of
:mod:`core.eval.protocol` (patient-disjoint folds, strict and anchor-unseen triplets, patient bootstrap).

**Linear metric** (:class:`LinearMetric`): the supervised baseline on frozen features — a linear
map learned with the ordinal hinge (:class:`~core.losses.ExpertTripletLoss`); its
standardisation is fitted on the photos its training triplets name, never on test photos.

**Metric head** (:class:`MetricHead`, :func:`fit_metric_head`): the supervised TriDerm-V head —
wound pooling of the tokens, fixed standardisation by the training wounds, a linear map (by
default an ensemble of 5, trained side by side) — trained with the same hinge on the image means
of its wound embeddings, each wound seen through a random cached augmented view at every step
(the self-supervised recipe's views, used as data augmentation), the rate decayed on a cosine.
"""
from __future__ import annotations


import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted
from tqdm.auto import tqdm

from core.losses import ExpertTripletLoss
from core.vision.features import TokenBank
from core.vision.pooling import AttentionPooling, MeanPooling
from core.vision.triderm_config import TriDermConfig


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
