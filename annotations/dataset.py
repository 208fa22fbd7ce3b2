"""Dataset folders: the one on-disk format for import, export and the demo.

```
images/<image_id>.(png|jpg|jpeg|tif|tiff)
masks/<image_id>.png   label map (0 skin, 1..N wound) or binary (0/1, 0/255; L or RGB)
wounds.csv             image_id, wound_index, description, [metadata…]
images.csv             image_id, patient_id, [metadata…]             (optional)
patients.csv           patient_id, [metadata…]                       (optional)
triplets.csv           anchor, ref_j, ref_k, choice, annotator, [source, rep, latency_ms, created]
dataset.json           {"name", "synthetic", "mask_format": "label"|"auto"|"binary",
                        "columns": {"age": "int", …}}   (optional; see annotations.readers)
truth/                 latent truth of synthetic datasets                (optional, copied as is)
```
Everything is validated before anything is written: bad input raises one
:class:`DatasetError` naming the file, row and field, and leaves the workspace untouched.
"""
from __future__ import annotations

import csv
import hashlib
import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from annotations.fileio import write_bytes
from annotations.readers import (
    IMAGE_SUFFIXES,
    DatasetError,
    DatasetFolder,
    Photo,
    check_id,
    column_schema,
    read_csv,
    read_info,
    read_mask,
    read_photo,
    row_metadata,
)
from annotations.store import CHOICES
from annotations.workspace import Workspace


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
    photo: Photo | None = None


@dataclass
class DatasetPlan:
    """A fully validated dataset, ready to be written."""

    root: Path
    images: dict[str, _Image]
    patients: dict[str, dict[str, Any]]
    wounds: dict[tuple[str, int], dict[str, Any]]
    triplets: list[dict[str, Any]]
    info: dict[str, Any]
    dropped: list[dict[str, Any]] = field(default_factory=list)


