"""Dataset folders: the one on-disk format for import, export and the demo.

```
images/<image_id>.(png|jpg|jpeg|tif|tiff)
masks/<image_id>.png   label map (0 skin, 1..N wound) or binary (0/1, 0/255; L or RGB)
wounds.csv             image_id, wound_index, description, [metadata…]
images.csv             image_id, patient_id, [metadata…]             (optional)
patients.csv           patient_id, [metadata…]                       (optional)
triplets.csv           anchor, ref_j, ref_k, choice, annotator, [source, rep, latency_ms, created]
dataset.json           {"name", "synthetic", "mask_format": "label"|"auto"}  (optional)
truth/                 latent truth of synthetic datasets                (optional, copied as is)
```
Everything is validated before anything is written: bad input raises one
:class:`DatasetError` naming the file, row and field, and leaves the workspace untouched.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from annotations.fileio import atomic_write
from annotations.privacy import StudyIds
from annotations.readers import (
    IMAGE_SUFFIXES,
    DatasetError,
    check_id,
    load_image,
    mask_to_labels,
    read_csv,
    row_metadata,
)
from annotations.store import CHOICES, image_file_value, key_json, triplet_key, wound_key
from annotations.workspace import Workspace, outline_hash, outlines


@dataclass
class _Image:
    image_id: str
    path: Path
    sha256: str
    width: int
    height: int
    patient_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    labels: np.ndarray | None = None


@dataclass
class DatasetPlan:
    """A fully validated dataset, ready to be written."""

    root: Path
    images: dict[str, _Image]
    patients: dict[str, dict[str, Any]]
    wounds: dict[tuple[str, int], dict[str, Any]]
    triplets: list[dict[str, Any]]
    info: dict[str, Any]
    #: ``(entity, key JSON, field) → "file: line n"``: where each imported value was read.
    where: dict[tuple[str, str, str], str] = field(default_factory=dict)

    @property
    def synthetic(self) -> bool:
        return parse_bool(self.info.get("synthetic", False), "dataset.json: synthetic")


def parse_bool(value: Any, where: str) -> bool:
    """``true``/``false`` as JSON booleans or the usual words; anything else is an error (a
    non-empty string is never true just for being non-empty)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise DatasetError(f"{where}: expected true or false, got {value!r}")


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off", ""}


