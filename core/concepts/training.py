"""Training the image–text model on wound crops + descriptions (MAKE, ConceptCLIP, CLIP, SigLIP;
METHODS.md §3–4): pairs, text inputs with concept spans, the trainer and its metrics.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import Tensor
from tqdm import tqdm

from core.concepts.defaults import OBJECTIVES
from core.concepts.dual_encoder import DualEncoder, Tokens, span_token_mask
from core.concepts.vocabulary import ConceptTagger, disease_aspect, sub_captions
from core.eval.protocol import patient_of
from core.losses.conceptclip import ConceptCLIPLoss, SigLIPLoss
from core.losses.make import CLIPLoss, MAKELoss
from core.losses.unimodal import CLIPUnimodalLoss
from core.runtime import autocast, grad_scaler
from core.vision.augment import crop_views

SIGMOID_OBJECTIVES = ("siglip", "conceptclip")  # trained with SigLIP's (t_g, b_g), see ConceptScorer


DISEASE_KEYS = ("rdeb_subtype", "diagnosis", "wound_type", "anatomical_site")


MAX_SUBS = 8


MAX_CONCEPTS = 6


class NotEnoughData(ValueError):
    """The workspace holds too little data for the method (too few described wounds, or patients
    that cannot be split into a training and a held-out set): a user error, reported by the job."""


# ----------------------------------------------------------------------------- data
@dataclass
class WoundPairs:
    """Wound crops with their descriptions (one row per wound)."""

    keys: list[tuple[str, int]]
    image_ids: list[str]
    patient_ids: list[str]
    descriptions: list[str]
    metadata: list[dict[str, Any]]
    crops: np.ndarray  # N×S×S×3 uint8
    boxes: np.ndarray  # N×4 crop box in photo pixels (x0, y0, x1, y1)

    def __len__(self) -> int:
        return len(self.keys)


def crop_box(bbox: list[int], width: int, height: int, margin: float = 0.25, min_side: int = 48) -> list[int]:
    """Square crop around a wound bbox with relative ``margin``, at least ``min_side`` px,
    shifted to stay inside the photo when possible."""
    x0, y0, x1, y1 = bbox
    side = max(x1 - x0, y1 - y0) * (1 + 2 * margin)
    side = int(min(max(side, min_side), max(width, height)))
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    bx = round(min(max(cx - side / 2, 0), max(width - side, 0)))
    by = round(min(max(cy - side / 2, 0), max(height - side, 0)))
    return [bx, by, bx + side, by + side]


def load_pairs(ws, size: int = 160, margin: float = 0.25) -> WoundPairs:
    """All described wounds of the workspace as square crops of ``size`` px."""
    store = ws.store
    images = {im["image_id"]: im for im in store.images()}
    patient = patient_of(list(images.values()))
    patients = {p["patient_id"]: p.get("metadata") or {} for p in store.patients()}
    wounds = [w for w in store.wounds() if (w.get("description") or "").strip()]
    if len(wounds) < 4:
        raise NotEnoughData(f"workspace {ws.root}: need at least 4 wounds with a description, found {len(wounds)}")
    keys, img_ids, pats, descs, metas, crops, boxes = [], [], [], [], [], [], []
    photo_cache: dict[str, Any] = {}
    for w in wounds:
        im = images[w["image_id"]]
        if w["image_id"] not in photo_cache:
            photo_cache.clear()
            photo_cache[w["image_id"]] = ws.load_image(w["image_id"])
        photo = photo_cache[w["image_id"]]
        box = crop_box(w["bbox"], photo.width, photo.height, margin)
        crops.append(np.asarray(photo.crop(box).resize((size, size)), dtype=np.uint8))
        boxes.append(box)
        keys.append((w["image_id"], int(w["wound_index"])))
        img_ids.append(w["image_id"])
        pid = patient[w["image_id"]]
        pats.append(pid)
        descs.append(w["description"].strip())
        metas.append({**patients.get(pid, {}), **(im.get("metadata") or {}), **(w.get("metadata") or {})})
    return WoundPairs(keys, img_ids, pats, descs, metas, np.stack(crops), np.asarray(boxes, dtype=np.int64))


def split_holdout(groups: list[str], frac: float, seed: int) -> np.ndarray:
    """Boolean held-out mask: whole groups (patients) go to the held-out side until ≈ ``frac``."""
    if not 0.0 < frac < 1.0:
        raise ValueError(f"holdout fraction must be in (0, 1), got {frac}")
    uniq = sorted(set(groups))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(uniq))
    target, held, chosen = frac * len(groups), 0, set()
    counts = {g: groups.count(g) for g in uniq}
    for i in order:
        if held >= target:
            break
        chosen.add(uniq[i])
        held += counts[uniq[i]]
    mask = np.array([g in chosen for g in groups])
    if mask.all() or not mask.any():
        raise NotEnoughData(f"cannot split {len(uniq)} patient group(s) into train and held-out sets")
    return mask


def truth_concepts(ws, keys: list[tuple[str, int]]) -> tuple[list[str], np.ndarray] | None:
    """Phantom truth concept presence (N×C, 1/0) for ``keys``, or None without truth."""
    path = Path(ws.root) / "truth" / "concepts.csv"
    if not path.is_file():
        return None
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    names = [c for c in rows[0] if c not in ("image_id", "wound_index")]
    table = {(r["image_id"], int(r["wound_index"])): [int(r[c]) for c in names] for r in rows}
    missing = [k for k in keys if k not in table]
    if missing:
        return None
    return names, np.array([table[k] for k in keys])


# ----------------------------------------------------------------------------- text inputs
@dataclass
class TextInputs:
    """Unique texts and, per wound, which rows are its raw caption / aspects / sub-captions
    and the token spans of its (non-negated) concept mentions."""

    texts: list[str]
    raw: np.ndarray  # N
    aspects: np.ndarray  # N×2 (disease, concept)
    subs: np.ndarray  # N×K, −1 = none
    spans: list[list[tuple[int, int]]] = field(default_factory=list)  # per wound: char spans


def build_text_inputs(pairs: WoundPairs, tagger: ConceptTagger, disease_keys: tuple[str, ...] = DISEASE_KEYS,
                      max_subs: int = MAX_SUBS) -> TextInputs:
    """MAKE's multi-aspect texts and ConceptCLIP's concept spans for every wound."""
    index: dict[str, int] = {}

    def row(t: str) -> int:
        return index.setdefault(t, len(index))

    raw = np.array([row(d) for d in pairs.descriptions])
    aspects = np.array([[row(disease_aspect(m, disease_keys)), row(tagger.concept_aspect(d))]
                        for d, m in zip(pairs.descriptions, pairs.metadata)])
    subs = np.full((len(pairs), max_subs), -1)
    spans = []
    for i, d in enumerate(pairs.descriptions):
        for j, s in enumerate(sub_captions(d, max_subs)):
            subs[i, j] = row(s)
        spans.append([(a, b) for _, a, b, v in tagger.mentions(d) if v == 1][:MAX_CONCEPTS])
    return TextInputs(list(index), raw, aspects, subs, spans)


# ----------------------------------------------------------------------------- caches
class TextBank:
    """Tokenised unique texts with the frozen text levels computed once."""

    def __init__(self, model: DualEncoder, texts: list[str], level: int, batch: int = 128) -> None:
        self.level = level
        self.tokens = model.text.tokenize(texts)
        self.mask = self.tokens.attention_mask
        self.hidden: Tensor | None = None
        if level > 0:
            parts = []
            with torch.no_grad():
                for i in range(0, len(texts), batch):
                    sub = Tokens(self.tokens.input_ids[i:i + batch], self.mask[i:i + batch], None)
                    parts.append(model.text_levels(sub, sub.attention_mask, 0, level).cpu())
            self.hidden = torch.cat(parts)

    def get(self, rows: Tensor) -> tuple[Tensor | Tokens, Tensor]:
        """Inputs for ``rows`` trimmed to their longest text (padding beyond is masked anyway)."""
        mask = self.mask[rows]
        t = int(mask.sum(1).max())
        mask = mask[:, :t]
        if self.hidden is None:
            return Tokens(self.tokens.input_ids[rows, :t], mask, None), mask
        return self.hidden[rows, :t], mask


def _patch_mask(crops: Tensor, patch: int, ratio: float, gen: torch.Generator) -> Tensor:
    """Masked view: a random ``ratio`` of the patch×patch cells set to grey (0.5)."""
    b, _, s, _ = crops.shape
    n = -(-s // patch)
    keep = (torch.rand(b, 1, n, n, generator=gen) >= ratio).float()
    keep = F.interpolate(keep, scale_factor=patch, mode="nearest")[..., :s, :s]
    return crops * keep + 0.5 * (1 - keep)


class ImageBank:
    """Normalised crops with the frozen image levels computed once; optional banks of
    ``n_views`` augmented or patch-masked views (for the unimodal terms)."""

    def __init__(self, model: DualEncoder, crops: np.ndarray, level: int, views: str | None = None,
                 n_views: int = 4, mask_ratio: float = 0.5, seed: int = 0, batch: int = 32) -> None:
        self.level = level
        raw = torch.from_numpy(crops).permute(0, 3, 1, 2).float() / 255.0
        self.base = self._through(model, raw, batch)
        self.views: Tensor | None = None
        if views is not None:
            gen = torch.Generator().manual_seed(seed)
            make = (lambda x: crop_views(x, gen)) if views == "augment" else \
                (lambda x: _patch_mask(x, 16, mask_ratio, gen))
            self.views = torch.stack([self._through(model, make(raw), batch) for _ in range(n_views)], dim=1)

    def _through(self, model: DualEncoder, raw: Tensor, batch: int) -> Tensor:
        x = model.image.backbone.normalize(raw).cpu().to(model.dtype)  # the cache holds the model's dtype
        if self.level == 0:
            return x
        with torch.no_grad():
            return torch.cat([model.image_levels(x[i:i + batch], 0, self.level).cpu() for i in range(0, len(x), batch)])


# ----------------------------------------------------------------------------- training
def decay_groups(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups at ``lr`` as open_clip builds them: weight decay on weight matrices only; the
    temperatures (logit scales), logit biases, linear biases and norm gains (ndim < 2) get none."""
    decay, rest = [p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay, "lr": lr, "weight_decay": weight_decay},
                        {"params": rest, "lr": lr, "weight_decay": 0.0}) if g["params"]]


