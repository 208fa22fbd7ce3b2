"""Soft Ordinal Embedding (SOE) of triplet judgments.

Terada & von Luxburg, "Local ordinal embedding", ICML 2014 (SOE objective), as used by
TriDerm (paper §2.2 eq. 2, §3.2; METHODS.md §1 "Text"): for every triplet (i, j, k) meaning
"i is closer to j than to k" the loss is the hinge on squared distances

    L = Σ max(0, δ + ‖F_i − F_j‖² − ‖F_i − F_k‖²),

minimised with Adam (AMSGrad), anchor-balanced so that every anchor weighs the same.

Two protocols share one estimator:

- ``SOE.paper_protocol()``: the paper's settings — δ = 0, lr 0.05, mini-batches of 2048
  triplets resampled anchor-balanced each epoch, 50 epochs, init scale 0.1. With δ = 0
  the collapsed embedding is a zero-loss solution, so this protocol underfits (the
  embedding shrinks while it orders the triplets; see ``benchmarks/soe.py``).
- the default: δ = 0.1 and full-batch steps. With full batches the anchor balancing is
  exact (each triplet weighs 1 / (#anchors · #triplets of its anchor), which is the
  expectation of the per-epoch resampling), every step is one vectorised pass over all
  triplets, and the positive margin fixes the scale so the hinge keeps pushing
  violated and barely satisfied triplets apart. ``benchmarks/soe.py`` measures both.

At registry scale (more than ``LARGE_TRIPLETS`` triplets, ``batch_size=None``) a full pass per
step is too slow, so each of the ``epochs`` steps uses ``LARGE_BATCH`` triplets drawn uniformly
with replacement and importance-weighted by ``w_t · m`` (an unbiased estimate of the same
anchor-balanced full-batch gradient), with the learning rate cosine-decayed to 0 so the
stochastic steps settle. Beyond ``DENSE_MAX_OBJECTS`` objects the n×n distance matrix of
:func:`hinge_sq_loss_and_grad` is replaced by per-triplet gathers
(:func:`hinge_sq_loss_and_grad_sparse`). Everything runs on the estimator's one device
(CUDA when present); ``benchmarks/soe.py --scale`` measures 10⁷ triplets over 10⁴ objects.
"""
from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
from scipy.sparse import issparse
from sklearn.base import BaseEstimator
from sklearn.utils import Tags, TransformerTags
from sklearn.utils.validation import check_is_fitted

from core.eval.distances import pairwise_euclidean
from core.runtime import pick_device, torch_threads

LARGE_TRIPLETS = 2_000_000  # above this (batch_size=None), each step samples LARGE_BATCH triplets
LARGE_BATCH = 200_000
DENSE_MAX_OBJECTS = 2_048  # above this the n×n distance matrix gives way to per-triplet gathers
GRADIENTS = ("auto", "dense", "sparse")
SPARSE_CHUNK = 16_384  # triplets per pass of the per-triplet gradient (temporaries stay in cache)


def hinge_sq(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, margin: float) -> torch.Tensor:
    """Per-triplet SOE hinge max(0, δ + ‖x_a − x_b‖² − ‖x_a − x_c‖²) (TriDerm eq. 2)."""
    d_ab = (x[a] - x[b]).pow(2).sum(1)
    d_ac = (x[a] - x[c]).pow(2).sum(1)
    return (margin + d_ab - d_ac).clamp_min(0)