def validate_dataset(root: str | Path, known_images: set[str] = frozenset()) -> DatasetPlan:
    """Read and check a whole dataset folder; raises :class:`DatasetError` on the first problem.

    ``known_images`` are ids already in the target workspace (triplets may name them)."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"{root}: not a folder")
    images_dir = root / "images"
    if not images_dir.is_dir():
        raise DatasetError(f"{root}: no images/ folder")
    info: dict[str, Any] = {}
    if (root / "dataset.json").exists():
        try:
            info = json.loads((root / "dataset.json").read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DatasetError(f"dataset.json: not valid JSON ({err})") from None
        if not isinstance(info, dict):
            raise DatasetError("dataset.json: must hold a JSON object")
    parse_bool(info.get("synthetic", False), "dataset.json: synthetic")
    mask_format = info.get("mask_format", "auto")
    if mask_format not in ("auto", "label"):
        raise DatasetError(f"dataset.json: mask_format must be 'auto' or 'label', got {mask_format!r}")

    where: dict[tuple[str, str, str], str] = {}
    images: dict[str, _Image] = {}
    for path in sorted(images_dir.iterdir()):
        if path.name.startswith(".") or path.is_dir():
            continue
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            raise DatasetError(f"images/{path.name}: unsupported file type "
                               f"(expected {', '.join(IMAGE_SUFFIXES)})")
        image_id = check_id(path.stem, f"images/{path.name}", "image id")
        if image_id in images:
            raise DatasetError(f"images/{path.name}: a second image with id {image_id!r} "
                               f"(also {images[image_id].path.name})")
        sha, width, height = load_image(path)
        images[image_id] = _Image(image_id, path, sha, width, height)
        where[("images", key_json(image_id), "file")] = f"images/{path.name}"
    if not images:
        raise DatasetError(f"{images_dir}: no images")

    masks_dir = root / "masks"
    if masks_dir.is_dir():
        for path in sorted(masks_dir.iterdir()):
            if path.name.startswith(".") or path.is_dir():
                continue
            here = f"masks/{path.name}"
            if path.suffix.lower() != ".png":
                raise DatasetError(f"{here}: masks must be PNG files")
            check_id(path.stem, here, "image id")
            if path.stem not in images:
                raise DatasetError(f"{here}: mask for unknown image {path.stem!r} "
                                   "(no matching file in images/)")
            try:
                with Image.open(path) as im:
                    array = np.asarray(im)
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
                raise DatasetError(f"{here}: cannot be read as an image ({err})") from None
            img = images[path.stem]
            if array.shape[:2] != (img.height, img.width):
                raise DatasetError(f"{here}: mask size {array.shape[1]}×{array.shape[0]} differs "
                                   f"from image size {img.width}×{img.height}")
            img.labels = mask_to_labels(array, mask_format)

    wounds: dict[tuple[str, int], dict[str, Any]] = {}
    for img in images.values():
        if img.labels is not None:
            for index, outline in outlines(img.labels).items():
                wounds[(img.image_id, index)] = {"area": outline["area"], "bbox": outline["bbox"],
                                                 "outline": outline, "description": "", "metadata": {}}
                where[("wounds", key_json(wound_key(img.image_id, index)), "outline")] = \
                    f"masks/{img.image_id}.png"
    if (root / "wounds.csv").exists():
        seen: set[tuple[str, int]] = set()
        for line, row in read_csv(root / "wounds.csv", ("image_id", "wound_index", "description")):
            where_line = f"wounds.csv: line {line}"
            image_id = row["image_id"]
            if image_id not in images:
                raise DatasetError(f"{where_line}: image_id {image_id!r} is not in images/")
            try:
                index = int(row["wound_index"])
            except ValueError:
                raise DatasetError(f"{where_line}: wound_index {row['wound_index']!r} is not a whole "
                                   "number") from None
            if (image_id, index) in seen:
                raise DatasetError(f"{where_line}: wound {index} of {image_id!r} is listed twice")
            seen.add((image_id, index))
            if (image_id, index) not in wounds:
                raise DatasetError(f"{where_line}: wound_index {index} is not in the mask of "
                                   f"{image_id!r} (masks/{image_id}.png)")
            wounds[(image_id, index)].update(
                description=row["description"],
                metadata=row_metadata(row, ("image_id", "wound_index", "description")))
            for name in ("description", "metadata"):
                where[("wounds", key_json(wound_key(image_id, index)), name)] = where_line

    patients: dict[str, dict[str, Any]] = {}
    has_patients_csv = (root / "patients.csv").exists()
    if has_patients_csv:
        for line, row in read_csv(root / "patients.csv", ("patient_id",)):
            here = f"patients.csv: line {line}"
            pid = check_id(row["patient_id"], here, "patient_id")
            if pid in patients:
                raise DatasetError(f"{here}: patient_id {pid!r} is listed twice")
            patients[pid] = row_metadata(row, ("patient_id",))
            where[("patients", key_json(pid), "metadata")] = f"patients.csv: line {line}"
    if (root / "images.csv").exists():
        seen_images: set[str] = set()
        for line, row in read_csv(root / "images.csv", ("image_id", "patient_id")):
            here = f"images.csv: line {line}"
            image_id = row["image_id"]
            if image_id not in images:
                raise DatasetError(f"{here}: image_id {image_id!r} is not in images/")
            if image_id in seen_images:
                raise DatasetError(f"{here}: image_id {image_id!r} is listed twice")
            seen_images.add(image_id)
            pid = row["patient_id"] or None
            if pid is not None:
                check_id(pid, here, "patient_id")
                if pid not in patients:
                    if has_patients_csv:
                        raise DatasetError(f"{here}: patient_id {pid!r} is not in patients.csv")
                    patients[pid] = {}
            images[image_id].patient_id = pid
            images[image_id].metadata = row_metadata(row, ("image_id", "patient_id"))
            for name in ("patient_id", "metadata"):
                where[("images", key_json(image_id), name)] = here

    triplets: list[dict[str, Any]] = []
    if (root / "triplets.csv").exists():
        path = root / "triplets.csv"
        rows = read_csv(path, ("anchor", "ref_j", "ref_k", "choice"))
        occurrences: Counter = Counter()
        allowed = set(images) | set(known_images)
        for line, row in rows:
            here = f"triplets.csv: line {line}"
            ids = [row["anchor"], row["ref_j"], row["ref_k"]]
            for col, value in zip(("anchor", "ref_j", "ref_k"), ids):
                if value not in allowed:
                    raise DatasetError(f"{here}: {col} {value!r} is not a known image")
            if len(set(ids)) != 3:
                raise DatasetError(f"{here}: a triplet needs three different images, got "
                                   f"{', '.join(ids)}")
            if row["choice"] not in CHOICES:
                raise DatasetError(f"{here}: choice must be one of {', '.join(CHOICES)}, got "
                                   f"{row['choice']!r}")
            source = row.get("source", "")
            if not source:
                annotator = row.get("annotator", "")
                if not annotator:
                    raise DatasetError(f"{here}: annotator is empty (or give a source column)")
                source = f"expert:{annotator}"
            key = (source, *ids)
            rep_text = row.get("rep", "")
            try:
                rep = int(rep_text) if rep_text else occurrences[key]
                latency = float(row["latency_ms"]) if row.get("latency_ms") else None
            except ValueError:
                raise DatasetError(f"{here}: rep/latency_ms must be numbers") from None
            occurrences[key] += 1
            triplets.append({"anchor": ids[0], "ref_j": ids[1], "ref_k": ids[2],
                             "choice": row["choice"], "source": source, "rep": rep,
                             "latency_ms": latency, "created": row.get("created") or None})
            where[("triplets", key_json(triplet_key(triplets[-1])), "row")] = here
        dup = [k for k, n in Counter((t["source"], t["anchor"], t["ref_j"], t["ref_k"], t["rep"])
                                     for t in triplets).items() if n > 1]
        if dup:
            raise DatasetError(f"triplets.csv: the judgment {dup[0][1:4]} by {dup[0][0]} with "
                               f"rep {dup[0][4]} is listed twice")
    return DatasetPlan(root, images, patients, wounds, triplets, info, where)


# -- re-import merge ------------------------------------------------------------------------------
#: The field whose presence says a row exists, per entity.
_PRESENCE = {"patients": "metadata", "images": "file", "wounds": "outline", "triplets": "row"}
#: Fields per entity, in merge order: images are pruned only after their wounds and judgments.
_FIELDS = {"wounds": ("outline", "description", "metadata"), "triplets": ("row",),
           "images": ("file", "patient_id", "metadata"), "patients": ("metadata",)}
PREFER = ("app", "file")


class MergeConflict(DatasetError):
    """Rows changed both in the app and in the dataset since the last import."""

    def __init__(self, conflicts: list[Change]) -> None:
        self.conflicts = conflicts
        lines = "\n".join(f"  {c.describe()}" for c in conflicts)
        super().__init__(f"{len(conflicts)} conflict(s) between the app and the dataset; nothing was "
                         f"imported. Re-run with --prefer app or --prefer file:\n{lines}")


@dataclass
class Change:
    """One decision of the merge about one field of one row."""

    entity: str
    key: Any
    field: str
    action: str   # insert | update | delete | keep-app | keep-deleted | not-in-file | conflict
    where: str
    old: Any = None
    new: Any = None
    resolved: str | None = None  # for conflicts: "app" or "file"

    def describe(self) -> str:
        what = {"insert": "new", "update": "changed in the dataset", "delete": "removed (--prune)",
                "keep-app": "changed in the app since the last import: kept",
                "keep-deleted": "deleted in the app since the last import: stays deleted",
                "not-in-file": "no longer in the dataset: kept (--prune deletes it)",
                "conflict": "changed in the app AND in the dataset"}[self.action]
        text = f"{self.where}: {_label(self.entity, self.key)} {self.field}: {what}"
        if self.action in ("update", "conflict"):
            text += f" (app: {_short(self.old)}; file: {_short(self.new)})"
        if self.resolved:
            text += f" → {self.resolved} kept"
        return text


def _label(entity: str, key: Any) -> str:
    if entity == "wounds":
        return f"wound {key['wound_index']} of {key['image_id']}"
    if entity == "triplets":
        return f"judgment {key['anchor']}/{key['ref_j']}/{key['ref_k']} by {key['source']} (rep {key['rep']})"
    return f"{entity[:-1]} {key}"


def _short(value: Any) -> str:
    if isinstance(value, dict) and "png" in value:
        return f"outline of {value['area']} px at {value['bbox']}"
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _hash(field_name: str, value: Any) -> str:
    if field_name == "outline":
        return outline_hash(value) if value and "png" in value else "no-pixels"
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class _Merge:
    changes: list[Change]
    rows: dict[str, dict[Any, dict[str, Any] | None]]   # entity → key JSON → final row (None: delete)
    keys: dict[str, Any]                                # key JSON → key
    bases: list[tuple[str, Any, str, str | None]]
    masks: dict[str, np.ndarray]                       # image id → new label map

    @property
    def conflicts(self) -> list[Change]:
        return [c for c in self.changes if c.action == "conflict"]


def _file_rows(plan: DatasetPlan) -> dict[str, dict[str, dict[str, Any]]]:
    rows: dict[str, dict[str, dict[str, Any]]] = {
        "patients": {key_json(pid): {"metadata": meta} for pid, meta in plan.patients.items()},
        "images": {key_json(i.image_id): {"file": image_file_value(f"{i.image_id}{i.path.suffix.lower()}",
                                                                    i.sha256, i.width, i.height),
                                          "patient_id": i.patient_id, "metadata": i.metadata}
                   for i in plan.images.values()},
        "wounds": {key_json(wound_key(iid, idx)): {"outline": w["outline"], "description": w["description"],
                                                   "metadata": w["metadata"]}
                   for (iid, idx), w in plan.wounds.items()},
        "triplets": {key_json(triplet_key(t)): {"row": {"choice": t["choice"]}, "_t": t} for t in plan.triplets},
    }
    return rows


def _current_rows(ws: Workspace) -> tuple[dict[str, dict[str, dict[str, Any]]],
                                                               dict[str, np.ndarray]]:
    store = ws.store
    labels: dict[str, np.ndarray] = {}
    wounds: dict[str, dict[str, Any]] = {}
    by_image: dict[str, list[dict]] = {}
    for w in store.wounds():
        by_image.setdefault(w["image_id"], []).append(w)
    for iid, rows in by_image.items():
        labels[iid] = ws.load_mask(iid)
        found = outlines(labels[iid])
        for w in rows:
            wounds[key_json(wound_key(iid, w["wound_index"]))] = {
                "outline": found.get(w["wound_index"]) or {"area": 0, "bbox": [0, 0, 0, 0]},
                "description": w["description"], "metadata": w["metadata"]}
    return {
        "patients": {key_json(p["patient_id"]): {"metadata": p["metadata"]} for p in store.patients()},
        "images": {key_json(i["image_id"]): {"file": image_file_value(i["file"], i["sha256"], i["width"],
                                                                       i["height"]),
                                             "patient_id": i["patient_id"], "metadata": i["metadata"]}
                   for i in store.images()},
        "wounds": wounds,
        "triplets": {key_json(triplet_key(t)): {"row": {"choice": t["choice"]}, "_id": t["id"]}
                     for t in store.triplets()},
    }, labels


def plan_merge(ws: Workspace, plan: DatasetPlan, prefer: str | None = None, prune: bool = False) -> _Merge:
    """Three-way merge of the dataset (file), the workspace (app) and what the last import read
    (base): a field changed only in the file is updated, one changed only in the app is kept, one
    changed on both sides is a conflict (``prefer`` resolves it). Rows gone from the file are
    deleted only with ``prune`` and only when the import brought them; outlines drawn in the app
    are never deleted. Reads only; :func:`import_dataset` writes the result."""
    if prefer not in (None, *PREFER):
        raise DatasetError(f"--prefer must be one of {', '.join(PREFER)}, got {prefer!r}")
    bases = ws.store.import_bases()
    file_rows = _file_rows(plan)
    current, labels = _current_rows(ws)
    changes: list[Change] = []
    final: dict[str, dict[str, dict[str, Any] | None]] = {e: {} for e in _FIELDS}
    keys: dict[str, Any] = {}
    new_bases: list[tuple[str, Any, str, str | None]] = []
    for entity, fields in _FIELDS.items():
        presence = _PRESENCE[entity]
        for kj in [*file_rows[entity], *(k for k in current[entity] if k not in file_rows[entity])]:
            key = json.loads(kj)
            keys[kj] = key
            f, c = file_rows[entity].get(kj), current[entity].get(kj)
            base = {name: bases.get((entity, kj, name)) for name in fields}
            where = plan.where.get((entity, kj, presence)) or "workspace"
            if f is None:
                if base[presence] is None:
                    continue  # made in the app: never touched by an import
                if not prune or entity == "patients" or (entity == "images" and _in_use(key, current, final)):
                    changes.append(Change(entity, key, presence, "not-in-file", where))
                    continue
                if all(base[n] == _hash(n, c[n]) for n in fields):
                    changes.append(Change(entity, key, presence, "delete", where, old=c[presence]))
                else:  # changed in the app, removed from the dataset
                    changes.append(Change(entity, key, presence, "conflict", where, c[presence], None,
                                          resolved=prefer))
                    if prefer != "file":
                        continue
                final[entity][kj] = None
                new_bases.extend((entity, key, n, None) for n in fields)
                continue
            file_hashes = {n: _hash(n, f[n]) for n in fields}
            new_bases.extend((entity, key, n, file_hashes[n]) for n in fields)
            if c is None:
                if base[presence] is not None and all(base[n] in (None, file_hashes[n]) for n in fields):
                    changes.append(Change(entity, key, presence, "keep-deleted", where))
                    continue
                if base[presence] is not None:  # deleted in the app, changed in the file
                    changes.append(Change(entity, key, presence, "conflict", where, None, f[presence],
                                          resolved=prefer))
                    if prefer != "file":
                        continue
                else:
                    changes.append(Change(entity, key, presence, "insert", where, None, f[presence]))
                final[entity][kj] = dict(f)
                continue
            row = dict(c)
            changed = False
            for n in fields:
                hf, hc = file_hashes[n], _hash(n, c[n])
                if hf == hc:
                    continue
                here = plan.where.get((entity, kj, n), where)
                if base[n] == hf:
                    changes.append(Change(entity, key, n, "keep-app", here, c[n], f[n]))
                elif base[n] is not None and base[n] == hc:
                    changes.append(Change(entity, key, n, "update", here, c[n], f[n]))
                    row[n], changed = f[n], True
                else:
                    changes.append(Change(entity, key, n, "conflict", here, c[n], f[n], resolved=prefer))
                    if prefer == "file":
                        row[n], changed = f[n], True
            if changed:
                final[entity][kj] = row
    masks = _merge_masks(plan, final["wounds"], keys, current["wounds"], labels, changes)
    return _Merge(changes, final, keys, new_bases, masks)


def _in_use(image_id: str, current: dict, final: dict) -> bool:
    """Whether a wound or judgment that stays after the merge names the photo."""
    for kj in current["wounds"]:
        if json.loads(kj)["image_id"] == image_id and final["wounds"].get(kj, {}) is not None:
            return True
    for kj in current["triplets"]:
        k = json.loads(kj)
        if image_id in (k["anchor"], k["ref_j"], k["ref_k"]) and final["triplets"].get(kj, {}) is not None:
            return True
    return False


def _merge_masks(plan: DatasetPlan, wounds: dict[str, dict | None], keys: dict[str, Any],
                 current: dict[str, dict], labels: dict[str, np.ndarray], changes: list[Change]) -> dict:
    """New label maps of the photos whose outlines the merge changes: the dataset's outlines
    first, the app's on top (an outline drawn in the app never loses a pixel to an import)."""
    touched = {keys[kj]["image_id"] for kj in wounds}
    masks: dict[str, np.ndarray] = {}
    for iid in sorted(touched):
        img = plan.images.get(iid)
        shape = (img.height, img.width) if img is not None else labels[iid].shape
        old = labels.get(iid, np.zeros(shape, dtype=np.int32))
        new = np.zeros(shape, dtype=np.int32)
        app_indices = []
        for kj, row in current.items():
            key = keys.get(kj) or json.loads(kj)
            if key["image_id"] != iid:
                continue
            if kj in wounds:
                target = wounds[kj]  # a merged row keeps the very outline object it took
                if target is None or target["outline"] is not row["outline"]:
                    continue  # deleted, or its outline comes from the file
            app_indices.append(key["wound_index"])
        for kj, row in wounds.items():
            key = keys[kj]
            if key["image_id"] == iid and row is not None and key["wound_index"] not in app_indices:
                index = key["wound_index"]
                new[img.labels == index] = index
        for index in app_indices:
            if old.shape == new.shape:
                new[old == index] = index
        found = outlines(new)
        for kj, row in wounds.items():
            key = keys[kj]
            if key["image_id"] != iid or row is None:
                continue
            outline = found.get(key["wound_index"])
            if outline is None:
                changes.append(Change("wounds", key, "outline", "keep-app", "masks/" + iid + ".png",
                                      None, row["outline"]))
                wounds[kj] = {"skip": True}
            else:
                row["outline"] = outline
        if not np.array_equal(new, old):
            masks[iid] = new
    return masks