@dataclass
class TrainConfig:
    """Settings of one dual-encoder training run: the objective (``make``, ``clip``, ``siglip``,
    ``conceptclip``), optimisation, unlocked tower blocks, the unimodal terms and FLIP patch dropout."""

    objective: str = "make"
    epochs: int = 30
    batch: int = 32
    lr: float = 1e-3
    tower_lr: float = 1e-4
    weight_decay: float = 0.1
    image_unlock: int = 0
    text_unlock: int = 0
    unimodal: str | None = None  # None | "augment" | "mask"
    unimodal_lambda: float = 0.5
    patch_dropout: float = 0.0  # FLIP, ViT image towers only
    make_lambda: float = 0.7
    cc_alpha: float = 0.5
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the first setting that is out of range or combines badly."""
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.unimodal not in (None, "augment", "mask"):
            raise ValueError(f"unimodal must be None, 'augment' or 'mask', got {self.unimodal!r}")
        if self.unimodal and self.objective != "clip":
            raise ValueError("the unimodal terms combine with the clip objective only")
        if not 0.0 <= self.patch_dropout < 1.0:
            raise ValueError(f"patch_dropout must be in [0, 1), got {self.patch_dropout}")
        if self.patch_dropout and self.image_unlock == 0:
            raise ValueError("patch dropout (FLIP) needs a trainable image tower (image_unlock ≠ 0)")
        if self.epochs < 1 or self.batch < 2:
            raise ValueError("epochs must be ≥ 1 and batch ≥ 2")


class Trainer:
    """One training run of a :class:`DualEncoder` on wound pairs."""

    def __init__(self, model: DualEncoder, pairs: WoundPairs, texts: TextInputs, cfg: TrainConfig) -> None:
        cfg.validate()
        self.model, self.pairs, self.texts, self.cfg = model, pairs, texts, cfg
        model.set_trainable(cfg.image_unlock, cfg.text_unlock)
        model.image.set_patch_dropout(cfg.patch_dropout)
        if cfg.objective == "conceptclip" and model.text.tokenize(["x"]).offsets is None:
            raise ValueError(f"the conceptclip objective locates concept spans by character offsets, which the "
                             f"{model.name} tokenizer does not give; use --model lite0-minilm")
        self.img_level, self.txt_level = model.frozen_levels()
        self.images = ImageBank(model, pairs.crops, self.img_level, cfg.unimodal, seed=cfg.seed)
        self.bank = TextBank(model, texts.texts, self.txt_level)
        self.clip, self.siglip = CLIPLoss(), SigLIPLoss()
        self.make = MAKELoss(lam=cfg.make_lambda)
        self.cc = ConceptCLIPLoss(alpha=cfg.cc_alpha)
        # the unimodal term's own SimCLR projector (contrastive benchmark §2.2.2), not the CLIP head
        self.uni = CLIPUnimodalLoss(model.image.width, lam=cfg.unimodal_lambda).to(model.device)
        heads = model.head_parameters() + (list(self.uni.parameters()) if cfg.unimodal else [])
        groups = decay_groups(heads, cfg.lr, cfg.weight_decay) + decay_groups(model.tower_parameters(), cfg.tower_lr,
                                                                              cfg.weight_decay)
        self.opt = torch.optim.AdamW(groups)
        self.gen = torch.Generator().manual_seed(cfg.seed)

    def _encode_rows(self, rows: Tensor, tokens: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """Encode text rows once each → (global R×D, tokens R×T×D or None, mask R×T), in ``rows`` order."""
        uniq, inv = torch.unique(rows, return_inverse=True)
        h, mask = self.bank.get(uniq)
        g, tok = self.model.encode_text_from(h, mask, self.txt_level, tokens=tokens)
        at = inv.to(g.device)
        return g[at], tok[at] if tok is not None else None, mask[inv]

    def loss(self, idx: Tensor) -> Tensor:
        """The configured objective's loss on the wound pairs ``idx`` (one batch)."""
        m, cfg, t = self.model, self.cfg, self.texts
        img, patches, _ = m.encode_image_from(self.images.base[idx], self.img_level)
        scale = m.logit_scale.exp().clamp(max=100)
        if cfg.objective == "make":
            n, k = len(idx), t.subs.shape[1]
            sub_rows = torch.from_numpy(t.subs[idx.numpy()])
            sub_mask = (sub_rows >= 0).to(img.device)
            rows = torch.cat([torch.from_numpy(t.raw[idx.numpy()]), torch.from_numpy(t.aspects[idx.numpy()]).reshape(-1),
                              sub_rows[sub_rows >= 0]])
            g, _, _ = self._encode_rows(rows)
            raw, aspects = g[:n], g[n:3 * n].view(n, 2, -1)
            subs = g.new_zeros(n, k, g.shape[-1])
            subs[sub_mask] = g[3 * n:]
            return self.make(img, patches, raw, aspects, subs, sub_mask, scale, disease_slot=0)
        g, tok, mask = self._encode_rows(torch.from_numpy(t.raw[idx.numpy()]), tokens=cfg.objective == "conceptclip")
        if cfg.objective == "clip":
            if cfg.unimodal:
                # augment: two augmented views A1(B), A2(B); mask: the image vs its masked view
                # (contrastive benchmark §2.2.2 "Augmented CL" / "Masked CL").
                views = self.images.views
                assert views is not None, "the image bank keeps views when unimodal is set"
                pick = torch.stack([torch.randperm(views.shape[1], generator=self.gen, device="cpu")[:2] for _ in idx])
                v = views[idx[:, None], pick]  # B×2×…
                first = v[:, 0] if cfg.unimodal == "augment" else self.images.base[idx]
                z1, z2 = (m.image.encode(m.follow(x), self.img_level)[0] for x in (first, v[:, 1]))  # pooled features
                return self.uni(img, g, scale, z1, z2)
            return self.clip(img, g, scale)
        scales, biases = (m.sig_scale.exp(), m.loc_scale.exp()), (m.sig_bias, m.loc_bias)
        if cfg.objective == "siglip":
            return self.siglip(img, g, scales[0], biases[0])
        all_offsets = self.bank.tokens.offsets
        # conceptclip: the constructor checked that the tokenizer gives offsets; tokens=True above
        assert all_offsets is not None and tok is not None
        offsets = all_offsets[torch.from_numpy(t.raw[idx.numpy()])]
        spans = [span_token_mask(o, t.spans[i], MAX_CONCEPTS) for o, i in zip(offsets, idx.tolist())]
        smask = torch.stack(spans)[..., : tok.shape[1]].to(tok.device) & mask[:, None, :].bool().to(tok.device)
        conc = torch.einsum("nwt,ntd->nwd", smask.float(), tok) / smask.sum(-1, keepdim=True).clamp(min=1)
        return self.cc(img, g, patches, F.normalize(conc, dim=-1), smask.any(-1), scales, biases)

    def fit(self, train_idx: np.ndarray, progress: bool = True, on_epoch=None) -> list[float]:
        """Train for ``cfg.epochs``; returns the mean loss per epoch."""
        torch.manual_seed(self.cfg.seed)
        self.model.train()
        history = []
        idx_all = torch.as_tensor(train_idx, dtype=torch.long)
        bar = tqdm(range(self.cfg.epochs), desc=f"train {self.cfg.objective}", disable=not progress, leave=False)
        scaler = grad_scaler(self.model.device)
        for epoch in bar:
            perm = idx_all[torch.randperm(len(idx_all), generator=self.gen, device="cpu")]
            losses = []
            for i in range(0, len(perm), self.cfg.batch):
                b = perm[i:i + self.cfg.batch]
                if len(b) < 2:
                    continue
                with autocast(self.model.device):  # bf16 on CUDA, a no-op on the CPU
                    loss = self.loss(b)
                self.opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(self.opt)
                scaler.update()
                losses.append(loss.item())
            history.append(float(np.mean(losses)))
            bar.set_postfix(loss=f"{history[-1]:.3f}")
            if on_epoch is not None:
                on_epoch(epoch, history)
        self.model.eval()
        return history

    @torch.no_grad()
    def embed(self, batch: int = 32) -> tuple[Tensor, Tensor, tuple[int, int]]:
        """Every wound's (global, patches, grid) from the cached frozen levels."""
        self.model.eval()
        gs, ps, grid = [], [], (0, 0)
        for i in range(0, len(self.pairs), batch):
            with autocast(self.model.device):
                g, p, grid = self.model.encode_image_from(self.images.base[i:i + batch], self.img_level)
            gs.append(g.float().cpu())
            ps.append(p.float().cpu())
        return torch.cat(gs), torch.cat(ps), grid

    @torch.no_grad()
    def embed_texts(self) -> Tensor:
        """Raw-description embeddings of every wound (N×D)."""
        out = []
        rows = torch.from_numpy(self.texts.raw)
        for i in range(0, len(rows), 64):
            with autocast(self.model.device):
                out.append(self._encode_rows(rows[i:i + 64])[0].float().cpu())
        return torch.cat(out)


