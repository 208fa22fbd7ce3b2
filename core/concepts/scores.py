"""Zero-shot concept scores, patch heatmaps and a concept bottleneck.

ConceptCLIP zero-shot inference (papers/conceptclip_*.txt eqs. 10–12; METHODS.md §4), for
C classes each with a global text embedding t_c and w_c concept embeddings g_c,j:

- global score s_g(c) = t_g · cos(i_cls, t_c) + b_g (eq. 10);
- local score s_l(c) = t_l · cos(i_loc, t_loc) + b_l (eq. 11), where i_loc is the mean of the
  k patches most similar to each g_c,j (top-k regions per concept, pooled over the class's
  concepts) and t_loc the mean of the g_c,j;
- p = β softmax_c(s_l) + (1 − β) softmax_c(s_g), β = 0.5 (eq. 12).

Concept annotation (MONET / ConceptCLIP style) runs this per concept with two classes,
"present" (the concept's positive prompts) and "absent" (its negative prompts): t_c is the
mean prompt embedding, each prompt gives one g_c,j — the embedding of the tokens that name
the concept in it (the whole prompt where it names none). k = ⌈k_frac · patches⌉ (the
authors' 128 of 729 patches ≈ 0.18). Heatmap: cos(patch, t_present) − cos(patch, t_absent).

The concept bottleneck (Koh et al., 2020; ConceptCLIP §"Inherently interpretable
model") maps the concept-score vector to a target with a linear classifier; its weights
name the concepts behind each class.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data
from torch import Tensor

from core.concepts.vocabulary import Concept, _term_pattern


def zero_shot(image: Tensor, patches: Tensor, class_text: Tensor, class_concepts: Tensor, concept_mask: Tensor,
              scales: tuple[float, float, float, float], k: int, beta: float = 0.5) -> dict[str, Tensor]:
    """ConceptCLIP eqs. 10–12. ``image`` N×D (i_cls), ``patches`` N×P×D (regions i_m,i),
    ``class_text`` C×D (t_c,cls), ``class_concepts`` C×W×D (g_c,j) with ``concept_mask`` C×W
    (every class needs ≥ 1 concept), ``scales`` = (t_g, b_g, t_l, b_l), ``k`` regions per
    concept. Returns the class probabilities ``global`` p_g, ``local`` p_l and ``fused`` p (N×C)."""
    if not concept_mask.any(dim=1).all():
        raise ValueError("every class needs at least one concept embedding (eq. 11)")
    t_g, b_g, t_l, b_l = scales
    k = min(k, patches.shape[1])
    s_g = t_g * F.normalize(image, dim=-1) @ F.normalize(class_text, dim=-1).T + b_g  # eq. 10
    sim = torch.einsum("npd,cwd->ncwp", F.normalize(patches, dim=-1), F.normalize(class_concepts, dim=-1))
    top = torch.zeros_like(sim).scatter_(-1, sim.topk(k, dim=-1).indices, 1.0)  # T^k_{c,j}
    m = concept_mask.to(sim.dtype)
    w = m.sum(dim=1)  # w_c
    counts = (top * m[None, :, :, None]).sum(dim=2)  # N×C×P: how often patch i is among a concept's top k
    i_loc = torch.einsum("ncp,npd->ncd", counts, patches) / (w[None, :, None] * k)
    t_loc = (class_concepts * m[..., None]).sum(dim=1) / w[:, None]
    s_l = t_l * F.cosine_similarity(i_loc, t_loc[None], dim=-1) + b_l  # eq. 11
    p_g, p_l = s_g.softmax(dim=-1), s_l.softmax(dim=-1)
    return {"global": p_g, "local": p_l, "fused": beta * p_l + (1 - beta) * p_g}  # eq. 12


def concept_span(concept: Concept, prompt: str) -> tuple[int, int] | None:
    """Character span in ``prompt`` of the longest of the concept's terms (or its label) it holds."""
    for term in sorted({*concept.terms, concept.label.lower()}, key=len, reverse=True):
        hit = re.search(_term_pattern(term), prompt, re.IGNORECASE)
        if hit:
            return hit.start(), hit.end()
    return None