def check_kind(ws: Workspace, synthetic: bool) -> None:
    """Keep synthetic (phantom) and real data apart: refuse real photos in a synthetic workspace
    and a synthetic dataset in a real workspace that already holds photos."""
    if not ws.store.images():
        return
    if ws.is_synthetic and not synthetic:
        raise DatasetError(f"{ws.root}: this workspace holds the SYNTHETIC demo; import real photos into a "
                           "new, empty workspace (--workspace) so the two are never mixed")
    if not ws.is_synthetic and synthetic:
        raise DatasetError(f"{ws.root}: this workspace holds real photos; build or import the SYNTHETIC "
                           "demo into a new, empty workspace (--workspace) instead")


def import_dataset(ws: Workspace, root: str | Path, *, prefer: str | None = None, dry_run: bool = False,
                   prune: bool = False, study_ids: str | Path | None = None, actor: str = "import") -> dict[str, Any]:
    """Validate a dataset folder, then merge it into ``ws`` (see :func:`plan_merge`); idempotent.

    Atomic end to end: photos and masks are written to a staging folder inside the workspace,
    the store changes in one transaction (whatever the wait for its lock), and the files are
    renamed into place before it commits; on any error nothing has changed. ``dry_run`` reports
    and writes nothing. ``study_ids`` names a CSV (outside the workspace's images/) mapping
    original photo names to study ids; the workspace then only sees the study ids. Returns a
    summary with every change (``changes``: one line each)."""
    store = ws.store
    known = {r["image_id"] for r in store.images()}
    mapping = None
    if study_ids is not None:
        mapping = StudyIds(ws, study_ids)
        known |= set(mapping.ids)
    plan = validate_dataset(root, known_images=known)
    if mapping is not None:
        mapping.apply(plan)
    check_kind(ws, plan.synthetic)
    if dry_run:
        return _summary(ws, plan, plan_merge(ws, plan, prefer, prune), 0, dry_run=True)
    staging = Path(tempfile.mkdtemp(prefix=".import-", dir=ws.root))
    swapped: list[tuple[Path, Path | None]] = []
    try:
        staged = _stage_photos(ws, plan, staging)
        with store.transaction():
            merge = plan_merge(ws, plan, prefer, prune)
            if merge.conflicts and prefer is None:
                raise MergeConflict(merge.conflicts)
            for iid, labels in merge.masks.items():
                path = staging / "masks" / f"{iid}.png"
                path.parent.mkdir(exist_ok=True)
                _write_label_png(path, labels)
                staged.append((path, ws.mask_path(iid)))
            if (plan.root / "truth").is_dir():
                shutil.copytree(plan.root / "truth", staging / "truth")
                staged.append((staging / "truth", ws.truth_dir))
            new_triplets = _apply(ws, plan, merge, actor)
            if mapping is not None:
                mapping.save()
            swapped = _swap_in(staged, staging / "replaced")
    except sqlite3.OperationalError as err:
        _swap_back(swapped)
        raise DatasetError(f"{ws.root / 'triderm.sqlite'}: {err} (another process held it too long); "
                           "nothing was imported, try again") from None
    except BaseException:
        _swap_back(swapped)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _summary(ws, plan, merge, new_triplets, dry_run=False)


