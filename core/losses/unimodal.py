"""SimCLR NT-Xent and the CLIP + unimodal combination of the contrastive benchmark.

NT-Xent — Chen et al., "A Simple Framework for Contrastive Learning of Visual
Representations" (SimCLR, 2020): for 2N views, each view's positive is its partner view,
the other 2N−2 views are negatives, temperature τ. The contrastive benchmark
(papers/contrastive_benchmark_*.txt §2.2.2, "Augmented CL" / "Masked CL"; METHODS.md §5)
trains λ·L_clip + (1−λ)·L_uni, the second view being an augmentation or a patch-masked copy.
As in SimCLR, the unimodal term has its own projection head g(·) on the image encoder's
representation — not the CLIP image projection, which stays the image–text alignment's own.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.losses.make import clip_infonce


def nt_xent(z1: Tensor, z2: Tensor, temperature: float = 0.1) -> Tensor:
    """SimCLR NT-Xent over two views ``z1``, ``z2`` (N×D, normalised inside)."""
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=-1)
    sim = (z @ z.T / temperature).fill_diagonal_(float("-inf"))
    target = torch.arange(2 * n, device=z.device).roll(n)  # view i ↔ view i + n
    return F.cross_entropy(sim, target)


class SimCLRProjector(nn.Module):
    """SimCLR's projection head g(·) (Chen et al., 2020, §2.1): Linear–ReLU–Linear."""

    def __init__(self, in_dim: int, out_dim: int = 128, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or in_dim
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))

    def forward(self, x: Tensor) -> Tensor:
        """Project the embeddings ``x``."""
        return self.net(x)


class CLIPUnimodalLoss(nn.Module):
    """λ·CLIP InfoNCE(image, text) + (1−λ)·NT-Xent(g(view1), g(view2)); λ = 1 is plain CLIP.

    ``view1``/``view2`` are the image encoder's pooled features (``in_dim``) of the two views;
    g is this loss's own :class:`SimCLRProjector` (train its parameters with the model's)."""

    def __init__(self, in_dim: int, lam: float = 0.5, temperature: float = 0.1, out_dim: int = 128) -> None:
        super().__init__()
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        self.lam = lam
        self.temperature = temperature
        self.projector = SimCLRProjector(in_dim, out_dim)

    def forward(self, image: Tensor, text: Tensor, logit_scale: Tensor, view1: Tensor, view2: Tensor) -> Tensor:
        """The combined CLIP and NT-Xent loss of a batch."""
        loss = self.lam * clip_infonce(image, text, logit_scale)
        if self.lam < 1.0:
            loss = loss + (1.0 - self.lam) * nt_xent(self.projector(view1), self.projector(view2), self.temperature)
        return loss
