"""SLIMP nested multi-modal model for wounds: images + wound metadata + patient metadata.

SLIMP — "Skin lesion phenotyping via nested multi-modal contrastive learning"
(papers/slimp_*.txt §3, appendix D; METHODS.md §2). A SLIMP *lesion* is a wound, a
*patient* is the store's patient (a photo without patient gets a pseudo-patient
``image:<image_id>`` with no metadata).

- image encoder: a registry backbone (``core.vision.backbones``) on the wound's crop (its mask's
  bounding box, padded to a square), feature map pooled over the wound's own cells
  (mask-weighted mean), then a linear projection → w;
- wound-metadata encoder (:class:`core.nested.tabular.TabularEncoder`) → h; the wound record is the
  wound's metadata plus its photo's metadata (photo columns prefixed ``photo.``);
- patient-metadata encoder → x;
- z_p = Linear(mean over the patient's wounds of concat(w, h)).

Variants for ablations: without wound metadata z_p = Linear(mean_l w_p^l) and only the
outer term is trained; without patient metadata the model is SLIMP's *flat* variant
(one InfoNCE between images and wound metadata across all wounds of a batch).
"""
from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from annotations.infra.fileio import atomic_write
from core.eval.protocol import patient_of
from core.losses.nested import NestedContrastiveLoss
from core.nested.tabular import TabularBatch, TabularEncoder, TabularSchema, is_missing
from core.runtime import autocast

CROP_PAD = 0.15
MIN_CROP_PX = 16


# ---------------------------------------------------------------- data

@dataclass
class NestedData:
    """Wounds grouped by patient, with their metadata records (workspace order)."""

    wound_keys: list[tuple[str, int]]
    wound_bbox: list[list[int]]
    wound_records: list[dict[str, Any]]
    wound_patient: np.ndarray  # index into patient_ids, one per wound
    patient_ids: list[str]
    patient_records: list[dict[str, Any]]
    image_sha: dict[str, str]

    @property
    def patient_wounds(self) -> list[np.ndarray]:
        """Wound indices of each patient."""
        return [np.flatnonzero(self.wound_patient == p) for p in range(len(self.patient_ids))]

    def labels(self, column: str) -> tuple[np.ndarray, str]:
        """Per-wound labels (``None`` when missing) of a wound/photo or patient column and its level."""
        if any(column in r for r in self.wound_records):
            values = [r.get(column) for r in self.wound_records]
            level = "wound"
        elif any(column in r for r in self.patient_records):
            values = [self.patient_records[p].get(column) for p in self.wound_patient]
            level = "patient"
        else:
            known = sorted({k for r in self.wound_records + self.patient_records for k in r})
            raise KeyError(f"--target {column!r} is neither a wound, photo nor patient metadata column; known: {known}")
        return np.array([None if is_missing(v) else str(v).strip() for v in values], dtype=object), level


def load_nested_data(ws: Any) -> NestedData:
    """Collect every wound of the workspace with its patient and metadata."""
    images = {im["image_id"]: im for im in ws.store.images()}
    patient = patient_of(list(images.values()))
    patients = {p["patient_id"]: p.get("metadata") or {} for p in ws.store.patients()}
    keys, boxes, records, owner = [], [], [], []
    patient_ids: list[str] = []
    patient_pos: dict[str, int] = {}
    for wd in ws.store.wounds():
        image = images.get(wd["image_id"])
        if image is None:
            raise ValueError(f"wound {wd['image_id']}#{wd['wound_index']} refers to an unknown image")
        pid = patient[wd["image_id"]]
        if pid not in patient_pos:
            patient_pos[pid] = len(patient_ids)
            patient_ids.append(pid)
        rec = dict(wd.get("metadata") or {})
        rec.update({f"photo.{k}": v for k, v in (image.get("metadata") or {}).items()})
        keys.append((wd["image_id"], int(wd["wound_index"])))
        boxes.append([int(v) for v in wd["bbox"]])
        records.append(rec)
        owner.append(patient_pos[pid])
    if not keys:
        raise ValueError(f"the workspace {ws.root} has no wounds (import masks first)")
    return NestedData(keys, boxes, records, np.array(owner, dtype=np.int64), patient_ids,
                      [dict(patients.get(pid, {})) for pid in patient_ids],
                      {k: str(v.get("sha256", "")) for k, v in images.items()})