def hinge_sq_loss_and_grad(
    x: torch.Tensor, ab: torch.Tensor, ac: torch.Tensor, w: torch.Tensor, margin: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted SOE hinge Σ_t w_t·max(0, δ + D[a,b] − D[a,c]) and its gradient w.r.t. ``x``.

    Same loss as :func:`hinge_sq`, computed through the n×n squared-distance matrix D:
    ``ab``/``ac`` are flat indices a·n + b and a·n + c, so each step gathers one scalar
    per triplet and scatters the hinge's sub-gradient ±w_t into an n×n matrix G. With
    S = G + Gᵀ, ∂L/∂x = 2·(diag(S·1) − S)·x. For the small n of triplet studies this
    is several times cheaper than autograd through per-triplet coordinate gathers.
    """
    n = x.shape[0]
    dist = pairwise_euclidean(x, squared=True).reshape(-1)
    viol = margin + dist[ab] - dist[ac]
    wa = torch.where(viol > 0, w, torch.zeros((), dtype=w.dtype, device=w.device))
    loss = (wa * viol).sum()
    g = torch.zeros(n * n, dtype=x.dtype, device=x.device)
    g.index_add_(0, ab, wa).index_add_(0, ac, -wa)
    g = g.reshape(n, n)
    s = g + g.T
    grad = 2 * (s.sum(1, keepdim=True) * x - s @ x)
    return loss, grad


def hinge_sq_loss_and_grad_sparse(
    x: torch.Tensor, t: torch.Tensor, w: torch.Tensor, margin: float, chunk: int = SPARSE_CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same weighted hinge and gradient as :func:`hinge_sq_loss_and_grad`, from per-triplet
    gathers of the rows of ``t`` (m × 3 indices): memory O(m·d) instead of O(n²).

    Triplets are taken ``chunk`` at a time so the temporaries stay in the CPU's cache: time per
    triplet then stays flat as m grows (whole-batch temporaries of 10⁶ rows ran 1.4× slower)."""
    loss = torch.zeros((), dtype=x.dtype, device=x.device)
    grad = torch.zeros_like(x)
    zero = torch.zeros((), dtype=w.dtype, device=w.device)
    for start in range(0, len(t), chunk):
        rows, wc = t[start:start + chunk], w[start:start + chunk]
        a, b, c = rows[:, 0], rows[:, 1], rows[:, 2]
        xa = x[a]
        u_ab, u_ac = xa - x[b], xa - x[c]
        viol = margin + u_ab.pow(2).sum(1) - u_ac.pow(2).sum(1)
        wa = torch.where(viol > 0, wc, zero)
        loss += (wa * viol).sum()
        wa2 = (2 * wa).unsqueeze(1)
        grad.index_add_(0, a, (u_ac - u_ab) * -wa2).index_add_(0, b, u_ab * -wa2).index_add_(0, c, u_ac * wa2)
    return loss, grad


def _cpu_threads(device: torch.device, n: int = 1) -> contextlib.AbstractContextManager:
    """Run torch CPU ops on ``n`` intra-op threads (no-op on GPU).

    A step touches ~10⁵ scalars: too little work to split across threads, and on a shared
    machine the synchronisation makes two threads 10× slower than one (measured here)."""
    return torch_threads(n) if device.type == "cpu" else contextlib.nullcontext()


def validate_triplets(triplets: Any, n_objects: int | None = None, name: str = "triplets") -> np.ndarray:
    """Return ``triplets`` as an int64 (m, 3) array; raise ValueError naming the first bad row."""
    if issparse(triplets):
        raise TypeError(f"sparse input is not supported: {name} is a dense (m, 3) array of object indices")
    try:
        t = np.asarray(triplets)
    except Exception as exc:  # ragged nested lists
        raise ValueError(f"{name} must be an (m, 3) array of integer object indices: {exc}") from exc
    if np.iscomplexobj(t):
        raise ValueError(f"Complex data not supported: {name} holds integer object indices")
    if t.size == 0:
        raise ValueError(f"{name} is empty; need at least one triplet (i, j, k)")
    if t.ndim != 2 or t.shape[1] != 3:
        raise ValueError(f"{name} must have shape (m, 3) [anchor, closer, farther], got {t.shape}")
    integral = np.issubdtype(t.dtype, np.integer) or (
        np.issubdtype(t.dtype, np.floating) and np.all(np.isfinite(t)) and np.all(t == np.round(t)))
    if not integral:
        raise ValueError(f"{name} must hold integer object indices, got dtype {t.dtype}")
    t = t.astype(np.int64)
    if t.min() < 0:
        row = int(np.flatnonzero((t < 0).any(1))[0])
        raise ValueError(f"{name} row {row} has a negative index: {t[row].tolist()}")
    if n_objects is not None and t.max() >= n_objects:
        row = int(np.flatnonzero((t >= n_objects).any(1))[0])
        raise ValueError(f"{name} row {row} = {t[row].tolist()} has an index ≥ n_objects={n_objects}")
    same = (t[:, 0] == t[:, 1]) | (t[:, 0] == t[:, 2]) | (t[:, 1] == t[:, 2])
    if same.any():
        row = int(np.flatnonzero(same)[0])
        raise ValueError(f"{name} row {row} = {t[row].tolist()} repeats an object; i, j, k must differ")
    return t


def triplet_margins(embedding: np.ndarray, triplets: np.ndarray) -> np.ndarray:
    """‖x_i − x_k‖² − ‖x_i − x_j‖² per triplet: > 0 when the embedding satisfies it."""
    x = np.asarray(embedding, dtype=np.float64)
    t = np.asarray(triplets, dtype=np.int64)
    return ((x[t[:, 0]] - x[t[:, 2]]) ** 2).sum(1) - ((x[t[:, 0]] - x[t[:, 1]]) ** 2).sum(1)


class SOE(BaseEstimator):
    """Soft Ordinal Embedding estimator (scikit-learn API: ``fit(X, y=None)``, ``get_params``,
    ``clone``, ``NotFittedError``).

    ``X`` is the (m, 3) integer array of triplets (i, j, k) = "i is closer to j than to k";
    ``y`` is ignored. SOE is transductive: ``transform`` takes object indices, not new rows.

    Parameters
    ----------
    n_components : embedding dimension (TriDerm: 4).
    margin : hinge margin δ on squared distances (paper: 0; default 0.1, see module doc).
    lr : Adam learning rate (paper: 0.05).
    batch_size : triplets per step; ``None`` = full batch (exact anchor weights), or above
        ``LARGE_TRIPLETS`` triplets ``LARGE_BATCH`` importance-weighted samples per step.
    epochs : passes over the triplets (full batch and sampled steps: optimisation steps).
    anchor_balanced : weigh every anchor equally (paper: resampled each epoch).
    init_scale : standard deviation of the Gaussian initial embedding (paper: 0.1).
    random_state : int (the same seed gives the same embedding on the same device), a
        ``numpy.random.RandomState`` (a seed is drawn from it) or ``None`` (fresh OS entropy on
        every fit: two fits differ).
    device : ``"cpu"``, ``"cuda"`` or ``None`` (the process's device, :func:`core.runtime.pick_device`).
    n_objects : number of embedded objects; ``None`` = max index in ``X`` + 1.
    gradient : ``"auto"`` (through the n×n distance matrix up to ``DENSE_MAX_OBJECTS`` objects,
        per-triplet gathers above), ``"dense"`` or ``"sparse"``: the same loss and gradient, computed
        two ways (``dense`` needs O(n²) memory; ``sparse`` O(m·d) and time linear in the triplets).

    Attributes
    ----------
    embedding_ : (n_objects, n_components) float array.
    loss_curve_ : mean hinge loss per epoch.
    n_objects_ : number of embedded objects.
    """

    def __init__(
        self,
        n_components: int = 4,
        margin: float = 0.1,
        lr: float = 0.05,
        batch_size: int | None = None,
        epochs: int = 100,
        anchor_balanced: bool = True,
        init_scale: float = 0.1,
        random_state: int | None = None,
        device: str | None = None,
        n_objects: int | None = None,
        gradient: str = "auto",
    ) -> None:
        self.n_components = n_components
        self.margin = margin
        self.lr = lr
        self.batch_size = batch_size
        self.epochs = epochs
        self.anchor_balanced = anchor_balanced
        self.init_scale = init_scale
        self.random_state = random_state
        self.device = device
        self.n_objects = n_objects
        self.gradient = gradient

    def __sklearn_tags__(self) -> Tags:
        """A transductive transformer of integer triplets: no target, no float dtype to preserve."""
        tags = super().__sklearn_tags__()
        tags.transformer_tags = TransformerTags(preserves_dtype=[])
        tags.target_tags.required = False
        tags.non_deterministic = self.random_state is None
        return tags

    @classmethod
    def paper_protocol(cls, **overrides: Any) -> SOE:
        """The TriDerm paper's settings (§3.2): δ = 0, lr 0.05, batch 2048, 50 epochs, init 0.1."""
        params: dict[str, Any] = {"margin": 0.0, "lr": 0.05, "batch_size": 2048, "epochs": 50, "anchor_balanced": True, "init_scale": 0.1}
        params.update(overrides)
        return cls(**params)

    def _check_params(self) -> None:
        if not (isinstance(self.n_components, (int, np.integer)) and self.n_components >= 1):
            raise ValueError(f"n_components must be a positive integer, got {self.n_components!r}")
        if not self.margin >= 0:
            raise ValueError(f"margin must be ≥ 0, got {self.margin!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.batch_size is not None and not (isinstance(self.batch_size, (int, np.integer)) and self.batch_size >= 1):
            raise ValueError(f"batch_size must be a positive integer or None (full batch), got {self.batch_size!r}")
        if not (isinstance(self.epochs, (int, np.integer)) and self.epochs >= 1):
            raise ValueError(f"epochs must be a positive integer, got {self.epochs!r}")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {self.init_scale!r}")
        if self.gradient not in GRADIENTS:
            raise ValueError(f"gradient must be one of {GRADIENTS}, got {self.gradient!r}")
        n = self.n_objects
        if n is not None and not (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 3):
            raise ValueError(f"n_objects must be an integer ≥ 3 or None, got {n!r}")

    def _generator(self) -> torch.Generator:
        gen = torch.Generator()
        if self.random_state is None:
            gen.seed()  # fresh OS entropy: documented, two fits differ
        elif isinstance(self.random_state, np.random.RandomState):
            gen.manual_seed(int(self.random_state.randint(np.iinfo(np.int32).max)))
        else:
            gen.manual_seed(int(self.random_state))
        return gen

    def fit(self, X: Any, y: None = None, init: np.ndarray | None = None) -> SOE:
        """Fit the embedding to the triplets ``X`` (m × 3 rows (i, j, k) = "i closer to j than to k").

        ``y`` is ignored (scikit-learn convention). ``init`` (n_objects × n_components)
        warm-starts the optimisation (used by active selection between refits).
        """
        if isinstance(y, (int, np.integer)):
            raise TypeError(f"SOE.fit(X, y): y is ignored; n_objects is a constructor parameter now: "
                            f"SOE(n_objects={y}).fit(X)")
        self._check_params()
        t_np = validate_triplets(X, self.n_objects, name="X")
        n = int(self.n_objects) if self.n_objects is not None else int(t_np.max()) + 1
        device = torch.device(self.device) if self.device else pick_device()
        gen = self._generator()
        if init is not None:
            x0 = torch.tensor(np.asarray(init, dtype=np.float32))  # a copy: the caller's array stays as given
            if tuple(x0.shape) != (n, self.n_components):
                raise ValueError(f"init must have shape ({n}, {self.n_components}), got {tuple(x0.shape)}")
        else:
            x0 = torch.randn(n, self.n_components, generator=gen) * self.init_scale
        with _cpu_threads(device):
            self._optimise(x0.to(device), t_np, n, device, gen)
        self.n_objects_ = n
        self.n_features_in_ = 3
        return self

    def _optimise(self, x0: torch.Tensor, t_np: np.ndarray, n: int, device: torch.device,
                  gen: torch.Generator) -> None:
        """Adam/AMSGrad on the hinge; sets ``embedding_`` and ``loss_curve_``."""
        x = x0.requires_grad_(True)
        t = torch.as_tensor(t_np, device=device)
        m = len(t_np)
        counts = torch.bincount(t[:, 0], minlength=n).float()
        if self.anchor_balanced:
            w = 1.0 / (counts[t[:, 0]] * (counts > 0).sum())
        else:
            w = torch.full((m,), 1.0 / m, device=device)
        del counts
        dense = self.gradient == "dense" or (self.gradient == "auto" and n <= DENSE_MAX_OBJECTS)
        if dense:
            ab = t[:, 0] * n + t[:, 1]
            ac = t[:, 0] * n + t[:, 2]

        def step(idx: torch.Tensor | None, weights: torch.Tensor) -> torch.Tensor:
            if dense:
                rows_ab, rows_ac = (ab, ac) if idx is None else (ab[idx], ac[idx])
                loss, grad = hinge_sq_loss_and_grad(x.detach(), rows_ab, rows_ac, weights, self.margin)
            else:
                loss, grad = hinge_sq_loss_and_grad_sparse(x.detach(), t if idx is None else t[idx], weights,
                                                           self.margin)
            x.grad = grad
            opt.step()
            return loss

        opt = torch.optim.Adam([x], lr=self.lr, amsgrad=True)
        full = self.batch_size is None or self.batch_size >= m
        sampled = self.batch_size is None and m > LARGE_TRIPLETS
        if sampled:  # the device's own generator: sampled indices never cross devices
            dev_gen = torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=gen)))
        curve: list[float] = []
        for epoch in range(self.epochs):
            if sampled:
                opt.param_groups[0]["lr"] = self.lr * 0.5 * (1 + np.cos(np.pi * epoch / self.epochs))
                idx = torch.randint(m, (LARGE_BATCH,), generator=dev_gen, device=device)
                curve.append(float(step(idx, w[idx] * (m / LARGE_BATCH))))
                continue
            if full:
                curve.append(float(step(None, w)))
                continue
            # Resampling: anchor-balanced draws triplet t with probability w_t (with replacement).
            if self.anchor_balanced:
                order = torch.multinomial(w.cpu(), m, replacement=True, generator=gen).to(device)
            else:
                order = torch.randperm(m, generator=gen).to(device)
            total = torch.zeros((), device=device)
            assert self.batch_size is not None  # no batch size is a full or a sampled fit (above)
            for start in range(0, m, self.batch_size):
                idx = order[start:start + self.batch_size]
                total += step(idx, torch.full((len(idx),), 1.0 / len(idx), device=device)) * len(idx)
            curve.append(float(total) / m)
        self.embedding_ = x.detach().cpu().numpy().astype(np.float64)
        self.loss_curve_ = curve

    def transform(self, objects: Any = None) -> np.ndarray:
        """Embedding rows of ``objects`` (indices; all objects when None). SOE is transductive."""
        check_is_fitted(self, "embedding_")
        if objects is None:
            return self.embedding_.copy()
        idx = np.asarray(objects, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_objects_):
            raise ValueError(f"object indices must lie in [0, {self.n_objects_})")
        return self.embedding_[idx]

    def fit_transform(self, X: Any, y: None = None, init: np.ndarray | None = None) -> np.ndarray:
        """Fit and return ``embedding_`` (n_objects × n_components)."""
        return self.fit(X, y, init=init).embedding_.copy()

    def score(self, X: Any, y: None = None) -> float:
        """Fraction of the triplets ``X`` (i, j, k) the embedding satisfies strictly (d_ij < d_ik)."""
        check_is_fitted(self, "embedding_")
        t = validate_triplets(X, self.n_objects_, name="X")
        return float((triplet_margins(self.embedding_, t) > 0).mean())