def validate_dataset(root: str | Path, known_images: set[str] = frozenset(), keep_metadata: bool = False,
                     min_wound_area: int = 0) -> DatasetPlan:
    """Read and check a whole dataset folder; raises :class:`DatasetError` on the first problem.

    ``known_images`` are ids already in the target workspace (triplets may name them)."""
    folder = DatasetFolder(root)
    root = folder.root
    images_dir = root / "images"
    if not images_dir.is_dir():
        raise DatasetError(f"{root}: no images/ folder")
    info = read_info(folder)
    mask_format, columns = info["mask_format"], info["columns"]
    dropped: list[dict[str, Any]] = []

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
        photo = read_photo(folder, path, keep_metadata)
        images[image_id] = _Image(image_id, path, photo.sha256, photo.width, photo.height,
                                  metadata=photo.metadata, photo=photo)
    if not images:
        raise DatasetError(f"{images_dir}: no images")

    masks_dir = root / "masks"
    wounds: dict[tuple[str, int], dict[str, Any]] = {}
    if masks_dir.is_dir():
        for path in sorted(masks_dir.iterdir()):
            if path.name.startswith(".") or path.is_dir():
                continue
            where = f"masks/{path.name}"
            if path.suffix.lower() != ".png":
                raise DatasetError(f"{where}: masks must be PNG files")
            check_id(path.stem, where, "image id")
            if path.stem not in images:
                raise DatasetError(f"{where}: mask for unknown image {path.stem!r} "
                                   "(no matching file in images/)")
            img = images[path.stem]
            mask = read_mask(folder, path, img.photo, mask_format, min_wound_area)
            img.labels = mask.labels
            dropped += mask.dropped
            for index, (area, bbox) in mask.geometry.items():
                wounds[(img.image_id, index)] = {"area": area, "bbox": bbox, "description": "", "metadata": {}}

    if (root / "wounds.csv").exists():
        seen: set[tuple[str, int]] = set()
        for line, row in read_csv(folder, root / "wounds.csv", ("image_id", "wound_index", "description"),
                                  columns):
            where = f"wounds.csv: line {line}"
            image_id = row["image_id"]
            if image_id not in images:
                raise DatasetError(f"{where}: image_id {image_id!r} is not in images/")
            try:
                index = int(row["wound_index"])
            except ValueError:
                raise DatasetError(f"{where}: wound_index {row['wound_index']!r} is not a whole "
                                   "number") from None
            if (image_id, index) in seen:
                raise DatasetError(f"{where}: wound {index} of {image_id!r} is listed twice")
            seen.add((image_id, index))
            if (image_id, index) not in wounds:
                small = [d["area"] for d in dropped
                         if d["file"] == f"masks/{image_id}.png" and d.get("wound_index") == index]
                raise DatasetError(f"{where}: wound_index {index} is not in the mask of {image_id!r} "
                                   f"(masks/{image_id}.png)" + (f": its {small[0]} px are under the workspace's "
                                   f"minimum wound area of {min_wound_area} px" if small else ""))
            wounds[(image_id, index)].update(
                description=row["description"],
                metadata=row_metadata(row, ("image_id", "wound_index", "description")))

    patients: dict[str, dict[str, Any]] = {}
    has_patients_csv = (root / "patients.csv").exists()
    if has_patients_csv:
        for line, row in read_csv(folder, root / "patients.csv", ("patient_id",), columns):
            where = f"patients.csv: line {line}"
            pid = check_id(row["patient_id"], where, "patient_id")
            if pid in patients:
                raise DatasetError(f"{where}: patient_id {pid!r} is listed twice")
            patients[pid] = row_metadata(row, ("patient_id",))
    if (root / "images.csv").exists():
        seen_images: set[str] = set()
        for line, row in read_csv(folder, root / "images.csv", ("image_id", "patient_id"), columns):
            where = f"images.csv: line {line}"
            image_id = row["image_id"]
            if image_id not in images:
                raise DatasetError(f"{where}: image_id {image_id!r} is not in images/")
            if image_id in seen_images:
                raise DatasetError(f"{where}: image_id {image_id!r} is listed twice")
            seen_images.add(image_id)
            pid = row["patient_id"] or None
            if pid is not None:
                check_id(pid, where, "patient_id")
                if pid not in patients:
                    if has_patients_csv:
                        raise DatasetError(f"{where}: patient_id {pid!r} is not in patients.csv")
                    patients[pid] = {}
            images[image_id].patient_id = pid
            images[image_id].metadata = {**row_metadata(row, ("image_id", "patient_id")),
                                         **images[image_id].metadata}

    triplets: list[dict[str, Any]] = []
    if (root / "triplets.csv").exists():
        path = root / "triplets.csv"
        rows = read_csv(folder, path, ("anchor", "ref_j", "ref_k", "choice"), columns)
        occurrences: Counter = Counter()
        allowed = set(images) | set(known_images)
        for line, row in rows:
            where = f"triplets.csv: line {line}"
            ids = [row["anchor"], row["ref_j"], row["ref_k"]]
            for col, value in zip(("anchor", "ref_j", "ref_k"), ids):
                if value not in allowed:
                    raise DatasetError(f"{where}: {col} {value!r} is not a known image")
            if len(set(ids)) != 3:
                raise DatasetError(f"{where}: a triplet needs three different images, got "
                                   f"{', '.join(ids)}")
            if row["choice"] not in CHOICES:
                raise DatasetError(f"{where}: choice must be one of {', '.join(CHOICES)}, got "
                                   f"{row['choice']!r}")
            source = row.get("source", "")
            if not source:
                annotator = row.get("annotator", "")
                if not annotator:
                    raise DatasetError(f"{where}: annotator is empty (or give a source column)")
                source = f"expert:{annotator}"
            key = (source, *ids)
            rep_text = row.get("rep", "")
            try:
                rep = int(rep_text) if rep_text else occurrences[key]
                latency = float(row["latency_ms"]) if row.get("latency_ms") else None
            except ValueError:
                raise DatasetError(f"{where}: rep/latency_ms must be numbers") from None
            occurrences[key] += 1
            triplets.append({"anchor": ids[0], "ref_j": ids[1], "ref_k": ids[2],
                             "choice": row["choice"], "source": source, "rep": rep,
                             "latency_ms": latency, "created": row.get("created") or None})
        dup = [k for k, n in Counter((t["source"], t["anchor"], t["ref_j"], t["ref_k"], t["rep"])
                                     for t in triplets).items() if n > 1]
        if dup:
            raise DatasetError(f"triplets.csv: the judgment {dup[0][1:4]} by {dup[0][0]} with "
                               f"rep {dup[0][4]} is listed twice")
    return DatasetPlan(root, images, patients, wounds, triplets, info, dropped)