def crop_box(bbox: Sequence[int], width: int, height: int, pad: float = CROP_PAD) -> tuple[int, int, int, int]:
    """Square box around ``bbox`` (x0, y0, x1, y1; exclusive ends) padded by ``pad`` of its
    longer side on each side, at least MIN_CROP_PX, shifted/clipped to stay in the image."""
    x0, y0, x1, y1 = bbox
    side = max(x1 - x0, y1 - y0, 1)
    side = min(max(int(round(side * (1 + 2 * pad))), MIN_CROP_PX), width, height)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    left = int(min(max(round(cx - side / 2), 0), width - side))
    top = int(min(max(round(cy - side / 2), 0), height - side))
    return left, top, left + side, top + side


def wound_crops(ws: Any, data: NestedData, size: int) -> tuple[list[Image.Image], Tensor]:
    """Square crops (PIL, size×size) of every wound and its own mask (n×size×size float)."""
    crops: list[Image.Image] = []
    masks = torch.zeros(len(data.wound_keys), size, size)
    cache: dict[str, tuple[Image.Image, np.ndarray]] = {}
    for i, ((image_id, index), bbox) in enumerate(zip(data.wound_keys, data.wound_bbox)):
        if image_id not in cache:
            cache = {image_id: (ws.load_image(image_id), ws.load_mask(image_id))}
        image, labels = cache[image_id]
        box = crop_box(bbox, image.width, image.height)
        crops.append(image.crop(box).resize((size, size), Image.Resampling.BILINEAR))
        own = Image.fromarray(((labels == index) * 255).astype(np.uint8)).crop(box).resize((size, size), Image.Resampling.BILINEAR)
        masks[i] = torch.from_numpy(np.asarray(own, dtype=np.float32) / 255.0)
    return crops, masks


def masked_pool(fmap: Tensor, masks: Tensor) -> Tensor:
    """Mean of a B×C×h×w feature map over the wound's cells (mask area-averaged to the
    grid as weights); the whole crop when the wound covers no cell."""
    weights = F.adaptive_avg_pool2d(masks.unsqueeze(1).to(fmap.dtype), (fmap.shape[-2], fmap.shape[-1]))
    total = weights.sum(dim=(2, 3), keepdim=True)
    weights = torch.where(total > 1e-6, weights / total.clamp_min(1e-6), torch.full_like(weights, 1.0 / weights[0, 0].numel()))
    return (fmap * weights).sum(dim=(2, 3))


def features_cache_path(ws: Any, data: NestedData, backbone: str, size: int) -> Path:
    """Cache file for pooled frozen-backbone features, keyed by backbone, size, wounds and image hashes."""
    key = json.dumps([backbone, size, CROP_PAD, data.wound_keys, data.wound_bbox,
                      [data.image_sha.get(k[0], "") for k in data.wound_keys]])
    return Path(ws.cache_dir) / "slimp" / f"features_{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"


@torch.no_grad()
def frozen_features(ws: Any, data: NestedData, bb: Any, size: int, batch_size: int = 16) -> Tensor:
    """Pooled frozen-backbone features of every wound crop (n×C), cached in ``cache/slimp/``."""
    path = features_cache_path(ws, data, bb.name, size)
    if path.exists():
        return torch.load(path, map_location="cpu", weights_only=True)
    crops, masks = wound_crops(ws, data, size)
    feats = []
    for s in range(0, len(crops), batch_size):
        fmap = bb(bb.preprocess(crops[s:s + batch_size], size=size))
        feats.append(masked_pool(fmap, masks[s:s + batch_size].to(fmap.device)).cpu())
    out = torch.cat(feats)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb", suffix=".pt") as fh:
        torch.save(out, fh)
    return out


# ---------------------------------------------------------------- batching

