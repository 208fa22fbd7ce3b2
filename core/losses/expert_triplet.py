"""Ordinal hinge on the expert's triplet judgments — the SOE loss of Terada & von Luxburg,
"Local Ordinal Embedding", ICML 2014 (TriDerm §2.3 uses it for text), applied here to image
embeddings: for "i is closer to j than to k", L = max(0, δ + ‖z_i − z_j‖² − ‖z_i − z_k‖²) on
L2-normalised embeddings (``normalize=True``, δ on the scale of squared chord distances 0…4),
or on the raw embeddings, whose scale the margin then sets (a linear metric, as in SOE).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class ExpertTripletLoss(nn.Module):
    """Mean hinge over oriented triplets ``[i, j, k]`` (row indices of ``z``, "expert chose j")."""

    def __init__(self, margin: float = 0.1, normalize: bool = True) -> None:
        super().__init__()
        if margin < 0:
            raise ValueError(f"margin must be ≥ 0, got {margin}")
        self.margin = margin
        self.normalize = normalize

    def forward(self, z: Tensor, triplets: Tensor) -> Tensor:
        """The mean hinge loss of the oriented ``triplets`` on ``z`` (L2-normalised first when set).

        Rows are gathered with ``index_select``: its gradient sums repeated rows in a fixed order, where
        ``z[i]``'s (``index_put_`` with accumulation) sums them in thread order on a multi-core CPU, so the
        same seed gave a different model from run to run."""
        if self.normalize:
            z = F.normalize(z, dim=1)
        z_i, z_j, z_k = (z.index_select(0, rows) for rows in triplets.unbind(1))
        return F.relu(self.margin + (z_i - z_j).pow(2).sum(1) - (z_i - z_k).pow(2).sum(1)).mean()
