"""InfoNCE between two augmented views — van den Oord, Li & Vinyals, "Representation
Learning with Contrastive Predictive Coding", 2018; the symmetric two-view form used by
SimCLR (Chen et al., ICML 2020) and the TriDerm ablation's contrastive baseline (Table 2b).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def info_nce(query: Tensor, keys: Tensor, temperature: float) -> Tensor:
    """Cross-entropy of cosine similarities / τ where key i is the positive of query i
    and the other keys of the batch are its negatives."""
    q, k = F.normalize(query, dim=-1), F.normalize(keys, dim=-1)
    logits = q @ k.T / temperature
    return F.cross_entropy(logits, torch.arange(len(q), device=q.device))


class InfoNCELoss(nn.Module):
    """Symmetric InfoNCE: [InfoNCE(Z→Z') + InfoNCE(Z'→Z)] / 2, temperature τ (default 0.1)."""

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = temperature

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        """The symmetric InfoNCE loss of two views' embeddings."""
        return 0.5 * (info_nce(z1, z2, self.temperature) + info_nce(z2, z1, self.temperature))