def _stage_photos(ws: Workspace, plan: DatasetPlan, staging: Path) -> list[tuple[Path, Path]]:
    """Copy the photos that are new or changed into ``staging``; (staged, target) pairs."""
    staged = []
    (staging / "images").mkdir()
    for img in plan.images.values():
        target = ws.images_dir / f"{img.image_id}{img.path.suffix.lower()}"
        if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == img.sha256:
            continue
        tmp = staging / "images" / target.name
        shutil.copyfile(img.path, tmp)
        staged.append((tmp, target))
    return staged


def _write_label_png(path: Path, labels: np.ndarray) -> None:
    dtype = np.uint8 if labels.max(initial=0) <= 255 else np.uint16
    with atomic_write(path, "wb", suffix=".png") as fh:
        Image.fromarray(labels.astype(dtype)).save(fh, format="PNG")


def _swap_in(staged: list[tuple[Path, Path]], replaced: Path) -> list[tuple[Path, Path | None]]:
    """Rename staged files over their targets, the replaced ones into ``replaced``; returns what
    :func:`_swap_back` needs. On error every replaced file is put back."""
    done: list[tuple[Path, Path | None]] = []
    replaced.mkdir()
    try:
        for n, (src, target) in enumerate(staged):
            backup = None
            if target.exists():
                backup = replaced / f"{n}-{target.name}"
                os.replace(target, backup)
            done.append((target, backup))
            os.replace(src, target)
    except BaseException:
        _swap_back(done)
        raise
    return done