# ----------------------------------------------------------------------------- evaluation
def concept_auroc(scores: np.ndarray, labels: np.ndarray, names: list[str]) -> dict[str, float]:
    """AUROC per concept (labels 1/0, −1 = unknown and skipped; concepts with one class
    are left out) and their mean under ``"mean"``."""
    out = {}
    for c, name in enumerate(names):
        y, s = labels[:, c], scores[:, c]
        keep = y >= 0
        if len(np.unique(y[keep])) == 2:
            out[name] = float(roc_auc_score(y[keep], s[keep]))
    if out:
        out["mean"] = float(np.mean(list(out.values())))
    return out


def concept_labels(ws, pairs: WoundPairs, tagger: ConceptTagger) -> tuple[list[str], np.ndarray, str]:
    """(names, N×C labels, source): phantom truth when present, else the tagger."""
    truth = truth_concepts(ws, pairs.keys)
    if truth is not None:
        return truth[0], truth[1], "phantom truth (synthetic)"
    names, rows = tagger.labels(pairs.descriptions)
    return names, np.asarray(rows), "description tagger"


def target_values(pairs: WoundPairs, column: str) -> list[str | None]:
    """The target column for each wound (wound, photo or patient metadata; None if missing)."""
    return [None if m.get(column) in (None, "") else str(m[column]) for m in pairs.metadata]

