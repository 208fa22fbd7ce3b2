"""ConceptCLIP's dual alignment: sigmoid image–text (IT-Align) + region–concept (RC-Align).

ConceptCLIP — Nie et al., "An Explainable Biomedical Foundation Model via Large-Scale
Concept-Enhanced Vision-Language Pre-training" (papers/conceptclip_*.txt, Methods,
eqs. 3–9; METHODS.md §4):

- IT-Align (eq. 3, SigLIP, Zhai et al., 2023): L = −(1/B) Σ_m Σ_n log σ(z_mn (t_g x_m·y_n + b_g)),
  z = +1 for matched pairs, −1 otherwise; t_g, b_g learnable;
- RC-Align (eqs. 4–8): concept embedding g_j = mean of the text-token outputs over the
  concept's span; a_ij = cos(g_j, patch_i); S(I, T) = mean_j max_i log σ(t_l a_ij + b_l).
  Eq. 8 (−Σ z·S) is unbounded below for negatives; as METHODS.md marks **[inferred]** we use
  the stable per-pair form S_z(I, T) = mean_j log σ(z · max_i (t_l a_ij + b_l)), which equals
  eq. 7 for matched pairs (log σ is monotone) and pushes the best-matching region away
  from the concept for unmatched ones;
- total L = L_IT + α L_RC with α = 0.5 (eq. 9).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _pair_signs(like: Tensor) -> Tensor:
    """z_mn = +1 on the diagonal (matched pairs), −1 elsewhere; B×B on ``like``'s device and dtype."""
    b = like.shape[0]
    return 2.0 * torch.eye(b, device=like.device, dtype=like.dtype) - 1.0


def sigmoid_it_align(image: Tensor, text: Tensor, scale: Tensor | float, bias: Tensor | float) -> Tensor:
    """IT-Align (eq. 3): −(1/B) Σ_mn log σ(z_mn (t·x_m·y_n + b)); inputs L2-normalised B×D."""
    logits = scale * image @ text.T + bias
    return -F.logsigmoid(_pair_signs(logits) * logits).sum() / image.shape[0]


def region_concept_logits(patches: Tensor, concepts: Tensor) -> Tensor:
    """a_ij for every image m and text n: ``patches`` M×P×D and ``concepts`` N×W×D
    (L2-normalised) → M×N×P×W cosine similarities (eq. 5)."""
    return torch.einsum("mpd,nwd->mnpw", patches, concepts)


def rc_align(
    patches: Tensor, concepts: Tensor, concept_mask: Tensor, scale: Tensor | float, bias: Tensor | float
) -> Tensor:
    """RC-Align (eqs. 6–8, stable form): for each image m and text n, the best region per
    concept max_i (t a_ij + b), then log σ(z_mn ·) averaged over the text's concepts
    (``concept_mask`` N×W); −(1/B) Σ_mn. Texts without concepts are left out."""
    b = patches.shape[0]
    has = concept_mask.any(dim=1)
    if not has.any():
        return patches.new_zeros(())
    best = (scale * region_concept_logits(patches, concepts) + bias).amax(dim=2)  # M×N×W
    z = _pair_signs(best)[:, :, None]
    per = F.logsigmoid(z * best).masked_fill(~concept_mask[None], 0.0).sum(dim=2)
    s = per / concept_mask.sum(dim=1).clamp(min=1)[None]  # M×N
    return -s[:, has].sum() / b


def region_concept_score(patches: Tensor, concepts: Tensor, concept_mask: Tensor, scale: Tensor | float,
                         bias: Tensor | float) -> Tensor:
    """Eq. 7 as a score: S(I_m, T_n) = mean_j max_i log σ(t a_ij + b), M×N."""
    a = F.logsigmoid(scale * region_concept_logits(patches, concepts) + bias).amax(dim=2)
    return a.masked_fill(~concept_mask[None], 0.0).sum(dim=2) / concept_mask.sum(dim=1).clamp(min=1)[None]


class SigLIPLoss(nn.Module):
    """SigLIP sigmoid image–text loss (the ``siglip`` objective; ConceptCLIP IT-Align alone)."""

    def forward(self, image: Tensor, text: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
        """The sigmoid image–text loss of a batch."""
        return sigmoid_it_align(image, text, scale, bias)


class ConceptCLIPLoss(nn.Module):
    """ConceptCLIP total loss L_IT + α·L_RC (α = 0.5). ``scales``/``biases`` are the
    learnable (t_g, t_l) and (b_g, b_l); ``concepts`` N×W×D span embeddings, ``concept_mask`` N×W."""

    def __init__(self, alpha: float = 0.5) -> None:
        super().__init__()
        if alpha < 0:
            raise ValueError(f"alpha must be ≥ 0, got {alpha}")
        self.alpha = alpha

    def forward(
        self,
        image: Tensor,
        text: Tensor,
        patches: Tensor,
        concepts: Tensor,
        concept_mask: Tensor,
        scales: tuple[Tensor, Tensor],
        biases: tuple[Tensor, Tensor],
    ) -> Tensor:
        """L_IT on the global embeddings plus α·L_RC on patch and concept embeddings (when any concept)."""
        loss = sigmoid_it_align(image, text, scales[0], biases[0])
        if self.alpha and concepts.shape[1]:
            loss = loss + self.alpha * rc_align(patches, concepts, concept_mask, scales[1], biases[1])
        return loss