class ConceptScorer:
    """Concept scores (eqs. 10–12, two classes per concept) for image embeddings from a
    :class:`core.concepts.dual_encoder.DualEncoder`. ``sigmoid``: the model was trained with
    SigLIP's global (t_g, b_g) (``siglip``, ``conceptclip``), else CLIP's logit scale."""

    def __init__(self, model, concepts: Sequence[Concept], beta: float = 0.5, k_frac: float = 0.2,
                 sigmoid: bool = False) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        if not 0.0 < k_frac <= 1.0:
            raise ValueError(f"k_frac must be in (0, 1], got {k_frac}")
        self.concepts = list(concepts)
        self.names = [c.name for c in self.concepts]
        self.beta = beta
        self.k_frac = k_frac
        self.scales = model.zero_shot_scales(sigmoid)
        texts, spans, owner = [], [], []
        for ci, c in enumerate(self.concepts):
            for cls, prompts in enumerate((c.positive, c.negative)):
                for p in prompts:
                    texts.append(p)
                    spans.append(concept_span(c, p))
                    owner.append((ci, cls))
        g, span = model.encode_spans(texts, spans)
        w = max(len(c.positive) for c in self.concepts) if self.concepts else 0
        w = max([w, *(len(c.negative) for c in self.concepts)])
        n_c, d = len(self.concepts), g.shape[-1]
        self.text = torch.zeros(n_c, 2, d)  # t_c,cls per (concept, class)
        self.g = torch.zeros(n_c, 2, w, d)
        self.mask = torch.zeros(n_c, 2, w, dtype=torch.bool)
        fill = torch.zeros(n_c, 2, dtype=torch.long)
        for row, (ci, cls) in enumerate(owner):
            j = int(fill[ci, cls])
            self.g[ci, cls, j], self.mask[ci, cls, j] = span[row], True
            self.text[ci, cls] += g[row]
            fill[ci, cls] += 1
        self.text = F.normalize(self.text, dim=-1)
        self.pos, self.neg = self.text[:, 0], self.text[:, 1]

    def scores(self, image: Tensor, patches: Tensor) -> dict[str, np.ndarray]:
        """``image`` N×D and ``patches`` N×P×D → P(present) global, local, fused, each N×C."""
        image, patches = image.float().cpu(), patches.float().cpu()
        k = max(1, math.ceil(self.k_frac * patches.shape[1]))
        out = {kind: np.zeros((len(image), len(self.names)), dtype=np.float32) for kind in ("global", "local", "fused")}
        for c in range(len(self.names)):
            p = zero_shot(image, patches, self.text[c], self.g[c], self.mask[c], self.scales, k, self.beta)
            for kind, arr in out.items():
                arr[:, c] = p[kind][:, 0].numpy()
        return out

    def heatmaps(self, patches: Tensor, grid: tuple[int, int]) -> np.ndarray:
        """N×P×D patches → N×C×h×w maps of cos(patch, t_present) − cos(patch, t_absent)."""
        patches = patches.float().cpu()
        m = torch.einsum("npd,cd->ncp", patches, self.pos) - torch.einsum("npd,cd->ncp", patches, self.neg)
        return m.reshape(patches.shape[0], len(self.names), *grid).numpy()


class ConceptBottleneck(ClassifierMixin, BaseEstimator):
    """Concept-score vector → class: standardised scores + multinomial logistic regression.

    A scikit-learn classifier (``clone``, ``get_params``, grid search): ``fit(X, y)`` with ``X``
    the n × concepts score matrix; ``predict``/``score`` as scikit-learn; ``top_concepts(k)``
    gives, per class, the k concepts with the largest positive weights. ``concept_names``
    (optional) names the columns and fixes their number. Fitted: ``classes_``, ``coef_``
    (classes × concepts), ``scaler_``, ``clf_``, ``n_features_in_``.
    """

    def __init__(self, concept_names: Sequence[str] | None = None, C: float = 1.0,
                 random_state: int | np.random.RandomState | None = 0) -> None:
        self.concept_names = concept_names
        self.C = C
        self.random_state = random_state

    def _check_names(self, X: np.ndarray) -> None:
        shape = np.asarray(X).shape
        if self.concept_names is not None and (len(shape) != 2 or shape[1] != len(self.concept_names)):
            raise ValueError(f"concept scores must be n×{len(self.concept_names)}, got shape {shape}")

    def fit(self, X: np.ndarray, y: Sequence) -> ConceptBottleneck:
        """Standardise ``X`` and fit the logistic regression to the labels ``y``."""
        self._check_names(X)
        X, y = validate_data(self, X, y)
        check_classification_targets(y)
        if len(np.unique(y)) < 2:
            raise ValueError("the target needs at least two classes, got one class")
        self.scaler_ = StandardScaler().fit(X)
        self.clf_ = LogisticRegression(C=self.C, max_iter=2000, random_state=self.random_state).fit(
            self.scaler_.transform(X), y)
        self.classes_ = self.clf_.classes_
        coef = self.clf_.coef_
        self.coef_ = np.vstack([-coef[0], coef[0]]) if len(self.classes_) == 2 else coef
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Class of every row of concept scores."""
        check_is_fitted(self, "clf_")
        self._check_names(X)
        X = validate_data(self, X, reset=False)
        return self.clf_.predict(self.scaler_.transform(X))

    def top_concepts(self, k: int = 3) -> dict[str, list[tuple[str, float]]]:
        """Class → [(concept, weight)] with the k largest weights."""
        check_is_fitted(self, "coef_")
        names = list(self.concept_names) if self.concept_names is not None else [
            f"concept_{i}" for i in range(self.n_features_in_)]
        out = {}
        for cls, w in zip(self.classes_, self.coef_):
            order = np.argsort(-w)[:k]
            out[str(cls)] = [(names[i], float(w[i])) for i in order]
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


def heatmap_overlay(photo, heat: np.ndarray, box, alpha: float = 0.6):
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
        img = Image.fromarray((m.clip(0, 1) * 255).astype(np.uint8)).resize(size, Image.Resampling.BILINEAR)
        return np.asarray(img, dtype=np.float32) / 255.0

    pos, neg = up(h), up(-h)
    base = np.asarray(crop, dtype=np.float32)
    a_pos, a_neg = (alpha * pos)[..., None], (alpha * neg)[..., None]
    out = base * (1 - a_pos - a_neg) + np.array([255.0, 0, 0]) * a_pos + np.array([0, 0, 255.0]) * a_neg
    return Image.fromarray(out.clip(0, 255).astype(np.uint8))
