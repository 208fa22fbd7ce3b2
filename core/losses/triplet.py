"""Triplet margin loss with in-batch hard negatives — Schroff, Kalenichenko & Philbin,
"FaceNet", CVPR 2015; batch-hard mining from Hermans, Beyer & Leibe, "In Defense of the
Triplet Loss for Person Re-Identification", 2017. Anchor = view 1 of a wound, positive =
view 2 of the same wound, negative = the closest view 2 of another wound (TriDerm Table 2b).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def hardest_negative_distances(anchor: Tensor, other: Tensor) -> Tensor:
    """For each anchor i, min_j≠i ‖a_i − o_j‖ (the hardest in-batch negative)."""
    d = torch.cdist(anchor, other)
    d = d + torch.diag(torch.full((len(d),), float("inf"), device=d.device))
    return d.min(dim=1).values


def triplet_margin(anchor: Tensor, positive: Tensor, negative_dist: Tensor, margin: float) -> Tensor:
    """Mean ReLU(‖a − p‖ − d_neg + margin)."""
    return F.relu((anchor - positive).norm(dim=1) - negative_dist + margin).mean()


class TripletLoss(nn.Module):
    """Symmetric batch-hard triplet loss on L2-normalised embeddings (margin default 0.2)."""

    def __init__(self, margin: float = 0.2) -> None:
        super().__init__()
        self.margin = margin

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        """The symmetric batch-hard triplet loss of two views' embeddings."""
        if z1.shape[0] < 2:
            raise ValueError("the triplet loss needs ≥ 2 wounds per batch for a negative")
        a, p = F.normalize(z1, dim=-1), F.normalize(z2, dim=-1)
        l12 = triplet_margin(a, p, hardest_negative_distances(a, p), self.margin)
        l21 = triplet_margin(p, a, hardest_negative_distances(p, a), self.margin)
        return 0.5 * (l12 + l21)
