"""Nested (two-level) contrastive loss of SLIMP.

SLIMP — "Skin lesion phenotyping via nested multi-modal contrastive learning"
(papers/slimp_*.txt §3.1, Algorithm 1 and appendix C, eqs. 1–3; METHODS.md §2).
In this product a SLIMP *lesion* is a wound and a *patient* is the store's patient.

- inner (lesion) term, eq. 1: for each patient p, symmetric InfoNCE between the image
  embeddings {w_p^l} and the wound-metadata embeddings {h_p^l} of that patient's own
  wounds only — the negatives of a wound are the *other wounds of the same patient*.
  A patient with a single wound contributes 0 (its only candidate is the positive).
- outer (patient) term, eq. 2: symmetric InfoNCE between the lesion-phenotype vectors
  z_p and the patient-metadata embeddings x_p across the patients of a batch.
- total, eq. 3: λ · mean_p L_inner^p + (1 − λ) · L_outer, λ = 0.9.

Similarities are cosine similarities divided by a temperature τ. The paper does not give
τ; METHODS.md §2 marks it **[inferred]**: learnable, initialised like CLIP at 0.07 and
stored as log(1/τ) (logit scale), clamped to ≤ 100 as in CLIP. The printed equations
repeat the first direction in the second term; this is the standard symmetric form.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MAX_LOGIT_SCALE = 100.0


def symmetric_infonce(a: Tensor, b: Tensor, logit_scale: Tensor) -> Tensor:
    """Symmetric InfoNCE between row-aligned embeddings ``a`` (n×d) and ``b`` (n×d).

    Row i of ``a`` and row i of ``b`` are the positive pair; every other row of the
    other modality is a negative. Returns ½ (CE(a→b) + CE(b→a)) averaged over rows
    (SLIMP eqs. 1–2). A single pair (n = 1) gives exactly 0.
    """
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"a and b must be n×d with the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] == 0:
        return a.new_zeros(())
    logits = logit_scale * F.normalize(a, dim=1) @ F.normalize(b, dim=1).T
    target = torch.arange(a.shape[0], device=a.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def inner_losses(w: Tensor, h: Tensor, patient_index: Tensor, n_patients: int, logit_scale: Tensor) -> Tensor:
    """Per-patient inner (lesion-level) loss L_inner^p, SLIMP eq. 1.

    ``w``, ``h``: wound image / wound-metadata embeddings (n_w×d); ``patient_index``:
    for each wound, its patient's position 0..n_patients−1 in the batch. Returns a
    vector of n_patients losses; a patient with fewer than two wounds gets 0. Each
    patient's term only sees that patient's wounds.
    """
    if patient_index.shape != (w.shape[0],):
        raise ValueError(f"patient_index must have one entry per wound ({w.shape[0]}), got {tuple(patient_index.shape)}")
    out = []
    for p in range(n_patients):
        sel = patient_index == p
        out.append(symmetric_infonce(w[sel], h[sel], logit_scale))
    return torch.stack(out) if out else w.new_zeros(0)


def outer_loss(z: Tensor, x: Tensor, logit_scale: Tensor) -> Tensor:
    """Outer (patient-level) loss L_outer, SLIMP eq. 2: symmetric InfoNCE between the
    lesion-phenotype vectors z_p and patient-metadata embeddings x_p of a batch."""
    return symmetric_infonce(z, x, logit_scale)


def nested_total(inner: Tensor, outer: Tensor, lam: float) -> Tensor:
    """SLIMP eq. 3: λ · mean_p L_inner^p + (1 − λ) · L_outer."""
    return lam * inner.mean() + (1.0 - lam) * outer


class NestedContrastiveLoss(nn.Module):
    """SLIMP nested contrastive loss with a learnable temperature (appendix C, eq. 3).

    Args:
        lam: weight λ of the inner term (paper: 0.9).
        temperature: initial τ (CLIP init 0.07; the paper does not state it).
        learnable_temperature: learn log(1/τ) jointly with the encoders.
    """

    def __init__(self, lam: float = 0.9, temperature: float = 0.07, learnable_temperature: bool = True) -> None:
        super().__init__()
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.lam = lam
        self.log_logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / temperature)), requires_grad=learnable_temperature)

    @property
    def logit_scale(self) -> Tensor:
        """1/τ, clamped to at most 100 as in CLIP."""
        return self.log_logit_scale.exp().clamp(max=MAX_LOGIT_SCALE)

    def forward(self, w: Tensor, h: Tensor, patient_index: Tensor, z: Tensor, x: Tensor) -> dict[str, Tensor]:
        """Return ``{"loss", "inner", "outer"}`` for one batch of B = len(z) patients."""
        scale = self.logit_scale
        inner = inner_losses(w, h, patient_index, z.shape[0], scale)
        outer = outer_loss(z, x, scale)
        return {"loss": nested_total(inner, outer, self.lam), "inner": inner.mean(), "outer": outer}
