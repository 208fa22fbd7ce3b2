"""Second reading: independent outlines of one photo by several annotators, and their agreement (Dice).

An admin marks photos for second reading. On a marked photo each annotator outlines into their own
layer — a label map under ``masks/readings/<image_id>/`` (0 = skin, n = wound n), written atomically,
each change recorded in the revisions table (entity ``readings``) with its actor. The stored truth
(``masks/<image_id>.png`` and the wounds table) is never touched. Readers are blind: the pages show
an annotator only their own layer, and agreement only to admins.

Agreement is the Dice coefficient of two readers' wound unions (every wound pixel of a layer, whatever
its index) on a photo both read; excluded annotators are left out.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from annotations.infra.fileio import atomic_write
from annotations.infra.workspace import Workspace, outlines
from annotations.scheduling.consistency import rounded

ENTITY = "readings"


class ReadingError(ValueError):
    """A second-reading change that was refused (nothing was changed); the message is shown as is."""


# -- Dice -----------------------------------------------------------------------------------------------
def dice(a: np.ndarray, b: np.ndarray) -> float:
    """2|A∩B| / (|A| + |B|) of two boolean masks; 1 when both are empty (both readers saw no wound).
    The same definition as ``core.segmentation.metrics.dice`` (``annotations`` does not import ``core``)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    if a.shape != b.shape:
        raise ValueError(f"masks differ in shape: {a.shape} vs {b.shape}")
    denom = int(a.sum()) + int(b.sum())
    return 1.0 if denom == 0 else 2.0 * int((a & b).sum()) / denom


# -- marking photos -------------------------------------------------------------------------------------
def marked(ws: Workspace) -> list[str]:
    """Photos marked for second reading, sorted."""
    return ws.store.reading_photos()


def is_marked(ws: Workspace, image_id: str) -> bool:
    """Whether the photo is marked for a reading."""
    return ws.store.is_reading_photo(image_id)


def _known(ws: Workspace, image_id: str) -> dict:
    row = ws.store.image(image_id)
    if row is None:
        raise ReadingError(f"Unknown photo {image_id!r}. Nothing was changed.")
    return row


def mark(ws: Workspace, image_id: str, actor: str) -> bool:
    """Mark a photo for second reading; False when it already was."""
    _known(ws, image_id)
    return ws.store.mark_reading_photo(image_id, actor)


def unmark(ws: Workspace, image_id: str, actor: str) -> bool:
    """Close a photo's second reading: its readings are kept (and still count) but no longer change;
    False when it was not marked."""
    _known(ws, image_id)
    return ws.store.unmark_reading_photo(image_id, actor)


# -- layers ---------------------------------------------------------------------------------------------
def readings_dir(ws: Workspace) -> Path:
    """Where the readers' layers live (inside ``masks/``, so a backup copies them with the masks)."""
    return ws.masks_dir / "readings"


def layer_file(image_id: str, reader: str) -> str:
    """The layer's path under :func:`readings_dir`: ``<image_id>/<readable name>-<hash>.png``; the name is
    compared ignoring case, as account names are."""
    key = reader.strip().casefold()
    slug = re.sub(r"[^a-z0-9]+", "-", key).strip("-")[:32] or "reader"
    return f"{image_id}/{slug}-{hashlib.sha256(key.encode()).hexdigest()[:10]}.png"


def readings(ws: Workspace, image_id: str | None = None) -> list[dict[str, Any]]:
    """Stored readings ``{image_id, reader, file, wounds, area, updated}``, by photo then reader."""
    return ws.store.readings(image_id)


def load_layer(ws: Workspace, image_id: str, reader: str) -> np.ndarray:
    """The reader's H×W int32 label map of the photo; all zeros when they have not read it."""
    image = _known(ws, image_id)
    row = ws.store.reading(image_id, reader)
    if row is None:
        return np.zeros((image["height"], image["width"]), dtype=np.int32)
    with Image.open(readings_dir(ws) / row["file"]) as im:
        return np.asarray(im).astype(np.int32)


