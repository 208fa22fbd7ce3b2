"""VICReg — Bardes, Ponce & LeCun, "VICReg: Variance-Invariance-Covariance Regularization
for Self-Supervised Learning", ICLR 2022; the TriDerm-V objective (TriDerm §2.2 eq. 1,
λ = μ = 25, ν = 1; METHODS.md §1). Term definitions follow the official implementation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def invariance_loss(z1: Tensor, z2: Tensor) -> Tensor:
    """s(Z, Z'): mean squared error between paired embeddings."""
    return F.mse_loss(z1, z2)


def variance_loss(z: Tensor, eps: float = 1e-4, gamma: float = 1.0) -> Tensor:
    """v(Z): mean over dimensions of ReLU(γ − sqrt(Var_batch + ε)) (unbiased variance)."""
    std = torch.sqrt(z.var(dim=0) + eps)
    return F.relu(gamma - std).mean()


def covariance_loss(z: Tensor) -> Tensor:
    """c(Z): sum of squared off-diagonal entries of the batch covariance, divided by D."""
    n, d = z.shape
    zc = z - z.mean(dim=0)
    cov = (zc.T @ zc) / (n - 1)
    off = cov - torch.diag(torch.diagonal(cov))
    return off.pow(2).sum() / d


class VICRegLoss(nn.Module):
    """λ·s(Z, Z') + μ·[v(Z) + v(Z')]/2 + ν·[c(Z) + c(Z')] on two views' embeddings (N×D, N ≥ 2)."""

    def __init__(self, lambda_: float = 25.0, mu: float = 25.0, nu: float = 1.0, eps: float = 1e-4) -> None:
        super().__init__()
        self.lambda_, self.mu, self.nu, self.eps = lambda_, mu, nu, eps

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        """The VICReg loss of two views' embeddings."""
        if z1.shape != z2.shape or z1.ndim != 2 or z1.shape[0] < 2:
            raise ValueError(f"VICReg needs two N×D batches with N ≥ 2, got {tuple(z1.shape)} and {tuple(z2.shape)}")
        s = invariance_loss(z1, z2)
        v = 0.5 * (variance_loss(z1, self.eps) + variance_loss(z2, self.eps))
        c = covariance_loss(z1) + covariance_loss(z2)
        return self.lambda_ * s + self.mu * v + self.nu * c
