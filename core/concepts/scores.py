"""Zero-shot concept scores, patch heatmaps and a concept bottleneck.

Per wound and concept (ConceptCLIP inference, papers/conceptclip_*.txt eqs. 10–12;
MONET-style positive vs negative prompts, METHODS.md §3–4):

- global score p_g = softmax(t·[cos(x, P_c), cos(x, N_c)])[0], with x the image embedding
  and P_c / N_c the mean embeddings of the concept's positive / negative prompts;
- local score p_l: the same on i_loc, the mean of the k patches most similar to P_c
  (top-k regions; k = ⌈k_frac · patches⌉);
- fused p = β p_l + (1 − β) p_g, β = 0.5;
- heatmap: cos(patch, P_c) − cos(patch, N_c) on the patch grid.

The concept bottleneck (Koh et al., 2020; ConceptCLIP §"Inherently interpretable
model") maps the concept-score vector to a target with a linear classifier; its weights
name the concepts behind each class.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from torch import Tensor

from core.concepts.vocabulary import Concept


class ConceptScorer:
    """Concept scores for image embeddings from a :class:`core.concepts.dual_encoder.DualEncoder`."""

    def __init__(self, model, concepts: Sequence[Concept], beta: float = 0.5, k_frac: float = 0.2,
                 scale: float | None = None) -> None:  # noqa: ANN001 — DualEncoder
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        if not 0.0 < k_frac <= 1.0:
            raise ValueError(f"k_frac must be in (0, 1], got {k_frac}")
        self.concepts = list(concepts)
        self.names = [c.name for c in self.concepts]
        self.beta = beta
        self.k_frac = k_frac
        self.scale = float(scale) if scale is not None else float(model.logit_scale.detach().exp().clamp(max=100))
        pos, neg = [], []
        for c in self.concepts:
            pos.append(F.normalize(model.encode_texts(list(c.positive)).mean(0), dim=-1))
            neg.append(F.normalize(model.encode_texts(list(c.negative)).mean(0), dim=-1))
        self.pos = torch.stack(pos)  # C×D
        self.neg = torch.stack(neg)

    def _pair_prob(self, x: Tensor) -> Tensor:
        """x: N×C×D (per concept) or N×D → P(present) N×C = σ(t·(cos P − cos N))."""
        if x.ndim == 2:
            sp, sn = x @ self.pos.T, x @ self.neg.T
        else:
            sp, sn = (x * self.pos).sum(-1), (x * self.neg).sum(-1)
        return torch.sigmoid(self.scale * (sp - sn))  # = softmax over the two prompts

    def scores(self, image: Tensor, patches: Tensor) -> dict[str, np.ndarray]:
        """``image`` N×D and ``patches`` N×P×D (normalised) → global, local, fused N×C."""
        image, patches = image.float(), patches.float()
        p_g = self._pair_prob(image)
        k = max(1, math.ceil(self.k_frac * patches.shape[1]))
        sim = torch.einsum("npd,cd->ncp", patches, self.pos)
        idx = sim.topk(k, dim=-1).indices  # N×C×k
        gathered = torch.gather(patches[:, None].expand(-1, len(self.names), -1, -1), 2,
                                idx[..., None].expand(-1, -1, -1, patches.shape[-1]))
        loc = F.normalize(gathered.mean(2), dim=-1)
        p_l = self._pair_prob(loc)
        fused = self.beta * p_l + (1 - self.beta) * p_g
        return {"global": p_g.numpy(), "local": p_l.numpy(), "fused": fused.numpy()}

    def heatmaps(self, patches: Tensor, grid: tuple[int, int]) -> np.ndarray:
        """N×P×D patches → N×C×h×w maps of cos(patch, P_c) − cos(patch, N_c)."""
        patches = patches.float()
        m = torch.einsum("npd,cd->ncp", patches, self.pos) - torch.einsum("npd,cd->ncp", patches, self.neg)
        return m.reshape(patches.shape[0], len(self.names), *grid).numpy()


class ConceptBottleneck:
    """Concept-score vector → class: standardised scores + multinomial logistic regression.

    ``fit(S, y)``; ``predict``/``score`` as scikit-learn; ``top_concepts(k)`` gives, per
    class, the k concepts with the largest positive weights. Fitted: ``classes_``,
    ``coef_`` (classes × concepts), ``scaler_``, ``clf_``.
    """

    def __init__(self, concept_names: Sequence[str], C: float = 1.0, seed: int = 0) -> None:
        self.concept_names = list(concept_names)
        self.C = C
        self.seed = seed

    def _check(self, S: np.ndarray) -> np.ndarray:
        S = np.asarray(S, dtype=np.float64)
        if S.ndim != 2 or S.shape[1] != len(self.concept_names):
            raise ValueError(f"concept scores must be n×{len(self.concept_names)}, got shape {S.shape}")
        return S

    def fit(self, S: np.ndarray, y: Sequence) -> "ConceptBottleneck":
        S = self._check(S)
        y = np.asarray(y)
        if len(y) != len(S):
            raise ValueError(f"{len(S)} score rows but {len(y)} labels")
        if len(np.unique(y)) < 2:
            raise ValueError("the target needs at least two classes")
        self.scaler_ = StandardScaler().fit(S)
        self.clf_ = LogisticRegression(C=self.C, max_iter=2000, random_state=self.seed).fit(self.scaler_.transform(S), y)
        self.classes_ = self.clf_.classes_
        coef = self.clf_.coef_
        self.coef_ = np.vstack([-coef[0], coef[0]]) if len(self.classes_) == 2 else coef
        return self

    def predict(self, S: np.ndarray) -> np.ndarray:
        return self.clf_.predict(self.scaler_.transform(self._check(S)))

    def score(self, S: np.ndarray, y: Sequence) -> float:
        return float(np.mean(self.predict(S) == np.asarray(y)))

    def top_concepts(self, k: int = 3) -> dict[str, list[tuple[str, float]]]:
        """Class → [(concept, weight)] with the k largest weights."""
        out = {}
        for cls, w in zip(self.classes_, self.coef_):
            order = np.argsort(-w)[:k]
            out[str(cls)] = [(self.concept_names[i], float(w[i])) for i in order]
        return out


# ----------------------------------------------------------------------------- reading a concepts run
def wound_row(emb: dict, image_id: str, wound_index: int) -> int | None:
    """Row of wound (``image_id``, ``wound_index``) in a run's arrays from
    :func:`core.runtime.load_embeddings`, or None when the run has no such wound."""
    keys = emb.get("wound_keys") or []
    try:
        return keys.index((str(image_id), int(wound_index)))
    except ValueError:
        return None


def top_concepts(emb: dict, row: int, k: int = 5) -> list[dict]:
    """The ``k`` concepts with the highest fused score for wound ``row`` of a ``concepts`` run:
    ``[{concept, fused, global, local}]``, highest fused first (ties keep vocabulary order)."""
    names = [str(n) for n in emb["concept_names"]]
    fused = np.asarray(emb["concept_fused"][row], dtype=np.float64)
    order = np.argsort(-fused, kind="stable")[:max(0, k)]
    return [{"concept": names[c], "fused": float(fused[c]), "global": float(emb["concept_global"][row][c]),
             "local": float(emb["concept_local"][row][c])} for c in order]


def heatmap_overlay(photo, heat: np.ndarray, box, alpha: float = 0.6):  # noqa: ANN001 — PIL image, crop box
    """A concept heatmap (h×w, cos P − cos N on the wound crop's patch grid) drawn over the crop
    ``box`` (x0, y0, x1, y1 in photo pixels, as the run computed it; parts outside the photo are
    black, as in the crop the model saw). Red = evidence for the concept, blue = against,
    opacity ∝ |value| / max |value|. Returns an RGB PIL image of the crop's size."""
    from PIL import Image

    crop = photo.convert("RGB").crop(tuple(int(v) for v in box))
    h = np.nan_to_num(np.asarray(heat, dtype=np.float32))
    peak = float(np.abs(h).max())
    h = h / peak if peak > 0 else np.zeros_like(h)
    size = crop.size

    def up(m: np.ndarray) -> np.ndarray:  # patch grid → crop pixels, in [0, 1]
        img = Image.fromarray((m.clip(0, 1) * 255).astype(np.uint8)).resize(size, Image.BILINEAR)
        return np.asarray(img, dtype=np.float32) / 255.0

    pos, neg = up(h), up(-h)
    base = np.asarray(crop, dtype=np.float32)
    a_pos, a_neg = (alpha * pos)[..., None], (alpha * neg)[..., None]
    out = base * (1 - a_pos - a_neg) + np.array([255.0, 0, 0]) * a_pos + np.array([0, 0, 255.0]) * a_neg
    return Image.fromarray(out.clip(0, 255).astype(np.uint8))