def _check_writer(ws: Workspace, image_id: str, reader: str, actor: str) -> dict:
    image = _known(ws, image_id)
    if not reader or not reader.strip():
        raise ReadingError("A reading needs its reader's account name. Nothing was saved.")
    if reader.strip().casefold() != str(actor).strip().casefold():
        raise ReadingError(f"{actor} cannot change {reader}'s reading of {image_id}: each annotator outlines "
                           "only into their own layer. Nothing was saved.")
    if not is_marked(ws, image_id):
        raise ReadingError(f"Photo {image_id} is not marked for second reading (an admin marks photos on the "
                           "Review page). Nothing was saved.")
    return image


def save_layer(ws: Workspace, image_id: str, labels: np.ndarray, *, reader: str, actor: str) -> None:
    """Store ``labels`` as ``reader``'s reading of ``image_id`` (only the reader may, only while the photo is
    marked). One ``readings`` revision holds the old and new outlines."""
    labels = np.asarray(labels)
    with ws.store.transaction():
        image = _check_writer(ws, image_id, reader, actor)
        if labels.shape != (image["height"], image["width"]):
            raise ReadingError(f"The reading is {labels.shape[::-1]} px, photo {image_id} is "
                               f"{image['width']}×{image['height']} px. Nothing was saved.")
        if not np.issubdtype(labels.dtype, np.integer) or labels.min(initial=0) < 0 or labels.max(initial=0) > 65535:
            raise ReadingError("A reading is a label map of whole numbers 0–65535 (0 = skin). Nothing was saved.")
        reader, new = reader.strip(), outlines(labels)
        old_row = ws.store.reading(image_id, reader)
        old = outlines(load_layer(ws, image_id, reader)) if old_row else None
        if old is not None and old == new:
            return
        file = old_row["file"] if old_row else layer_file(image_id, reader)
        wounds, area = len(new), int((labels > 0).sum())
        ws.store.upsert_reading(image_id, reader, file, wounds, area)
        ws.store.record_revision(ENTITY, {"image_id": image_id, "reader": old_row["reader"] if old_row else reader},
                                 "outline", "update" if old_row else "insert", old, new, actor)
        path = readings_dir(ws) / file
        path.parent.mkdir(parents=True, exist_ok=True)
        dtype = np.uint8 if labels.max(initial=0) <= 255 else np.uint16
        with atomic_write(path, "wb", suffix=".png") as fh:  # last: a failed write rolls the row back
            Image.fromarray(labels.astype(dtype)).save(fh, format="PNG")


def add_wound(ws: Workspace, image_id: str, region: np.ndarray, wound_index: int | None = None, *,
              reader: str, actor: str) -> int:
    """Put ``region`` into the reader's layer as wound ``wound_index`` (None: a new wound); returns its index.
    Too small, or overlapping another wound of the same reading: ReadingError, nothing saved. The layer is
    read and written in one transaction, so a second browser of the same reader cannot lose this change."""
    with ws.store.transaction():
        _check_writer(ws, image_id, reader, actor)
        labels = load_layer(ws, image_id, reader)
        region = np.asarray(region, bool)
        if region.shape != labels.shape:
            raise ReadingError(f"The outline is {region.shape[::-1]} px, photo {image_id} is "
                               f"{labels.shape[::-1]} px. Nothing was saved.")
        area, minimum = int(region.sum()), ws.min_wound_area
        if area < minimum:
            raise ReadingError(f"The outline covers {area} px, less than this workspace's minimum wound area of "
                               f"{minimum} px. Nothing was saved.")
        if wound_index is not None and not (labels == wound_index).any():
            raise ReadingError(f"Your reading of {image_id} has no wound {wound_index}. Nothing was saved.")
        others = np.unique(labels[region & (labels > 0) & (labels != (wound_index or 0))])
        if len(others):
            names = ", ".join(str(int(j)) for j in others)
            raise ReadingError(f"The outline overlaps wound(s) {names} of your reading; move its vertices so the "
                               "wounds do not overlap. Nothing was saved.")
        index = wound_index or int(labels.max(initial=0)) + 1
        labels[labels == index] = 0
        labels[region] = index
        save_layer(ws, image_id, labels, reader=reader, actor=actor)
    return index


