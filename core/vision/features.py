"""Wound tokens on a backbone's feature grid, and the on-disk cache of augmented-view features.

**Wound tokens** (TriDerm §2.2: "all spatial locations within the wound region"). A wound's
label mask is area-averaged onto the H×W feature grid (``adaptive_avg_pool2d`` of its
indicator), giving the fraction of every grid cell covered by the wound. A location is a
token of the wound when that fraction is ≥ 0.5 (the cell is mostly wound). A wound too
small to cover half of any cell still gets one token: the cell holding most of its pixels
(its nearest location). Tokens of different wounds may share a cell only at exactly 0.5.

**Feature cache.** For every photo, K augmented views (:mod:`core.vision.augment`, view *v*
seeded by run seed + image sha256 + augmentation hash + *v*) are run once through the frozen
backbone. The cache folder ``cache/features/<backbone@layer:weights>/<code>-<aug hash>/seed<s>/``
(``code``: a hash of the source of the modules that compute the values, so a change of the
backbone, its layer or weights, the augmentation, the code or the seed never reads stale
features) holds safetensors shards of up to :data:`SHARD_PHOTOS` photos each. A photo's key is
``<image sha256>-<mask sha>`` (the wound-keeping crop and the grid depend on the outline); under
``<key>/`` a shard holds the fp16 feature maps of the views (K×C×H×W), the downsampled label grid
as per-wound area fractions (K×E×H×W, fp16), and the un-augmented inference view (resize to the
backbone's input size) with its fractions. Shards are read memory-mapped, one photo's tensors at
a time; ``index.json`` merges every shard's photo list (a shard it does not list is read from
its header). Asking for more views later computes only the missing ones (the photo then gets a
shard of its own). :meth:`FeatureCache.extract` fills the cache one shard at a time (memory
bounded by one shard, whatever the study's size); each shard is written atomically, so a killed
extraction resumes after its last finished shard, and ``torchrun`` ranks each take a slice of the
photos into the same folder (one merged cache).

:class:`TokenBank` flattens all of it into tensors once, so a training step is a gather.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save
from torch import Tensor
from tqdm.auto import tqdm

from annotations.infra.fileio import atomic_write
from annotations.infra.workspace import Workspace
from core.runtime import keep_freed_memory, source_fingerprint, torch_threads
from core.vision.augment import AugmentConfig, WoundAugment, view_generator
from core.vision.backbones import Backbone
from core.vision.recipe import SHARD_PHOTOS

TOKEN_THRESHOLD = 0.5
CACHE_VERSION = 3
SHARD_PREFIX, SHARD_SUFFIX = "shard-", ".safetensors"  # finished shards only: temporaries start with "."
INDEX_NAME = "index.json"
#: The tensors kept per photo.
PARTS = ("views", "view_frac", "eval_feat", "eval_frac")


def wound_fractions(labels: np.ndarray | Tensor, wound_indices: Sequence[int], grid: tuple[int, int]) -> Tensor:
    """…×E×H×W fraction of each grid cell covered by each wound (label value ``wound_indices[e]``) of
    an (…×)Hm×Wm label map (a batch of views at once), on the labels' device.

    Pixel (y, x) of an Hm×Wm mask falls in cell (⌊y·H/Hm⌋, ⌊x·W/Wm⌋). When the grid divides the mask (an
    augmented view) the cells are equal blocks and the counts are block sums; otherwise they are two matrix
    products of the wound indicators with the 0/1 row-bin and column-bin matrices. Both count exactly.
    """
    lab = labels if isinstance(labels, Tensor) else torch.from_numpy(np.ascontiguousarray(labels))
    if lab.ndim < 2:
        raise ValueError(f"labels must be H×W (or a batch of them), got shape {tuple(lab.shape)}")
    dev, lead = lab.device, tuple(lab.shape[:-2])
    lab = lab.reshape(-1, *lab.shape[-2:])
    gh, gw = grid
    hm, wm = lab.shape[-2:]
    if hm % gh == 0 and wm % gw == 0:  # equal blocks
        bh, bw = hm // gh, wm // gw
        counts = [(lab == int(index)).view(torch.uint8).view(-1, hm, gw, bw).sum(-1, dtype=torch.int32)
                  .view(-1, gh, bh, gw).sum(2).float() for index in wound_indices]  # row blocks, then column blocks
        area = torch.tensor(float(bh * bw), device=dev)
    else:
        rows = (((torch.arange(hm, device=dev) * gh) // hm)[None] == torch.arange(gh, device=dev)[:, None]).float()
        cols = (((torch.arange(wm, device=dev) * gw) // wm)[:, None] == torch.arange(gw, device=dev)[None]).float()
        # one wound at a time (memory: one indicator map; exact integers in float32)
        counts = [rows @ (lab == int(index)).float() @ cols for index in wound_indices]
        area = rows.sum(1)[:, None] * cols.sum(0)[None]
    frac = torch.stack(counts, 1) / area if counts else lab.new_zeros((lab.shape[0], 0, gh, gw), dtype=torch.float32)
    return frac.reshape(*lead, len(counts), gh, gw)


def token_mask(fractions: Tensor, threshold: float = TOKEN_THRESHOLD) -> Tensor:
    """Boolean E×H×W token mask from area fractions; a present wound always gets ≥ 1 token."""
    mask = fractions >= threshold
    flat = fractions.flatten(1)
    lonely = ~mask.flatten(1).any(1) & (flat.amax(1) > 0)
    if lonely.any():
        best = flat.argmax(1)
        m = mask.flatten(1).clone()
        m[lonely, best[lonely]] = True
        mask = m.view_as(mask)
    return mask


def wound_tokens(labels: np.ndarray | Tensor, wound_indices: Sequence[int], grid: tuple[int, int],
                 threshold: float = TOKEN_THRESHOLD) -> list[Tensor]:
    """Per wound, the flat grid locations (row·W + col) that are its tokens (empty if absent)."""
    mask = token_mask(wound_fractions(labels, wound_indices, grid), threshold)
    return [torch.nonzero(m.flatten(), as_tuple=True)[0] for m in mask]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def mask_sha(labels: np.ndarray) -> str:
    """Hash of a label map (shape and values)."""
    lab = np.ascontiguousarray(labels, dtype=np.int32)
    return hashlib.sha256(str(lab.shape).encode() + lab.tobytes()).hexdigest()[:16]


@dataclass
class PhotoFeatures:
    """Cached features of one photo: augmented views and the inference view."""

    wound_indices: list[int]
    views: Tensor        # K×C×H×W fp16
    view_frac: Tensor    # K×E×H×W fp16 area fractions
    eval_feat: Tensor    # C×H×W fp16 (resize to the backbone input, no augmentation)
    eval_frac: Tensor    # E×H×W fp32 area fractions from the full-resolution mask


def forward_fp16(backbone: Backbone, images: Tensor, batch_size: int = 32) -> Tensor:
    """``backbone``'s features of ``images`` (N×3×S×S in [0, 1]) in batches of ``batch_size``, as fp16 on the CPU
    (the cache's precision)."""
    out = [backbone(backbone.normalize(images[i:i + batch_size])) for i in range(0, len(images), batch_size)]
    return torch.cat(out).half().cpu()


def view_features(augment: WoundAugment, image, labels: np.ndarray, wound_indices: Sequence[int], sha256: str,
                  views: Sequence[int], seed: int, forward: Callable[[Tensor], Tensor],
                  device: torch.device) -> tuple[Tensor, Tensor]:
    """(features K×C×H×W fp16, fractions K×E×H×W fp16) of views ``views`` of a photo (view *v* drawn from its
    ``sha256``, the augmentation and ``seed``): the photo is resized once, its views made as one batch on
    ``device`` and passed through ``forward`` (views → fp16 CPU features). A cached photo's views and a new
    photo's (:class:`~core.vision.inference.TunedModel`)."""
    with torch_threads(1):  # small batched ops: threads only add overhead
        img, mask = augment.prepare(image, labels)
        x, m = augment.views(img, mask, [view_generator(sha256, augment.config, v, seed) for v in views],
                             device=device)
    feats = forward(x)
    return feats, wound_fractions(m, list(wound_indices), (feats.shape[-2], feats.shape[-1])).half().cpu()


class FeatureCache:
    """Augmented-view features of a workspace's photos for one backbone and augmentation, in
    safetensors shards of up to ``shard_size`` photos (see the module docstring)."""

    def __init__(self, ws: Workspace, backbone: Backbone, config: AugmentConfig | None = None,
                 batch_size: int = 32, seed: int = 0, shard_size: int = SHARD_PHOTOS) -> None:
        self.ws = ws
        self.backbone = backbone
        self.config = config or AugmentConfig(size=backbone.input_size)
        self.augment = WoundAugment(self.config)
        self.batch_size = batch_size
        self.seed = int(seed)
        self.shard_size = int(shard_size)
        code = source_fingerprint("core.vision.augment", "core.vision.features", "core.vision.backbones")
        self.root = (ws.cache_dir / "features" / _safe(backbone.key) / f"{code}-{self.config.key()}"
                     / f"seed{self.seed}")
        self._shards: dict[str, dict[str, dict]] = {}  # shard file name → photo key → {views, wounds}
        self._index: dict[str, tuple[str, int]] = {}   # photo key → (shard file name, views): the merged index

    def key(self, sha256: str, labels: np.ndarray) -> str:
        """A photo's cache key (with the folder's backbone, layer, weights, code, augmentation and seed)."""
        return f"{sha256}-{mask_sha(labels)}"

    def shard_files(self) -> list[Path]:
        """The finished shard files (``shard-*.safetensors``; a writer's temporary file, even one left
        by a killed process, is hidden and never read)."""
        return sorted(self.root.glob(SHARD_PREFIX + "*" + SHARD_SUFFIX)) if self.root.is_dir() else []

    def index(self) -> dict[str, tuple[str, int]]:
        """Photo key → (shard file, views), merged over every shard in the folder: ``index.json``
        (written by :meth:`extract`) plus the header of any shard it does not list."""
        on_disk = {p.name for p in self.shard_files()}
        if set(self._shards) != on_disk:
            listed = {}
            if (self.root / INDEX_NAME).exists():
                try:
                    listed = json.loads((self.root / INDEX_NAME).read_text())
                except (OSError, json.JSONDecodeError):
                    listed = {}
            self._shards = {name: listed[name] if name in listed else self._header(name) for name in sorted(on_disk)}
            self._index = {}
            for name, photos in self._shards.items():
                for key, info in photos.items():
                    if info["views"] >= self._index.get(key, ("", -1))[1]:
                        self._index[key] = (name, info["views"])
        return self._index

    def _header(self, name: str) -> dict[str, dict]:
        with safe_open(self.root / name, framework="pt") as f:
            meta = f.metadata() or {}
        return json.loads(meta["photos"]) if meta.get("version") == str(CACHE_VERSION) else {}

    def write_index(self) -> None:
        """Rewrite ``index.json`` from every shard in the folder (all ranks' shards once they are done)."""
        self.index()
        with atomic_write(self.root / INDEX_NAME, "w", suffix=".json") as fh:
            json.dump(self._shards, fh)

    def _write_shard(self, photos: dict[str, dict]) -> str:
        """One shard file (written atomically) holding ``photos`` (key → cached dict); returns its name."""
        tensors, meta = {}, {}
        for key, c in photos.items():
            for part in PARTS:
                tensors[f"{key}/{part}"] = c[part].contiguous()
            meta[key] = {"views": int(c["views"].shape[0]), "wounds": c["wounds"]}
        name = SHARD_PREFIX + hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16] + SHARD_SUFFIX
        self.root.mkdir(parents=True, exist_ok=True)
        with atomic_write(self.root / name, "wb", suffix=SHARD_SUFFIX) as fh:
            fh.write(save(tensors, {"version": str(CACHE_VERSION), "photos": json.dumps(meta)}))
        return name

    def _read(self, key: str, n_views: int | None = None) -> dict | None:
        """The cached dict of photo ``key`` (its first ``n_views`` views), memory-mapped from its shard."""
        found = self.index().get(key)
        if found is None:
            return None
        name, views = found
        with safe_open(self.root / name, framework="pt") as f:
            out = {part: f.get_tensor(f"{key}/{part}") if part.startswith("eval") or n_views is None
                   else f.get_slice(f"{key}/{part}")[:min(n_views, views)] for part in PARTS}
        out["wounds"] = self._shards[name][key]["wounds"]
        return out

    def _forward(self, images: Tensor) -> Tensor:
        return forward_fp16(self.backbone, images, self.batch_size)

    def augmented_views(self, image, labels: np.ndarray, wound_indices: list[int], sha256: str,
                        views: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Compute (features K×C×H×W fp16, fractions K×E×H×W fp16) for the given view indices
        (:func:`view_features` with the cache's backbone, augmentation and seed)."""
        return view_features(self.augment, image, labels, wound_indices, sha256, views, self.seed, self._forward,
                             self.backbone.device)

    def photo(self, image_id: str, n_views: int, use_cache: bool = True) -> PhotoFeatures:
        """Features of ``image_id`` with at least ``n_views`` views (computing only missing ones;
        a photo given more views is written to a shard of its own)."""
        key, cached, computed = self._photo(image_id, n_views, use_cache)
        if computed and use_cache:
            self._write_shard({key: cached})
        return self._unpack(cached, n_views)

    def _photo(self, image_id: str, n_views: int, use_cache: bool = True) -> tuple[str, dict, bool]:
        """(key, cached dict, whether anything was computed)."""
        row = self.ws.store.image(image_id)
        if row is None:
            raise KeyError(f"unknown image {image_id!r}")
        labels = self.ws.load_mask(image_id)
        wounds = [w["wound_index"] for w in self.ws.store.wounds(image_id)]
        key = self.key(row["sha256"], labels)
        cached = self._read(key, n_views) if use_cache else None
        if cached is not None and cached["wounds"] != wounds:
            cached = None
        have = 0 if cached is None else cached["views"].shape[0]
        if cached is not None and have >= n_views:
            return key, cached, False
        if cached is not None:
            cached = self._read(key)  # every stored view, to extend
        image = self.ws.load_image(image_id)
        if cached is None:
            eval_feat = self._forward(self._unit(image)[None])[0]
            eval_frac = wound_fractions(labels, wounds, (eval_feat.shape[-2], eval_feat.shape[-1]))
            cached = {"wounds": wounds, "eval_feat": eval_feat, "eval_frac": eval_frac,
                      "views": eval_feat.new_zeros((0, *eval_feat.shape)),
                      "view_frac": eval_frac.half().new_zeros((0, *eval_frac.shape))}
        if n_views > have:
            feats, frac = self.augmented_views(image, labels, wounds, row["sha256"], range(have, n_views))
            cached["views"] = torch.cat([cached["views"], feats])
            cached["view_frac"] = torch.cat([cached["view_frac"], frac])
        return key, cached, True

    def _unit(self, image) -> Tensor:
        """Un-augmented inference input in [0, 1]: square resize to the backbone input size."""
        s = self.backbone.input_size
        arr = np.asarray(image.convert("RGB").resize((s, s), resample=2))  # PIL bilinear
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).float() / 255.0

    @staticmethod
    def _unpack(cached: dict, n_views: int) -> PhotoFeatures:
        return PhotoFeatures(list(cached["wounds"]), cached["views"][:n_views], cached["view_frac"][:n_views],
                             cached["eval_feat"], cached["eval_frac"].float())

    def build(self, image_ids: Sequence[str], n_views: int, progress: bool = True) -> dict[str, PhotoFeatures]:
        """Features of every photo (computed into shards first where missing, then read from disk)."""
        self.extract(image_ids, n_views, rank=0, world_size=1, progress=progress)
        return {i: self.photo(i, n_views) for i in image_ids}

    def extract(self, image_ids: Sequence[str], n_views: int, rank: int | None = None,
                world_size: int | None = None, progress: bool = True) -> list[str]:
        """Write the cache of this rank's slice of ``image_ids`` (every ``world_size``-th photo from
        ``rank``; by default torchrun's ``RANK``/``WORLD_SIZE``, else all photos), ``shard_size``
        photos per shard file and at most one shard in memory; photos already cached are skipped,
        so a killed extraction resumes after its last finished shard. Ends by rewriting the
        merged ``index.json``. Returns the ids it computed."""
        keep_freed_memory()  # a forward's activations are reused, not faulted in again (a third less CPU)
        rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        mine = list(image_ids)[rank::world_size]
        computed: list[str] = []
        pending: dict[str, dict] = {}
        for n, image_id in enumerate(tqdm(mine, desc=f"photo features ({self.backbone.name})"
                                          + (f", process {rank + 1} of {world_size}" if world_size > 1 else ""),
                                          unit="photo", disable=not progress, leave=False)):
            key, cached, fresh = self._photo(image_id, n_views)
            if fresh:
                pending[key] = cached
                computed.append(image_id)
            if pending and ((n + 1) % self.shard_size == 0 or n + 1 == len(mine)):
                self._write_shard(pending)
                pending = {}
        self.write_index()
        return computed


class TokenBank:
    """All wound tokens of all views as flat tensors, for vectorised gather + pooling.

    ``tokens`` T×C float32; for wound e and view v its tokens are
    ``tokens[start[e, v] : start[e, v] + length[e, v]]`` (length 0: wound not in that view).
    The inference view is ``eval_tokens`` with ``eval_segment`` (wound row per token) and
    ``eval_pos`` (grid row, col per token); ``grid`` is (H, W).
    """

    def __init__(self, photos: dict[str, PhotoFeatures], wound_keys: Sequence[tuple[str, int]],
                 threshold: float = TOKEN_THRESHOLD) -> None:
        self.wound_keys = list(wound_keys)
        n_views = min(p.views.shape[0] for p in photos.values())
        chunks, start, length = [], torch.zeros(len(wound_keys), n_views, dtype=torch.long), \
            torch.zeros(len(wound_keys), n_views, dtype=torch.long)
        ev_chunks, ev_seg, ev_pos = [], [], []
        offset = 0
        row_of = {k: r for r, k in enumerate(self.wound_keys)}
        for image_id, p in photos.items():
            rows = torch.tensor([row_of.get((image_id, w), -1) for w in p.wound_indices], dtype=torch.long)
            keep = rows >= 0
            _, h, w = p.eval_feat.shape
            self.grid = (h, w)
            e = len(rows)
            # augmented views: nonzero() is ordered (view, wound, location), so every
            # (wound, view) token run is contiguous
            vmask = token_mask(p.view_frac[:n_views].float().flatten(0, 1), threshold).view(n_views, e, h * w)
            vmask &= keep.view(1, e, 1)
            v_idx, _, loc = torch.nonzero(vmask, as_tuple=True)
            chunks.append(p.views[:n_views].flatten(2).transpose(1, 2)[v_idx, loc])
            lens = vmask.sum(-1)  # K×E
            starts = offset + torch.cumsum(lens.flatten(), 0).view_as(lens) - lens
            offset += int(lens.sum())
            start[rows[keep]] = starts[:, keep].T
            length[rows[keep]] = lens[:, keep].T
            # inference view
            emask = token_mask(p.eval_frac, threshold).flatten(1) & keep.view(e, 1)
            if (emask.sum(1) == 0)[keep].any():
                bad = int(torch.nonzero((emask.sum(1) == 0) & keep)[0])
                raise ValueError(f"wound {(image_id, p.wound_indices[bad])} has no pixels in its mask")
            j, loc = torch.nonzero(emask, as_tuple=True)
            ev_chunks.append(p.eval_feat.flatten(1).T[loc])
            ev_seg.append(rows[j])
            ev_pos.append(torch.stack([loc // w, loc % w], 1))
        self.tokens = torch.cat(chunks).float() if chunks else torch.zeros(0, 0)
        self.start, self.length = start, length
        self.eval_tokens = torch.cat(ev_chunks).float()
        self.eval_segment = torch.cat(ev_seg)
        self.eval_pos = torch.cat(ev_pos)
        self.n_views = n_views
        self.valid = length > 0  # E×K: wound present in view

    @property
    def channels(self) -> int:
        """The number of feature channels per token."""
        return self.eval_tokens.shape[1]

    def __len__(self) -> int:
        return len(self.wound_keys)

    def sample_views(self, wounds: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Two different valid view indices per wound (the same one if only one is valid;
        -1 means "use the inference view" for a wound lost in every augmented view)."""
        valid = self.valid[wounds].float()
        none = valid.sum(1) == 0
        valid[none] = 1.0
        v1 = torch.multinomial(valid, 1, generator=generator)[:, 0]
        rest = valid.clone()
        rest[torch.arange(len(wounds)), v1] = 0.0
        single = rest.sum(1) == 0
        rest[single, v1[single]] = 1.0
        v2 = torch.multinomial(rest, 1, generator=generator)[:, 0]
        v1[none], v2[none] = -1, -1
        return v1, v2

    def gather(self, wounds: Tensor, views: Tensor) -> tuple[Tensor, Tensor]:
        """Tokens of (wound, view) pairs and their segment ids 0..B-1 (view -1 → inference view)."""
        starts = self.start[wounds, views.clamp(min=0)]
        lens = self.length[wounds, views.clamp(min=0)]
        lens = torch.where(views < 0, 0, lens)
        seg = torch.repeat_interleave(torch.arange(len(wounds)), lens)
        first = torch.repeat_interleave(starts - (torch.cumsum(lens, 0) - lens), lens)
        idx = first + torch.arange(int(lens.sum()))
        tokens, segment = self.tokens[idx], seg
        if (views < 0).any():
            extra_t, extra_s = [], []
            for b in torch.nonzero(views < 0, as_tuple=True)[0].tolist():
                sel = self.eval_segment == wounds[b]
                extra_t.append(self.eval_tokens[sel])
                extra_s.append(torch.full((int(sel.sum()),), b, dtype=torch.long))
            tokens = torch.cat([tokens, *extra_t])
            segment = torch.cat([segment, *extra_s])
        return tokens, segment


def workspace_wounds(ws: Workspace) -> tuple[list[str], list[tuple[str, int]]]:
    """Image ids that have ≥ 1 wound, and all wound keys (image_id, wound_index), store order."""
    keys = [(w["image_id"], w["wound_index"]) for w in ws.store.wounds()]
    image_ids = sorted({k[0] for k in keys})
    return image_ids, keys
