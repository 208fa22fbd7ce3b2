"""Wound-level pooling of ragged token sets and the TriDerm-V predictor head (paper §2.2).

Tokens of all wounds in a batch are one flat T×C tensor with a segment id (0..n-1) per
token, so pooling is a handful of scatter ops with no Python loop over wounds.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


def segment_softmax(logits: Tensor, segment: Tensor, n: int) -> Tensor:
    """Softmax of ``logits`` (T,) within each segment; every segment sums to 1."""
    seg_max = torch.full((n,), float("-inf"), dtype=logits.dtype, device=logits.device)
    seg_max = seg_max.scatter_reduce(0, segment, logits.detach(), reduce="amax", include_self=True)
    e = torch.exp(logits - seg_max[segment])  # shift for stability; softmax is shift-invariant
    denom = torch.zeros(n, dtype=logits.dtype, device=logits.device).index_add_(0, segment, e)
    return e / denom[segment]


def segment_weighted_sum(tokens: Tensor, weights: Tensor, segment: Tensor, n: int) -> Tensor:
    """Σ_t w_t·x_t per segment → n×C."""
    out = tokens.new_zeros((n, tokens.shape[1]))
    return out.index_add_(0, segment, tokens * weights[:, None])


class AttentionPooling(nn.Module):
    """Gated-free attention-MIL pooling: Linear → tanh → Linear gives one logit per token,
    softmax within each wound, weighted sum (TriDerm §2.2; Ilse et al., ICML 2018)."""

    def __init__(self, dim: int, hidden: int = 128) -> None:
        super().__init__()
        self.score = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, tokens: Tensor, segment: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """(pooled n×C, attention weight per token (T,))."""
        w = segment_softmax(self.score(tokens).squeeze(-1), segment, n)
        return segment_weighted_sum(tokens, w, segment, n), w


class MeanPooling(nn.Module):
    """Mean of each wound's tokens (the ablation and the frozen baseline)."""

    def forward(self, tokens: Tensor, segment: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Each of the ``n`` wounds' mean token and every token's weight (1 / its wound's token count)."""
        counts = torch.zeros(n, dtype=tokens.dtype, device=tokens.device).index_add_(
            0, segment, torch.ones_like(segment, dtype=tokens.dtype))
        w = 1.0 / counts[segment]
        return segment_weighted_sum(tokens, w, segment, n), w


class WoundHead(nn.Module):
    """Pooling + predictor (one Linear + LayerNorm to ``dim``) → wound representation F_V."""

    def __init__(self, channels: int, dim: int = 512, pooling: str = "attention", hidden: int = 128) -> None:
        super().__init__()
        if pooling == "attention":
            self.pool: nn.Module = AttentionPooling(channels, hidden)
        elif pooling == "mean":
            self.pool = MeanPooling()
        else:
            raise ValueError(f"pooling must be 'attention' or 'mean', got {pooling!r}")
        self.predictor = nn.Sequential(nn.Linear(channels, dim), nn.LayerNorm(dim))

    def forward(self, tokens: Tensor, segment: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """(wound embeddings n×dim, attention weight per token)."""
        pooled, w = self.pool(tokens, segment, n)
        return self.predictor(pooled), w