def delete_wound(ws: Workspace, image_id: str, wound_index: int, *, reader: str, actor: str) -> None:
    """Remove one wound from the reader's layer (the reading stays: a reading may find no wound)."""
    with ws.store.transaction():
        _check_writer(ws, image_id, reader, actor)
        labels = load_layer(ws, image_id, reader)
        if not (labels == wound_index).any():
            raise ReadingError(f"Your reading of {image_id} has no wound {wound_index}. Nothing was changed.")
        labels[labels == wound_index] = 0
        save_layer(ws, image_id, labels, reader=reader, actor=actor)


# -- agreement ------------------------------------------------------------------------------------------
def agreement(ws: Workspace, exclude: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Outline agreement between readers, excluded annotators (names, any case) left out.

    ``photos``: one row per photo read by ≥ 2 readers: ``{image_id, readers, pairs: [{a, b, dice}], mean,
    vs_stored: {reader: dice against the stored outline}}``; ``pairs``: per reader pair over the photos
    both read ``{a, b, n, mean, min}``; ``mean``: the mean over photos of each photo's mean pair Dice
    (NaN when no photo has two readings)."""
    left_out = {name.casefold() for name in exclude}
    by_photo: dict[str, list[dict]] = {}
    for row in readings(ws):
        if row["reader"].casefold() not in left_out:
            by_photo.setdefault(row["image_id"], []).append(row)
    photos: list[dict[str, Any]] = []
    per_pair: dict[tuple[str, str], list[float]] = {}
    for image_id, rows in by_photo.items():
        if len(rows) < 2:
            continue
        union = {r["reader"]: load_layer(ws, image_id, r["reader"]) > 0 for r in rows}
        stored = ws.load_mask(image_id) > 0
        pairs = []
        for a, b in itertools.combinations(sorted(union, key=str.casefold), 2):
            value = dice(union[a], union[b])
            pairs.append({"a": a, "b": b, "dice": value})
            per_pair.setdefault((a, b), []).append(value)
        photos.append({"image_id": image_id, "readers": sorted(union, key=str.casefold), "pairs": pairs,
                       "mean": float(np.mean([p["dice"] for p in pairs])),
                       "vs_stored": {r: dice(m, stored) for r, m in union.items()} if stored.any() else {}})
    pairs = [{"a": a, "b": b, "n": len(v), "mean": float(np.mean(v)), "min": float(min(v))}
             for (a, b), v in sorted(per_pair.items(), key=lambda kv: (kv[0][0].casefold(), kv[0][1].casefold()))]
    return {"photos": photos, "pairs": pairs,
            "mean": float(np.mean([p["mean"] for p in photos])) if photos else math.nan}


def photo_rows(photos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table of outline agreement per photo (the ``photos`` of :func:`agreement`), lowest mean Dice first:
    readers, mean Dice, each pair's Dice and each reading's Dice against the stored outline."""
    return [{"photo": ph["image_id"], "readers": ", ".join(ph["readers"]),
             "mean Dice": rounded(ph["mean"]),
             "pairs": "; ".join(f"{p['a']}–{p['b']} {p['dice']:.3f}" for p in ph["pairs"]),
             "vs stored": "; ".join(f"{r} {v:.3f}" for r, v in sorted(ph["vs_stored"].items())) or "no stored outline"}
            for ph in sorted(photos, key=lambda ph: ph["mean"])]