def _swap_back(done: list[tuple[Path, Path | None]]) -> None:
    """Undo :func:`_swap_in`: remove the new files and put the replaced ones back."""
    for target, backup in reversed(done):
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink()
        if backup is not None:
            os.replace(backup, target)
    done.clear()


def _apply(ws: Workspace, plan: DatasetPlan, merge: _Merge, actor: str) -> int:
    """Write the merge's rows (inside the caller's transaction); returns new judgments."""
    store = ws.store
    rows, keys = merge.rows, merge.keys
    for kj, row in rows["patients"].items():
        if row is not None:
            store.upsert_patient(keys[kj], row["metadata"], actor=actor)
    for kj, row in rows["images"].items():
        if row is not None:
            fv = row["file"]
            store.upsert_image(keys[kj], fv["file"], fv["sha256"], fv["width"], fv["height"], row["patient_id"],
                               row["metadata"], actor=actor)
    for kj, row in rows["wounds"].items():
        key = keys[kj]
        if row is None:
            store.delete_wound(key["image_id"], key["wound_index"], actor=actor)
        elif "skip" not in row:
            o = row["outline"]
            store.upsert_wound(key["image_id"], key["wound_index"], o["area"], o["bbox"], row["description"],
                               row["metadata"], actor=actor, outline=o)
    new_triplets = 0
    for kj, row in rows["triplets"].items():
        if row is None:
            tid = store.db.execute(
                "SELECT id FROM triplets WHERE source = ? AND anchor = ? AND ref_j = ? AND ref_k = ? AND rep = ?",
                [keys[kj][k] for k in ("source", "anchor", "ref_j", "ref_k", "rep")]).fetchone()
            if tid:
                store.delete_triplet(tid[0], actor=actor)
            continue
        t = next(t for t in plan.triplets if key_json(triplet_key(t)) == kj) if "_t" not in row else row["_t"]
        if "_id" in row:  # the dataset changed the choice: replace the judgment
            store.delete_triplet(row["_id"], actor=actor)
        if t["source"].startswith("expert:"):
            store.add_annotator(t["source"].split(":", 1)[1])
        if store.add_triplet(t["anchor"], t["ref_j"], t["ref_k"], t["choice"], t["source"],
                             latency_ms=t["latency_ms"], rep=t["rep"], created=t["created"], actor=actor):
            new_triplets += 1
    for entity, key, name, value_hash in merge.bases:
        store.set_import_base(entity, key, name, value_hash)
    for kj, row in rows["images"].items():
        if row is None:
            store.delete_image(keys[kj], actor=actor)
    if "name" in plan.info:
        store.set_meta("dataset_name", plan.info["name"])
    if "synthetic" in plan.info:
        store.set_meta("synthetic", plan.synthetic)
    return new_triplets