def import_dataset(ws: Workspace, root: str | Path, keep_metadata: bool = False) -> dict[str, Any]:
    """Validate then import a dataset folder into ``ws``; idempotent. Returns a summary.

    Photos are stored upright and without identifying metadata unless ``keep_metadata``."""
    store = ws.store
    plan = validate_dataset(root, known_images={r["image_id"] for r in store.images()},
                            keep_metadata=keep_metadata, min_wound_area=ws.min_wound_area)
    for img in plan.images.values():  # files first (atomic renames); the store in one transaction
        target = ws.images_dir / f"{img.image_id}{img.path.suffix.lower()}"
        if not target.exists() or hashlib.sha256(target.read_bytes()).hexdigest() != img.sha256:
            write_bytes(target, img.photo.data)
        if img.labels is not None:
            ws.save_mask(img.image_id, img.labels)
    if (plan.root / "truth").is_dir():
        shutil.copytree(plan.root / "truth", ws.truth_dir, dirs_exist_ok=True)
    with store.transaction():
        for pid, meta in plan.patients.items():
            store.upsert_patient(pid, meta)
        for img in plan.images.values():
            store.upsert_image(img.image_id, f"{img.image_id}{img.path.suffix.lower()}", img.sha256,
                               img.width, img.height, img.patient_id, img.metadata)
            if img.labels is not None:
                stale = {w["wound_index"] for w in store.wounds(img.image_id)} - {
                    i for (iid, i) in plan.wounds if iid == img.image_id}
                for index in stale:
                    store.delete_wound(img.image_id, index)
        for (image_id, index), w in plan.wounds.items():
            store.upsert_wound(image_id, index, w["area"], w["bbox"], w["description"], w["metadata"])
        for name in sorted({t["source"].split(":", 1)[1] for t in plan.triplets if t["source"].startswith("expert:")}):
            store.add_annotator(name)
        new_triplets = store.add_triplets(plan.triplets)
        if "name" in plan.info:
            store.set_meta("dataset_name", plan.info["name"])
        if "synthetic" in plan.info:
            store.set_meta("synthetic", bool(plan.info["synthetic"]))
    return {"images": len(plan.images), "patients": len(plan.patients), "wounds": len(plan.wounds),
            "triplets": len(plan.triplets), "new_triplets": new_triplets, "dropped_wounds": plan.dropped,
            "synthetic": ws.is_synthetic, "workspace": str(ws.root)}


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
        {"name": ws.dataset_name, "synthetic": ws.is_synthetic, "mask_format": "label",
         "columns": column_schema([[w["metadata"] for w in wounds], [i["metadata"] for i in images],
                                   [p["metadata"] for p in patients]])}, indent=2))
    if ws.truth_dir.is_dir():
        shutil.copytree(ws.truth_dir, out / "truth", dirs_exist_ok=True)
    return {"images": len(images), "patients": len(patients), "wounds": len(wounds),
            "triplets": len(triplets), "out": str(out)}