def epoch_batches(patient_wounds: Sequence[np.ndarray], batch_patients: int, max_wounds: int,
                  seed: int, epoch: int) -> list[list[tuple[int, np.ndarray]]]:
    """Batches of about ``batch_patients`` patients, each with a random subset of at most
    ``max_wounds`` of its wounds (SLIMP appendix D), resampled per epoch.

    Deterministic in (seed, epoch): patients with wounds are shuffled and split into
    ceil(P / B) near-equal batches, so every process of a distributed run sees the same
    global batches.
    """
    rng = np.random.default_rng([seed, epoch])
    eligible = np.array([p for p, w in enumerate(patient_wounds) if len(w)], dtype=np.int64)
    order = rng.permutation(eligible)
    n_batches = max(1, -(-len(order) // batch_patients))
    batches = []
    for chunk in np.array_split(order, n_batches):
        batch = []
        for p in chunk:
            w = patient_wounds[p]
            take = np.sort(rng.choice(w, size=min(max_wounds, len(w)), replace=False))
            batch.append((int(p), take))
        batches.append(batch)
    return batches


@dataclass
class NestedInputs:
    """One (local) batch: image inputs of its wounds, wound/patient metadata, wound→patient map."""

    images: Tensor  # n_w × C pooled features, or n_w × 3 × S × S crops when training the stem
    masks: Tensor | None  # n_w × S × S wound masks (crops only)
    wound_tab: TabularBatch | None
    patient_index: Tensor  # n_w, values 0..n_p−1
    patient_tab: TabularBatch | None
    n_patients: int


def make_inputs(batch: Sequence[tuple[int, np.ndarray]], images: Tensor, masks: Tensor | None,
                wound_tab: TabularBatch | None, patient_tab: TabularBatch | None, device: torch.device) -> NestedInputs:
    """Gather the rows of one batch ``[(patient, wound indices), …]`` from the full-data tensors."""
    wounds = np.concatenate([w for _, w in batch]) if batch else np.zeros(0, dtype=np.int64)
    pidx = np.concatenate([np.full(len(w), i) for i, (_, w) in enumerate(batch)]) if batch else np.zeros(0, dtype=np.int64)
    widx = torch.as_tensor(wounds, dtype=torch.long)
    patients = torch.as_tensor([p for p, _ in batch], dtype=torch.long)
    return NestedInputs(
        images=images[widx].to(device),
        masks=None if masks is None else masks[widx].to(device),
        wound_tab=None if wound_tab is None else wound_tab.index(widx).to(device),
        patient_index=torch.as_tensor(pidx, dtype=torch.long, device=device),
        patient_tab=None if patient_tab is None else patient_tab.index(patients).to(device),
        n_patients=len(batch),
    )


# ---------------------------------------------------------------- model

class SLIMP(nn.Module):
    """SLIMP encoders and the nested loss's temperature (see the module docstring).

    ``trunk`` (a backbone feature module, e.g. ``core.vision.backbones`` EfficientNet trunk) is
    given only when the image stem is trained (continual mode); it always stays in eval
    mode (frozen BatchNorm statistics). Without it the model takes pooled frozen features.
    """

    def __init__(self, feat_dim: int, wound_schema: TabularSchema | None, patient_schema: TabularSchema | None,
                 dim: int = 128, lam: float = 0.9, temperature: float = 0.07, trunk: nn.Module | None = None) -> None:
        super().__init__()
        if wound_schema is None and patient_schema is None:
            raise ValueError("SLIMP needs wound metadata, patient metadata or both (nothing to contrast images with)")
        self.config = {"feat_dim": feat_dim, "dim": dim, "lam": lam, "temperature": temperature,
                       "wound_schema": None if wound_schema is None else wound_schema.to_dict(),
                       "patient_schema": None if patient_schema is None else patient_schema.to_dict()}
        self.trunk = trunk
        self.image_proj = nn.Linear(feat_dim, dim)
        self.wound_encoder = None if wound_schema is None else TabularEncoder(wound_schema, out_dim=dim)
        self.patient_encoder = None if patient_schema is None else TabularEncoder(patient_schema, out_dim=dim)
        width = dim * (2 if self.wound_encoder is not None else 1)
        self.phenotype = None if self.patient_encoder is None else nn.Linear(width, dim)
        self.criterion = NestedContrastiveLoss(lam=lam, temperature=temperature)

    @classmethod
    def from_config(cls, config: dict[str, Any], trunk: nn.Module | None = None) -> SLIMP:
        """Rebuild a model from its :attr:`config` (as saved in a checkpoint), on ``trunk`` if given."""
        schema = {k: None if config[k] is None else TabularSchema.from_dict(config[k]) for k in ("wound_schema", "patient_schema")}
        return cls(config["feat_dim"], schema["wound_schema"], schema["patient_schema"], dim=config["dim"],
                   lam=config["lam"], temperature=config["temperature"], trunk=trunk)

    def train(self, mode: bool = True) -> SLIMP:
        """Set training mode; the image trunk stays in eval mode (frozen BatchNorm statistics)."""
        super().train(mode)
        if self.trunk is not None:
            self.trunk.eval()
        return self

    def image_features(self, images: Tensor, masks: Tensor | None) -> Tensor:
        """Pooled image features: computed by the trunk from crops, or passed through."""
        if self.trunk is None:
            return images
        assert masks is not None, "a trunk pools its feature map over the wound masks"
        return masked_pool(self.trunk(images), masks)

    def encode_images(self, images: Tensor, masks: Tensor | None = None) -> Tensor:
        """The image embeddings w (n_w × dim)."""
        return self.image_proj(self.image_features(images, masks))

    def phenotypes(self, w: Tensor, h: Tensor | None, patient_index: Tensor, n_patients: int) -> Tensor:
        """z_p = Linear(mean over the patient's wounds of concat(w, h))."""
        wh = w if h is None else torch.cat([w, h], dim=1)
        sums = wh.new_zeros(n_patients, wh.shape[1]).index_add(0, patient_index, wh)
        counts = torch.bincount(patient_index, minlength=n_patients).clamp_min(1).to(wh.dtype)
        assert self.phenotype is not None, "phenotypes need patient metadata"
        return self.phenotype(sums / counts[:, None])

    def forward(self, inputs: NestedInputs) -> dict[str, Tensor | None]:
        """Embeddings ``w``, ``h`` (None without wound metadata), ``z``, ``x`` (None without patient metadata)."""
        w = self.encode_images(inputs.images, inputs.masks)
        h = None if self.wound_encoder is None else self.wound_encoder(inputs.wound_tab)
        z = x = None
        if self.patient_encoder is not None:
            z = self.phenotypes(w, h, inputs.patient_index, inputs.n_patients)
            x = self.patient_encoder(inputs.patient_tab)
        return {"w": w, "h": h, "z": z, "x": x}

    def continual_parameters(self, stem: Sequence[nn.Parameter] = ()) -> list[nn.Parameter]:
        """What continual pre-training adapts (SLIMP §3.2, appendix D): the image stem/patch
        embedding ``stem`` (parameters of :attr:`trunk`, from ``Backbone.stem_parameters()``)
        and the tabular encoders' input embeddings."""
        own = {id(p) for p in self.trunk.parameters()} if self.trunk is not None else set()
        if not all(id(p) in own for p in stem):
            raise ValueError("stem parameters must belong to the model's trunk")
        params = list(stem)
        for enc in (self.wound_encoder, self.patient_encoder):
            if enc is not None:
                params += enc.input_embedding_parameters()
        return params


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def embed_all(model: SLIMP, images: Tensor, masks: Tensor | None, wound_tab: TabularBatch | None,
              patient_tab: TabularBatch | None, device: torch.device, batch_size: int = 32) -> dict[str, Tensor | None]:
    """L2-normalised w and h of every wound and x of every patient (eval mode)."""
    was = model.training
    model.eval()
    w = []
    with autocast(device):
        for s in range(0, len(images), batch_size):
            m = None if masks is None else masks[s:s + batch_size].to(device)
            w.append(model.encode_images(images[s:s + batch_size].to(device), m).float().cpu())
        out: dict[str, Tensor | None] = {"w": F.normalize(torch.cat(w), dim=1), "h": None, "x": None}
        if model.wound_encoder is not None:
            assert wound_tab is not None, "a model with wound metadata embeds wound_tab"
            out["h"] = F.normalize(model.wound_encoder(wound_tab.to(device)).float().cpu(), dim=1)
        if model.patient_encoder is not None:
            assert patient_tab is not None, "a model with patient metadata embeds patient_tab"
            out["x"] = F.normalize(model.patient_encoder(patient_tab.to(device)).float().cpu(), dim=1)
    model.train(was)
    return out


def retrieval_recall(w: np.ndarray, h: np.ndarray, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Image → wound-metadata retrieval Recall@K (instance level, SLIMP appendix G.3): the
    query is a wound's w, the gallery every wound's h, the hit its own h (cosine)."""
    sims = w @ h.T
    own = np.diag(sims)
    rank = (sims > own[:, None]).sum(axis=1)  # 0 = own metadata ranked first; ties count in its favour
    return {f"R@{k}": float(np.mean(rank < k)) for k in ks}


def photo_embeddings(keys: Sequence[tuple[str, int]], wound_emb: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Photo-level embedding: mean of the photo's wound embeddings (rows of ``wound_emb``)."""
    ids = sorted({k[0] for k in keys})
    pos = {i: n for n, i in enumerate(ids)}
    out = np.zeros((len(ids), wound_emb.shape[1]))
    counts = np.zeros(len(ids))
    for (image_id, _), row in zip(keys, wound_emb):
        out[pos[image_id]] += row
        counts[pos[image_id]] += 1
    return ids, out / counts[:, None]


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _label_subset(rng: np.random.Generator, y: np.ndarray, fraction: float) -> np.ndarray:
    """Stratified subset: ``fraction`` of the rows, at least one per class."""
    if fraction >= 1.0:
        return np.arange(len(y))
    keep = [rng.choice(np.flatnonzero(y == c)) for c in np.unique(y)]
    extra = max(int(round(fraction * len(y))) - len(keep), 0)
    rest = np.setdiff1d(np.arange(len(y)), keep)
    keep += list(rng.choice(rest, size=min(extra, len(rest)), replace=False))
    return np.sort(np.array(keep))


MIN_PATIENTS_PER_FOLD = 8
PERMUTATIONS = 100


def patient_rows(features: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row per patient for a patient-level label: the mean of the patient's wound features,
    its (repeated) label and the patient as its own group — a label repeated per wound would
    otherwise count each patient many times."""
    groups = np.asarray(groups)
    uniq = np.unique(groups)
    X = np.stack([features[groups == g].mean(0) for g in uniq])
    y = np.array([labels[np.flatnonzero(groups == g)[0]] for g in uniq], dtype=object)
    return X, y, uniq


def _probe_figures(X: np.ndarray, y: np.ndarray, splits: list[tuple[np.ndarray, np.ndarray]],
                   fractions: Sequence[float], draws: int, k: int, rng: np.random.Generator) -> dict[str, float]:
    """Mean over folds of every probe figure: ``lp<f>_acc``/``_bacc`` per label fraction and ``knn_…``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, balanced_accuracy_score
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    scores: dict[str, list[float]] = {}

    def add(name: str, truth: np.ndarray, pred: np.ndarray) -> None:
        scores.setdefault(f"{name}_acc", []).append(accuracy_score(truth, pred))
        scores.setdefault(f"{name}_bacc", []).append(balanced_accuracy_score(truth, pred))

    for train, test in splits:
        if len(np.unique(y[train])) < 2:
            continue
        for f in fractions:
            for _ in range(1 if f >= 1.0 else draws):
                sub = train[_label_subset(rng, y[train], f)]
                if len(np.unique(y[sub])) < 2:
                    continue
                # newton-cg: the same L2 logistic regression as lbfgs, ~10× faster on these small sets
                clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, solver="newton-cg"))
                add(f"lp{f:g}", y[test], clf.fit(X[sub], y[sub]).predict(X[test]))
        nn_clf = KNeighborsClassifier(n_neighbors=min(k, len(train)), metric="cosine").fit(X[train], y[train])
        add("knn", y[test], nn_clf.predict(X[test]))
    return {name: _mean(v) for name, v in scores.items()}


def probe(features: np.ndarray, labels: np.ndarray, groups: np.ndarray, fractions: Sequence[float] = (0.01, 0.1, 1.0),
          seed: int = 0, folds: int = 5, draws: int = 3, k: int = 5, level: str = "wound",
          permutations: int = PERMUTATIONS) -> dict[str, Any]:
    """Linear probe (logistic regression) and kNN accuracy with patient-disjoint folds, each
    figure beside its permutation chance level.

    Rows with a missing label are dropped; a ``level="patient"`` label is probed on one row per
    patient (:func:`patient_rows`). Folds are StratifiedGroupKFold over patients (``groups``),
    at most ``folds`` and at least :data:`MIN_PATIENTS_PER_FOLD` patients per held-out fold
    where the data allow (never fewer than 2 folds). For a label fraction f < 1, f of the
    training rows keep their label (stratified, ≥ 1 per class), ``draws`` times per fold.

    Chance: the whole procedure rerun on ``permutations`` random permutations of the labels
    within the same folds; ``chance`` is their mean per figure, ``p`` the permutation p-value
    (1 + #{permuted ≥ observed}) / (1 + permutations), ``above_chance`` p < 0.05.
    """
    from sklearn.model_selection import StratifiedGroupKFold

    ok = np.array([v is not None for v in labels])
    X, y, g = features[ok], np.asarray(labels[ok]).astype(str), np.asarray(groups)[ok]
    if level == "patient":
        X, y, g = patient_rows(X, y, g)
        y = y.astype(str)
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise ValueError(f"the probe target needs at least two classes with labels, got {dict(zip(classes, counts))}")
    n_groups = len(np.unique(g))
    if n_groups < 2:
        raise ValueError(f"the probe needs labelled rows from at least two patients, got {n_groups}")
    n_folds = max(2, min(folds, n_groups // MIN_PATIENTS_PER_FOLD, int(counts.max())))
    splitter = StratifiedGroupKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    with warnings.catch_warnings():  # small data: rare classes, classes absent from a fold or a label subset
        for message in ("y_pred contains classes not in y_true", "A single label was found",
                        "The least populated class", "The number of unique classes is greater than 50%"):
            warnings.filterwarnings("ignore", message=message)
        splits = list(splitter.split(X, y, g))
        observed = _probe_figures(X, y, splits, fractions, draws, k, np.random.default_rng(seed))
        perm_rng = np.random.default_rng(seed + 1)
        null = [_probe_figures(X, perm_rng.permutation(y), splits, fractions, draws, k, np.random.default_rng(seed))
                for _ in range(permutations)]
    chance = {name: _mean([n[name] for n in null if name in n]) for name in observed}
    p = {name: (1 + sum(n.get(name, -np.inf) >= v for n in null)) / (1 + len(null)) for name, v in observed.items()}

    def nest(d: dict[str, float]) -> dict[str, Any]:
        return {"linear": {f"{f:g}": {m: d.get(f"lp{f:g}_{m}", float("nan")) for m in ("acc", "bacc")} for f in fractions},
                "knn": {m: d.get(f"knn_{m}", float("nan")) for m in ("acc", "bacc")}}

    return {"n": int(len(y)), "rows": "patient" if level == "patient" else "wound",
            "classes": {str(c): int(n) for c, n in zip(classes, counts)},
            "majority": float(counts.max() / counts.sum()), **nest(observed), "k": k, "folds": n_folds,
            "patients_per_fold": int(min(len(np.unique(g[test])) for _, test in splits)),
            "permutations": permutations, "chance": nest(chance), "p": nest(p)}