def _summary(ws: Workspace, plan: DatasetPlan, merge: _Merge, new_triplets: int, dry_run: bool) -> dict[str, Any]:
    counts = Counter(c.action for c in merge.changes)
    return {"images": len(plan.images), "patients": len(plan.patients), "wounds": len(plan.wounds),
            "triplets": len(plan.triplets), "new_triplets": new_triplets, "dry_run": dry_run,
            "merge": {a: counts.get(a, 0) for a in ("insert", "update", "delete", "keep-app", "keep-deleted",
                                                    "not-in-file", "conflict")},
            "changes": [c.describe() for c in merge.changes],
            "synthetic": plan.synthetic if dry_run else ws.is_synthetic, "workspace": str(ws.root)}


def _write_csv(path: Path, fixed: list[str], rows: list[dict[str, Any]]) -> None:
    extra = sorted({k for r in rows for k in r} - set(fixed))
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fixed + extra)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def export_dataset(ws: Workspace, out: str | Path) -> dict[str, Any]:
    """Write the workspace as a dataset folder (label-map masks) that imports back losslessly."""
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "masks").mkdir(exist_ok=True)
    store = ws.store
    images = store.images()
    wounds = store.wounds()
    with_wounds = {w["image_id"] for w in wounds}
    for img in images:
        shutil.copyfile(ws.images_dir / img["file"], out / "images" / img["file"])
        if img["image_id"] in with_wounds or ws.mask_path(img["image_id"]).exists():
            labels = ws.load_mask(img["image_id"])
            dtype = np.uint8 if labels.max(initial=0) <= 255 else np.uint16
            Image.fromarray(labels.astype(dtype)).save(out / "masks" / f"{img['image_id']}.png")
    _write_csv(out / "wounds.csv", ["image_id", "wound_index", "description"],
               [{"image_id": w["image_id"], "wound_index": w["wound_index"],
                 "description": w["description"], **w["metadata"]} for w in wounds])
    _write_csv(out / "images.csv", ["image_id", "patient_id"],
               [{"image_id": i["image_id"], "patient_id": i["patient_id"], **i["metadata"]}
                for i in images])
    patients = store.patients()
    _write_csv(out / "patients.csv", ["patient_id"],
               [{"patient_id": p["patient_id"], **p["metadata"]} for p in patients])
    triplets = store.triplets()
    _write_csv(out / "triplets.csv",
               ["anchor", "ref_j", "ref_k", "choice", "annotator", "source", "rep", "latency_ms",
                "created"],
               [{"anchor": t["anchor"], "ref_j": t["ref_j"], "ref_k": t["ref_k"],
                 "choice": t["choice"],
                 "annotator": t["source"].split(":", 1)[1] if t["source"].startswith("expert:") else "",
                 "source": t["source"], "rep": t["rep"],
                 "latency_ms": "" if t["latency_ms"] is None else repr(t["latency_ms"]),
                 "created": t["created"]} for t in triplets])
    (out / "dataset.json").write_text(json.dumps(
        {"name": ws.dataset_name, "synthetic": ws.is_synthetic, "mask_format": "label"}, indent=2))
    if ws.truth_dir.is_dir():
        shutil.copytree(ws.truth_dir, out / "truth", dirs_exist_ok=True)
    return {"images": len(images), "patients": len(patients), "wounds": len(wounds),
            "triplets": len(triplets), "out": str(out)}
