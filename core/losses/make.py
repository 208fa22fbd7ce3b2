"""CLIP InfoNCE and MAKE's multi-aspect knowledge-enhanced contrastive loss.

MAKE — Yan et al., "Multi-Aspect Knowledge-Enhanced Vision-Language Pretraining for
Zero-shot Dermatological Assessment" (papers/make_*.txt §2; METHODS.md §3):

- multi-aspect contrastive (MKCL, eqs. 3–4): symmetric InfoNCE between each image and
  *each* of its K+3 texts — raw caption r, disease aspect d, concept aspect c, sub-captions
  s_1..s_K — with the same text slot of the other images as negatives;
- fine-grained alignment (SLRA, eqs. 5–6): z_i = max(e_i^r · patchesᵀ, 0),
  e_i^k = Σ_n v_in z_in / Σ_n z_in, then InfoNCE between every sub-caption and the e^k of
  the batch;
- diagnosis-guided weights (eq. 7): w_ij = (e_i^d · e_i^{s_j}) / max_j (e_i^d · e_i^{s_j}),
  no gradient, weight 1 for r, d and c; L = L_mkcl + λ L_slra with λ = 0.7 (eq. 8).

Eqs. 3, 4 and 6 are *sums* over samples and texts, so λ weighs the two sums. We divide both
by one common count (the valid image–text pairs of L_mkcl): averaging each term over its
own count would multiply λ by (#mkcl pairs / #sub-captions), e.g. by (K+3)/K. With no
aspect texts, no sub-captions and unit weights MAKE is exactly CLIP's symmetric InfoNCE
(Radford et al., 2021). The printed eqs. 3–4 sum over images in both denominators; we use
the standard symmetric form (METHODS.md §3).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_EPS = 1e-6


def clip_infonce(image: Tensor, text: Tensor, logit_scale: Tensor | float) -> Tensor:
    """CLIP's symmetric InfoNCE (Radford et al., 2021): row i of ``image`` (N×D) and of
    ``text`` (N×D), both L2-normalised, are the positive pair; ½(CE_i→t + CE_t→i)."""
    logits = logit_scale * image @ text.T
    target = torch.arange(image.shape[0], device=image.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def multi_aspect_contrastive(
    image: Tensor, texts: Tensor, mask: Tensor, weights: Tensor, logit_scale: Tensor | float, mean: bool = True
) -> Tensor:
    """MAKE L_mkcl (eqs. 3–4). ``image`` N×D; ``texts`` N×J×D (slot j of every sample);
    ``mask`` N×J bool (text exists); ``weights`` N×J. Masked texts are neither anchors
    nor negatives. Returns the weighted sum over valid pairs, divided by their count when ``mean``."""
    n, j_slots, _ = texts.shape
    target = torch.arange(n, device=image.device)
    total, count = image.new_zeros(()), mask.sum()
    for j in range(j_slots):
        valid = mask[:, j]
        if not valid.any():
            continue
        logits = logit_scale * image @ texts[:, j].T  # [image i, text n of slot j]
        i2t = F.cross_entropy(logits.masked_fill(~valid[None, :], float("-inf")), target, reduction="none")
        t2i = F.cross_entropy(logits.T, target, reduction="none")
        per = 0.5 * (i2t + t2i)
        total = total + (weights[valid, j] * per[valid]).sum()
    return total / count.clamp(min=1) if mean else total


def knowledge_enhanced_visual(patches: Tensor, raw: Tensor) -> Tensor:
    """MAKE eq. 5: e_i^k = Σ_n v_in z_in / Σ_n z_in with z_i = max(e_i^r · v_iᵀ, 0);
    ``patches`` N×P×D and ``raw`` N×D normalised; returns N×D, L2-normalised."""
    z = torch.einsum("npd,nd->np", patches, raw).clamp(min=0)
    ek = torch.einsum("np,npd->nd", z, patches) / (z.sum(dim=1, keepdim=True) + _EPS)
    return F.normalize(ek, dim=-1)


def slra(ek: Tensor, subs: Tensor, mask: Tensor, weights: Tensor, logit_scale: Tensor | float,
         mean: bool = True) -> Tensor:
    """MAKE L_slra (eq. 6): InfoNCE from each sub-caption e_i^{s_j} (``subs`` N×K×D,
    ``mask`` N×K) to the knowledge-enhanced visual embeddings ``ek`` (N×D) of the batch,
    weighted by ``weights`` (N×K): the sum over valid sub-captions, divided by their number
    when ``mean`` (0 when K = 0)."""
    n, k, _ = subs.shape
    if k == 0 or not mask.any():
        return ek.new_zeros(())
    logits = logit_scale * torch.einsum("nkd,md->nkm", subs, ek)  # [sample, sub-caption, image]
    target = torch.arange(n, device=ek.device)[:, None].expand(n, k)
    per = F.cross_entropy(logits.reshape(n * k, n), target.reshape(-1), reduction="none").view(n, k)
    total = (weights * per)[mask].sum()
    return total / mask.sum() if mean else total


def diagnosis_weights(disease: Tensor, subs: Tensor, mask: Tensor) -> Tensor:
    """MAKE eq. 7: w_ij = (e_i^d · e_i^{s_j}) / max_j (e_i^d · e_i^{s_j}), no gradient.
    Similarities are clamped at 0 so that a weight stays in [0, 1]."""
    with torch.no_grad():
        sim = torch.einsum("nd,nkd->nk", disease, subs).clamp(min=0).masked_fill(~mask, 0.0)
        return sim / sim.max(dim=1, keepdim=True).values.clamp(min=_EPS)


class CLIPLoss(nn.Module):
    """CLIP symmetric InfoNCE as a module (the ``clip`` objective)."""

    def forward(self, image: Tensor, text: Tensor, logit_scale: Tensor) -> Tensor:
        """The symmetric CLIP InfoNCE loss of a batch."""
        return clip_infonce(image, text, logit_scale)


class MAKELoss(nn.Module):
    """MAKE total loss (L_mkcl + λ·L_slra) / #pairs with diagnosis-guided weights (λ = 0.7;
    both sums share the divisor, so λ is the paper's).

    Inputs are L2-normalised: ``image`` N×D, ``patches`` N×P×D, ``raw`` N×D,
    ``aspects`` N×A×D (A knowledge-aspect texts, e.g. disease and concept; may be A = 0),
    ``subs`` N×K×D with ``sub_mask`` N×K. ``disease_slot`` indexes the disease aspect in
    ``aspects`` for the weights; None or ``use_weights=False`` gives unit weights.
    """

    def __init__(self, lam: float = 0.7, use_weights: bool = True) -> None:
        super().__init__()
        if lam < 0:
            raise ValueError(f"lam must be ≥ 0, got {lam}")
        self.lam = lam
        self.use_weights = use_weights

    def forward(
        self,
        image: Tensor,
        patches: Tensor,
        raw: Tensor,
        aspects: Tensor,
        subs: Tensor,
        sub_mask: Tensor,
        logit_scale: Tensor,
        disease_slot: int | None = 0,
    ) -> Tensor:
        """The MAKE loss of a batch (see the class docstring)."""
        n, a = aspects.shape[:2]
        if self.use_weights and disease_slot is not None and a > disease_slot:
            w_sub = diagnosis_weights(aspects[:, disease_slot], subs, sub_mask)
        else:
            w_sub = sub_mask.to(image.dtype)
        texts = torch.cat([raw[:, None], aspects, subs], dim=1)
        mask = torch.cat([torch.ones(n, 1 + a, dtype=torch.bool, device=image.device), sub_mask], dim=1)
        weights = torch.cat([torch.ones(n, 1 + a, device=image.device, dtype=image.dtype), w_sub], dim=1)
        loss = multi_aspect_contrastive(image, texts, mask, weights, logit_scale, mean=False)
        if self.lam and subs.shape[1]:
            ek = knowledge_enhanced_visual(patches, raw)
            loss = loss + self.lam * slra(ek, subs, sub_mask, w_sub, logit_scale, mean=False)
        return loss / mask.sum()  # one common count for both sums: λ stays the paper's (eq. 8)
