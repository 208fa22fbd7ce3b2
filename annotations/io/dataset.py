"""Dataset folders: the one on-disk format for import, export and the demo.

```
images/<image_id>.(png|jpg|jpeg|tif|tiff)
masks/<image_id>.png   label map (0 skin, 1..N wound) or binary (0/1, 0/255; L or RGB)
wounds.csv             image_id, wound_index, description, [metadata…]
images.csv             image_id, patient_id, [metadata…]             (optional)
patients.csv           patient_id, [metadata…]                       (optional)
triplets.csv           anchor, ref_j, ref_k, choice, annotator, [source, rep, latency_ms, created]
dataset.json           {"name", "synthetic", "mask_format": "label"|"auto"|"binary",
                        "columns": {"age": "int", …}}   (optional; see annotations.io.readers)
truth/                 latent truth of synthetic datasets                (optional, copied as is)
```
Everything is validated before anything is written: bad input raises one
:class:`DatasetError` naming the file, row and field, and leaves the workspace untouched.

A re-import is a merge, never an overwrite (:func:`plan_merge`): the store remembers what each
import read (``import_base``), so a field changed only in the app is kept, one changed only in
the dataset is updated, and one changed on both sides is a :class:`MergeConflict` (file, line,
field) until ``prefer`` says which side wins. Rows are deleted only with ``prune``, outlines
drawn in the app never, and every write is a revision with actor ``import``. An optional CSV left
out means "no change" for the fields it gives (:data:`_FIELDS_OF_FILE`); a folder that is the
workspace, or lies inside it, is refused. The files go in through a journalled swap
(:mod:`annotations.infra.journal`) committed with the rows.
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from annotations.accounts.privacy import StudyIds
from annotations.followup.followup_fields import RULER, VISIT_DATE, check_tracks, marker_spec, parse_visit_date
from annotations.followup.measure import Ruler, ruler_calibration
from annotations.infra.fileio import LinkError, atomic_write, copy_file, copy_tree
from annotations.infra.journal import Swap
from annotations.infra.workspace import Workspace, outline_hash, outline_pixels, outlines
from annotations.io.csvsafe import safe_row
from annotations.io.readers import (DatasetError, DatasetFolder, Photo, check_id, clear_error, column_schema, iter_csv,
                                    parse_bool, parse_int, parse_number, parse_timestamp, photo_id, read_csv, read_info,
                                    read_mask, read_photo, row_metadata)
from annotations.store.imports import DuplicateJudgment, JudgmentTable
from annotations.store.rows import StoreError, image_file_value, key_json, now, triplet_key, wound_key
from annotations.store.store import CHOICES


@dataclass
class _Image:
    image_id: str
    path: Path
    sha256: str
    width: int
    height: int
    patient_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    photo: Photo | None = None  # size and orientation; its bytes are dropped once spooled
    spooled: Path | None = None  # the stored form of the photo, written during validation


@dataclass
class DatasetPlan:
    """A fully validated dataset, ready to be written."""

    root: Path
    images: dict[str, _Image]
    patients: dict[str, dict[str, Any]]
    wounds: dict[tuple[str, int], dict[str, Any]]
    triplets: TripletTable
    info: dict[str, Any]
    #: ``(entity, key JSON, field) → "file: line n"``: where each imported value was read (judgments:
    #: their ``line`` in :attr:`triplets`).
    where: dict[tuple[str, str, str], str] = field(default_factory=dict)
    #: Mask components under the workspace's minimum wound area, reported and left out.
    dropped: list[dict[str, Any]] = field(default_factory=list)
    #: ``(entity, field)`` pairs whose file is absent: a re-import leaves them as they are.
    absent: set[tuple[str, str]] = field(default_factory=set)

    @property
    def synthetic(self) -> bool:
        """Whether ``dataset.json`` marks the dataset SYNTHETIC."""
        return parse_bool(self.info.get("synthetic", False), "dataset.json: synthetic")


def validate_dataset(root: str | Path, known_images: Set[str] = frozenset(), keep_metadata: bool = False,
                     min_wound_area: int = 0, spool: Path | None = None) -> DatasetPlan:
    """Read and check a whole dataset folder; raises :class:`DatasetError` on the first problem.

    ``known_images`` are ids already in the target workspace (triplets may name them). Memory stays
    bounded by the largest photo: each photo's stored form goes to ``spool`` (a folder; dropped
    without one), each mask is reduced to its wounds' outlines, and the judgments go to a
    temporary SQLite file (:class:`TripletTable`)."""
    folder = DatasetFolder(root)
    root = folder.root
    images_dir = root / "images"
    if not images_dir.is_dir():
        raise DatasetError(f"{root}: no images/ folder")
    info = read_info(folder)
    mask_format, columns = info["mask_format"], info["columns"]
    dropped: list[dict[str, Any]] = []

    where: dict[tuple[str, str, str], str] = {}
    images: dict[str, _Image] = {}
    for path in folder.files("images"):
        image_id = photo_id(path.name, f"images/{path.name}")
        if image_id in images:
            raise DatasetError(f"images/{path.name}: a second image with id {image_id!r} "
                               f"(also {images[image_id].path.name})")
        photo = read_photo(folder, path, keep_metadata)
        spooled = None
        if spool is not None:
            spool.mkdir(parents=True, exist_ok=True)
            spooled = spool / f"{image_id}{path.suffix.lower()}"
            spooled.write_bytes(photo.data)
        images[image_id] = _Image(image_id, path, photo.sha256, photo.width, photo.height,
                                  metadata=photo.metadata, photo=replace(photo, data=b""), spooled=spooled)
        where[("images", key_json(image_id), "file")] = f"images/{path.name}"
    if not images:
        raise DatasetError(f"{images_dir}: no images")

    wounds: dict[tuple[str, int], dict[str, Any]] = {}
    masks_dir = root / "masks"
    if masks_dir.is_dir():
        for path in folder.files("masks"):
            here = f"masks/{path.name}"
            if path.suffix.lower() != ".png":
                raise DatasetError(f"{here}: masks must be PNG files")
            check_id(path.stem, here, "image id")
            if path.stem not in images:
                raise DatasetError(f"{here}: mask for unknown image {path.stem!r} "
                                   "(no matching file in images/)")
            img = images[path.stem]
            assert img.photo is not None  # kept (without its bytes) when the image was read above
            mask = read_mask(folder, path, img.photo, mask_format, min_wound_area)
            dropped += mask.dropped
            for index, outline in outlines(mask.labels).items():
                wounds[(img.image_id, index)] = {"area": outline["area"], "bbox": outline["bbox"],
                                                 "outline": outline, "description": "", "metadata": {}}
                where[("wounds", key_json(wound_key(img.image_id, index)), "outline")] = here
    order = {iid: n for n, iid in enumerate(images)}
    wounds = dict(sorted(wounds.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])))  # photo order
    if (root / "wounds.csv").exists():
        seen: set[tuple[str, int]] = set()
        for line, row in read_csv(folder, root / "wounds.csv", ("image_id", "wound_index", "description"),
                                  columns):
            where_line = f"wounds.csv: line {line}"
            image_id = row["image_id"]
            if image_id not in images:
                raise DatasetError(f"{where_line}: image_id {image_id!r} is not in images/")
            index = parse_int(row["wound_index"], f"{where_line}: wound_index", minimum=1)
            if (image_id, index) in seen:
                raise DatasetError(f"{where_line}: wound {index} of {image_id!r} is listed twice")
            seen.add((image_id, index))
            if (image_id, index) not in wounds:
                small = [d["area"] for d in dropped
                         if d["file"] == f"masks/{image_id}.png" and d.get("wound_index") == index]
                raise DatasetError(f"{where_line}: wound_index {index} is not in the mask of {image_id!r} "
                                   f"(masks/{image_id}.png)" + (f": its {small[0]} px are under the workspace's "
                                   f"minimum wound area of {min_wound_area} px" if small else ""))
            wounds[(image_id, index)].update(
                description=row["description"],
                metadata=row_metadata(row, ("image_id", "wound_index", "description")))
            for name in ("description", "metadata"):
                where[("wounds", key_json(wound_key(image_id, index)), name)] = where_line

    patients: dict[str, dict[str, Any]] = {}
    has_patients_csv = (root / "patients.csv").exists()
    if has_patients_csv:
        for line, row in read_csv(folder, root / "patients.csv", ("patient_id",), columns):
            here = f"patients.csv: line {line}"
            pid = check_id(row["patient_id"], here, "patient_id")
            if pid in patients:
                raise DatasetError(f"{here}: patient_id {pid!r} is listed twice")
            patients[pid] = row_metadata(row, ("patient_id",))
            where[("patients", key_json(pid), "metadata")] = f"patients.csv: line {line}"
    if (root / "images.csv").exists():
        seen_images: set[str] = set()
        for line, row in read_csv(folder, root / "images.csv", ("image_id", "patient_id"), columns):
            here = f"images.csv: line {line}"
            image_id = row["image_id"]
            if image_id not in images:
                raise DatasetError(f"{here}: image_id {image_id!r} is not in images/")
            if image_id in seen_images:
                raise DatasetError(f"{here}: image_id {image_id!r} is listed twice")
            seen_images.add(image_id)
            image_pid = row["patient_id"] or None
            if image_pid is not None:
                check_id(image_pid, here, "patient_id")
                if image_pid not in patients:
                    if has_patients_csv:
                        raise DatasetError(f"{here}: patient_id {image_pid!r} is not in patients.csv")
                    patients[image_pid] = {}
            images[image_id].patient_id = image_pid
            images[image_id].metadata = {**row_metadata(row, ("image_id", "patient_id")),
                                         **images[image_id].metadata}
            for name in ("patient_id", "metadata"):
                where[("images", key_json(image_id), name)] = here

    triplets = TripletTable()
    try:
        if (root / "triplets.csv").exists():
            _read_triplets(folder, root / "triplets.csv", columns, set(images) | set(known_images), triplets)
        triplets.finish()
    except BaseException:
        triplets.close()
        raise
    absent = {pair for name, pairs in _FIELDS_OF_FILE.items() if not (root / name).exists() for pair in pairs}
    plan = DatasetPlan(root, images, patients, wounds, triplets, info, where, dropped, absent)
    try:
        _check_followup(plan)
    except BaseException:
        triplets.close()
        raise
    return plan


def _check_followup(plan: DatasetPlan) -> None:
    """The follow-up rules (:mod:`annotations.followup.followup_fields`) on a validated dataset: visit dates,
    rulers, closed flags, the marker, and tracks (one wound per photo per track, one patient per track)."""
    if "marker" in plan.info:
        marker_spec(plan.info["marker"])
    for image_id, img in plan.images.items():
        where = plan.where.get(("images", key_json(image_id), "metadata"), f"images/{img.path.name}")
        if VISIT_DATE in img.metadata:
            parse_visit_date(img.metadata[VISIT_DATE], where)
        if RULER in img.metadata:
            size = (img.width, img.height)
            ruler_calibration(Ruler.parse(img.metadata[RULER], f"{where}: ruler", size), f"{where}: ruler", size)
    wounds = [(iid, idx, w["metadata"], plan.where.get(("wounds", key_json(wound_key(iid, idx)), "metadata"),
                                                         f"masks/{iid}.png"))
              for (iid, idx), w in plan.wounds.items()]
    check_tracks(wounds, {iid: img.patient_id for iid, img in plan.images.items()})


#: The fields each optional CSV gives; without the file a re-import never changes them.
_FIELDS_OF_FILE = {"wounds.csv": (("wounds", "description"), ("wounds", "metadata")),
                   "images.csv": (("images", "patient_id"), ("images", "metadata")),
                   "patients.csv": (("patients", "metadata"),)}


def _read_triplets(folder: DatasetFolder, path: Path, columns: dict[str, str], allowed: set[str],
                   table: TripletTable) -> None:
    """Check ``triplets.csv`` row by row into ``table``."""
    for line, row in iter_csv(folder, path, ("anchor", "ref_j", "ref_k", "choice"), columns):
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
        if not source.split(":", 1)[-1].strip():
            raise DatasetError(f"{here}: source {source!r} names no one; write it as kind:name "
                               "(e.g. expert:alice), or leave it empty and fill annotator")
        rep = parse_int(row["rep"], f"{here}: rep", minimum=0) if row.get("rep") else None
        latency = parse_number(row["latency_ms"], f"{here}: latency_ms", minimum=0) if row.get("latency_ms") else None
        created = parse_timestamp(row["created"], f"{here}: created") if row.get("created") else None
        table.add((line, *ids, row["choice"], source, rep, latency, created))


class TripletTable(JudgmentTable):
    """A dataset's judgments in file order (:class:`~annotations.store.imports.JudgmentTable`: a temporary
    SQLite file); a judgment listed twice is a :class:`DatasetError` naming it."""

    def finish(self) -> None:
        """Number the rows without ``rep`` and check that no judgment is listed twice."""
        with _listed_twice():
            super().finish()

    def rename(self, ref: Callable[[str], str]) -> None:
        """Replace every image id by ``ref(id)``."""
        with _listed_twice():
            super().rename(ref)


@contextlib.contextmanager
def _listed_twice() -> Iterator[None]:
    """A :class:`~annotations.store.imports.DuplicateJudgment` raised inside is a :class:`DatasetError`."""
    try:
        yield
    except DuplicateJudgment as err:
        raise DatasetError(f"triplets.csv: {err}") from None


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
    action: str   # insert | update | delete | keep-app | keep-deleted | not-in-file | conflict | renumber
    where: str
    old: Any = None
    new: Any = None
    resolved: str | None = None  # for conflicts: "app" or "file"

    def describe(self) -> str:
        """The change as one line of the merge report."""
        what = {"insert": "new", "update": "changed in the dataset", "delete": "removed (--prune)",
                "keep-app": "changed in the app since the last import: kept",
                "keep-deleted": "deleted in the app since the last import: stays deleted",
                "not-in-file": "no longer in the dataset: kept (--prune deletes it)",
                "conflict": "changed in the app AND in the dataset",
                "renumber": f"drawn in the app, its number now taken by the dataset: moved to {self.new}"}[self.action]
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
    text = json.dumps(value, sort_keys=True,
                      ensure_ascii=False,  # pragma: no mutate (None is falsy, the same as False)
                      )
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
    masks: list[str]                                    # image ids whose label map the merge changes
    triplets: _TripletMerge

    @property
    def conflicts(self) -> list[Change]:
        return [c for c in self.changes if c.action == "conflict"]


@dataclass
class _TripletMerge:
    """The judgments' part of a merge: each dataset row's decision is kept in its
    :class:`TripletTable` row (``action`` insert/replace, ``change`` insert), not in memory."""

    table: TripletTable
    inserts: int = 0            # rows whose change is ``insert`` (described from the table)
    at: int = 0                 # where their lines go among the merge's changes
    deletes: list[tuple[dict[str, Any], int]] = field(default_factory=list)  # (key, id) removed by --prune


def _file_rows(plan: DatasetPlan) -> dict[str, dict[str, dict[str, Any]]]:
    return {
        "patients": {key_json(pid): {"metadata": meta} for pid, meta in plan.patients.items()},
        "images": {key_json(i.image_id): {"file": image_file_value(f"{i.image_id}{i.path.suffix.lower()}",
                                                                    i.sha256, i.width, i.height),
                                          "patient_id": i.patient_id, "metadata": i.metadata}
                   for i in plan.images.values()},
        "wounds": {key_json(wound_key(iid, idx)): {"outline": w["outline"], "description": w["description"],
                                                   "metadata": w["metadata"]}
                   for (iid, idx), w in plan.wounds.items()},
    }


def _current_rows(ws: Workspace) -> dict[str, dict[str, dict[str, Any]]]:
    """The workspace's patients, images and wounds as merge rows (each mask read once, not kept)."""
    store = ws.store
    wounds: dict[str, dict[str, Any]] = {}
    by_image: dict[str, list[dict]] = {}
    for w in store.wounds():
        by_image.setdefault(w["image_id"], []).append(w)
    for iid, rows in by_image.items():
        found = outlines(ws.load_mask(iid))
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
    }


def plan_merge(ws: Workspace, plan: DatasetPlan, prefer: str | None = None, prune: bool = False,
               mask_sink: Callable[[str, np.ndarray], None] | None = None) -> _Merge:
    """Three-way merge of the dataset (file), the workspace (app) and what the last import read
    (base): a field changed only in the file is updated, one changed only in the app is kept, one
    changed on both sides is a conflict (``prefer`` resolves it). Rows gone from the file are
    deleted only with ``prune`` and only when the import brought them; outlines drawn in the app
    are never deleted. Reads only; :func:`import_dataset` writes the result, and each new label map
    goes to ``mask_sink(image_id, labels)`` as soon as it is made."""
    if prefer not in (None, *PREFER):
        raise DatasetError(f"--prefer must be one of {', '.join(PREFER)}, got {prefer!r}")
    bases = ws.store.import_bases_but_judgments()  # judgments' bases: looked up one by one
    file_rows = _file_rows(plan)
    current = _current_rows(ws)
    labels: dict[str, np.ndarray] = {}  # label maps of the workspace changed by a renumbering
    changes: list[Change] = []
    final: dict[str, dict[str, dict[str, Any] | None]] = {e: {} for e in _FIELDS}
    keys: dict[str, Any] = {}
    new_bases: list[tuple[str, Any, str, str | None]] = []
    triplets = _TripletMerge(plan.triplets)
    _renumber_drawn(ws, file_rows["wounds"], current["wounds"], labels, bases, final["wounds"], keys, changes)
    for entity, fields in _FIELDS.items():
        if entity == "triplets":
            _merge_triplets(ws, triplets, prefer, prune, changes)
            continue
        presence = _PRESENCE[entity]
        for kj in [*file_rows[entity], *(k for k in current[entity] if k not in file_rows[entity])]:
            key = json.loads(kj)
            keys[kj] = key
            f, c = file_rows[entity].get(kj), current[entity].get(kj)
            base = {name: bases.get((entity, kj, name)) for name in fields}
            where = plan.where.get((entity, kj, presence)) or "workspace"
            if f is None:
                assert c is not None  # a key not in the file is one of the workspace's
                if base[presence] is None:
                    continue  # made in the app: never touched by an import
                if not prune or entity == "patients" or \
                        (entity == "images" and _in_use(ws, key, current, final, triplets)):
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
            new_bases.extend((entity, key, n, file_hashes[n]) for n in fields
                             if c is None or (entity, n) not in plan.absent)
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
                if hf == hc or (entity, n) in plan.absent:
                    continue  # unchanged, or its file is absent: no change
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
    masks = _merge_masks(ws, plan, final["wounds"], keys, current["wounds"], labels, changes, mask_sink)
    return _Merge(changes, final, keys, new_bases, masks, triplets)


#: A judgment's merge value's hash, per choice.
_CHOICE_HASH = {c: hashlib.sha256(json.dumps({"choice": c}, sort_keys=True).encode()).hexdigest() for c in CHOICES}


def _merge_triplets(ws: Workspace, merge: _TripletMerge, prefer: str | None, prune: bool,
                    changes: list[Change]) -> None:
    """The merge's rules for judgments (one field, ``row``: the choice), streamed: each dataset row
    is looked up in the store by its key and its decision written back to its table row."""
    store, table = ws.store, merge.table
    merge.at = len(changes)
    table.clear_decisions()
    if not store.has_triplets() and not store.has_judgment_bases():
        table.decide_all_inserts()  # an empty store: all new
        merge.inserts = len(table)
        return
    decided: list[tuple[str | None, str | None, int | None, int]] = []
    for t in table.rows():
        key = triplet_key(t)
        kj = key_json(key)
        where = f"triplets.csv: line {t['line']}"
        cur = store.triplet_by_key(key)
        base = store.judgment_base(kj)
        hf, f_row = _CHOICE_HASH[t["choice"]], {"choice": t["choice"]}
        action = change = cur_id = None
        if cur is None:
            if base is not None and base == hf:
                changes.append(Change("triplets", key, "row", "keep-deleted", where))
            elif base is not None:  # deleted in the app, changed in the file
                changes.append(Change("triplets", key, "row", "conflict", where, None, f_row, resolved=prefer))
                action = "insert" if prefer == "file" else None
            else:
                action = change = "insert"
                merge.inserts += 1
        elif hf != _CHOICE_HASH[cur[1]]:
            c_row = {"choice": cur[1]}
            if base == hf:
                changes.append(Change("triplets", key, "row", "keep-app", where, c_row, f_row))
            elif base is not None and base == _CHOICE_HASH[cur[1]]:
                changes.append(Change("triplets", key, "row", "update", where, c_row, f_row))
                action, cur_id = "replace", cur[0]
            else:
                changes.append(Change("triplets", key, "row", "conflict", where, c_row, f_row, resolved=prefer))
                if prefer == "file":
                    action, cur_id = "replace", cur[0]
        if action is not None:
            decided.append((action, change, cur_id, t["line"]))
        if len(decided) >= TripletTable.BATCH:
            table.decide(decided)
            decided.clear()
    table.decide(decided)
    for kj, base in store.judgment_bases():
        key = json.loads(kj)
        if table.find(key):
            continue
        cur = store.triplet_by_key(key)
        if cur is None:
            continue
        if not prune:
            changes.append(Change("triplets", key, "row", "not-in-file", "workspace"))
        elif base == _CHOICE_HASH[cur[1]]:
            changes.append(Change("triplets", key, "row", "delete", "workspace", old={"choice": cur[1]}))
            merge.deletes.append((key, cur[0]))
        else:  # changed in the app, removed from the dataset
            changes.append(Change("triplets", key, "row", "conflict", "workspace", {"choice": cur[1]}, None,
                                  resolved=prefer))
            if prefer == "file":
                merge.deletes.append((key, cur[0]))


def _renumber_drawn(ws: Workspace, file_wounds: dict, current: dict, labels: dict[str, np.ndarray], bases: dict,
                    final: dict, keys: dict, changes: list[Change]) -> None:
    """An outline drawn in the app whose number the dataset now gives to a different wound moves
    to the next free number (with its description), so the import never overwrites it."""
    for kj in [k for k in file_wounds if k in current]:
        row = current[kj]
        drawn = row["metadata"].get("origin") in ("drawn", "suggested")
        if not drawn or bases.get(("wounds", kj, "outline")) is not None or \
                _hash("outline", row["outline"]) == _hash("outline", file_wounds[kj]["outline"]):
            continue
        old = json.loads(kj)
        image_id = old["image_id"]
        taken = {json.loads(k)["wound_index"] for k in (*file_wounds, *current) if json.loads(k)["image_id"] == image_id}
        new = wound_key(image_id, max(taken) + 1)
        new_kj = key_json(new)
        app = labels[image_id] if image_id in labels else ws.load_mask(image_id)
        labels[image_id] = np.where(app == old["wound_index"], new["wound_index"], app)
        current[new_kj] = row
        final[new_kj] = row  # the very outline object: _merge_masks paints it from the app's mask
        keys[new_kj] = new
        del current[kj]
        changes.append(Change("wounds", old, "outline", "renumber", f"masks/{image_id}.png", old["wound_index"],
                              new["wound_index"]))


def _in_use(ws: Workspace, image_id: str, current: dict, final: dict, triplets: _TripletMerge) -> bool:
    """Whether a wound or judgment that stays after the merge names the photo."""
    for kj in current["wounds"]:
        if json.loads(kj)["image_id"] == image_id and final["wounds"].get(kj, {}) is not None:
            return True
    deleted = {tid for _, tid in triplets.deletes}
    return any(tid not in deleted for tid in ws.store.triplet_ids_naming(image_id))


def _merge_masks(ws: Workspace, plan: DatasetPlan, wounds: dict[str, dict | None], keys: dict[str, Any],
                 current: dict[str, dict], labels: dict[str, np.ndarray], changes: list[Change],
                 sink: Callable[[str, np.ndarray], None] | None) -> list[str]:
    """New label maps of the photos whose outlines the merge changes, one photo at a time: the
    dataset's outlines first, the app's on top (an outline drawn in the app never loses a pixel to
    an import). Returns the ids of the photos whose map changed; each map goes to ``sink``."""
    merged: dict[str, list[str]] = {}
    for kj in wounds:
        merged.setdefault(keys[kj]["image_id"], []).append(kj)
    in_app: dict[str, list[str]] = {}
    for kj in current:
        in_app.setdefault((keys.get(kj) or json.loads(kj))["image_id"], []).append(kj)
    changed = []
    for iid in sorted(merged):
        img = plan.images.get(iid)
        old = labels.pop(iid, None)
        if old is None and iid in in_app:
            old = ws.load_mask(iid)
        if img is not None:
            shape = (img.height, img.width)
        else:
            assert old is not None, iid  # a photo not in the dataset is in the app
            shape = old.shape
        if old is None:
            old = np.zeros(shape, dtype=np.int32)
        new = np.zeros(shape, dtype=np.int32)
        app_indices = []
        for kj in in_app.get(iid, []):
            row = current[kj]
            if kj in wounds:
                target = wounds[kj]  # a merged row keeps the very outline object it took
                if target is None or target["outline"] is not row["outline"]:
                    continue  # deleted, or its outline comes from the file
            app_indices.append((keys.get(kj) or json.loads(kj))["wound_index"])
        for kj in merged[iid]:
            index = keys[kj]["wound_index"]
            if wounds[kj] is not None and index not in app_indices:
                x0, y0, x1, y1 = plan.wounds[(iid, index)]["outline"]["bbox"]
                new[y0:y1, x0:x1][outline_pixels(plan.wounds[(iid, index)]["outline"])] = index
        for index in app_indices:
            if old.shape == new.shape:
                new[old == index] = index
        found = outlines(new)
        for kj in merged[iid]:
            merged_row = wounds[kj]
            if merged_row is None:
                continue
            outline = found.get(keys[kj]["wound_index"])
            if outline is None:
                changes.append(Change("wounds", keys[kj], "outline", "keep-app", "masks/" + iid + ".png",
                                      None, merged_row["outline"]))
                wounds[kj] = {"skip": True}
            else:
                merged_row["outline"] = outline
        if not np.array_equal(new, old):
            changed.append(iid)
            if sink is not None:
                sink(iid, new)
    return changed


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
                   prune: bool = False, study_ids: str | Path | None = None, actor: str = "import",
                   keep_metadata: bool = False) -> dict[str, Any]:
    """Validate a dataset folder, then merge it into ``ws`` (see :func:`plan_merge`); idempotent.

    Atomic end to end: photos and masks are written to a staging folder inside the workspace,
    the store changes in one transaction (whatever the wait for its lock), and the files are
    renamed into place (journalled) before it commits; on any error nothing has changed, and a
    process killed midway is rolled back or finished when the workspace next opens. A full disk
    or a lock held too long is one :class:`DatasetError` (:func:`~annotations.io.readers.clear_error`). ``dry_run`` reports
    and writes nothing. ``study_ids`` names a CSV (outside the workspace's images/) mapping
    original photo names to study ids; the workspace then only sees the study ids. Returns a
    summary with every change (``changes``: one line each). Photos are stored upright and without
    identifying metadata (EXIF GPS, dates, serials…) unless ``keep_metadata``."""
    store = ws.store
    known = {r["image_id"] for r in store.images()}
    mapping = None
    if study_ids is not None:
        mapping = StudyIds(ws, study_ids)
        known |= set(mapping.ids)
    _refuse_inside(ws, root)
    swap = None if dry_run else Swap(ws.root, "import")
    staging = None if swap is None else swap.dir
    plan = None
    try:
        plan = validate_dataset(root, known_images=known, keep_metadata=keep_metadata,
                                min_wound_area=ws.min_wound_area, spool=staging / "spool" if staging else None)
        if mapping is not None:
            mapping.apply(plan)
        check_kind(ws, plan.synthetic)
        if swap is None or staging is None:  # a dry run (both or neither)
            return _summary(ws, plan, plan_merge(ws, plan, prefer, prune), 0, dry_run=True)
        staged = _stage_photos(ws, plan, staging)
        masks: list[tuple[Path, Path]] = []

        def stage_mask(iid: str, labels: np.ndarray) -> None:
            path = staging / "masks" / f"{iid}.png"
            path.parent.mkdir(exist_ok=True)
            _write_label_png(path, labels)
            masks.append((path, ws.mask_path(iid)))

        with store.transaction():
            merge = plan_merge(ws, plan, prefer, prune, mask_sink=stage_mask)
            if merge.conflicts and prefer is None:
                raise MergeConflict(merge.conflicts)
            staged = [(src, target) for src, target in staged if _photo_wanted(ws, merge, target)] + masks
            if (plan.root / "truth").is_dir():
                _copy_truth(plan.root / "truth", staging / "truth")
                staged.append((staging / "truth", ws.truth_dir))
            new_triplets = _apply(ws, plan, merge, actor)
            if mapping is not None:
                mapping.save()
            swap.plan(staged, commit="meta")
            swap.forward()
            store.set_meta(swap.meta_key, True)  # commits the swap with the rows
        swap.done()
        with contextlib.suppress(StoreError), store.transaction():  # the import stands; a key left is inert
            store.delete_meta(swap.meta_key)
        return _summary(ws, plan, merge, new_triplets, dry_run=False)
    except BaseException as err:
        if swap is not None and swap.entries and not swap.settled:  # the transaction rolled back
            swap.backward()
            swap.done()
        clear = clear_error(err, ws.root, "nothing was imported")
        if clear is None:
            raise
        raise clear from None
    finally:
        if plan is not None:
            plan.triplets.close()
        if swap is not None:
            swap.close()


def _refuse_inside(ws: Workspace, root: str | Path) -> None:
    """A dataset folder may not be the workspace or lie inside it (nor hold it)."""
    folder = Path(root).resolve()
    if folder.is_relative_to(ws.root) or ws.root.is_relative_to(folder):
        raise DatasetError(f"{folder}: is the workspace {ws.root} or overlaps it; export the workspace "
                           "(python -m annotations export OUT) and import that folder instead")


def _stage_photos(ws: Workspace, plan: DatasetPlan, staging: Path) -> list[tuple[Path, Path]]:
    """Move the spooled photos that are new or changed into ``staging``; (staged, target) pairs."""
    staged = []
    (staging / "images").mkdir()
    for img in plan.images.values():
        target = ws.images_dir / f"{img.image_id}{img.path.suffix.lower()}"
        if target.exists() and _file_sha256(target) == img.sha256:
            continue
        tmp = staging / "images" / target.name
        assert img.spooled is not None, img.image_id  # a plan to apply is read with a spool
        os.replace(img.spooled, tmp)
        staged.append((tmp, target))
    return staged


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _photo_wanted(ws: Workspace, merge: _Merge, target: Path) -> bool:
    """A staged photo goes in when its file is missing or the merge takes the dataset's photo."""
    row = merge.rows["images"].get(key_json(target.stem))
    if not target.exists():
        return True
    return row is not None and row["file"]["file"] == target.name and (ws.store.image(target.stem) or {}).get(
        "sha256") != row["file"]["sha256"]


def _copy_truth(src: Path, dst: Path) -> None:
    """Copy a ``truth/`` folder without following a link (:func:`annotations.infra.fileio.copy_tree`)."""
    try:
        copy_tree(src, dst)
    except LinkError as err:
        raise DatasetError(f"{err.filename}: {err.strerror}; replace it with a copy of the file") from None


def copy_photo(src: Path, dst: Path) -> None:
    """Copy one file without following a link (:func:`annotations.infra.fileio.copy_file`); a link is a DatasetError."""
    try:
        copy_file(src, dst)
    except LinkError as err:
        raise DatasetError(f"{err.filename}: {err.strerror}; replace it with a copy of the file") from None


def _write_label_png(path: Path, labels: np.ndarray) -> None:
    dtype = np.uint8 if labels.max(initial=0) <= 255 else np.uint16
    with atomic_write(path, "wb", suffix=".png") as fh:
        Image.fromarray(labels.astype(dtype)).save(fh, format="PNG")


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
    new_triplets = _apply_triplets(ws, merge.triplets, actor)
    for entity, key, name, value_hash in merge.bases:
        store.set_import_base(entity, key, name, value_hash)
    for kj, row in rows["images"].items():
        if row is None:
            store.delete_image(keys[kj], actor=actor)
    if "name" in plan.info:
        store.set_meta("dataset_name", plan.info["name"])
    if "synthetic" in plan.info:
        store.set_meta("synthetic", plan.synthetic)
    if "marker" in plan.info:
        store.set_meta("marker", plan.info["marker"])
    return new_triplets


def _apply_triplets(ws: Workspace, merge: _TripletMerge, actor: str) -> int:
    """Write the judgments' decisions in batches (inside the caller's transaction) and remember
    what the import read of each; returns the new judgments."""
    store = ws.store
    for key, tid in merge.deletes:
        store.delete_triplet(tid, actor=actor)
        store.set_import_base("triplets", key, "row", None)
    new, batch, annotators = 0, [], set()
    for t in merge.table.decided_rows():
        if t["cur_id"] is not None:  # the dataset changed the choice: replace the judgment
            store.delete_triplet(t["cur_id"], actor=actor)
        if t["source"].startswith("expert:"):
            annotators.add(t["source"].split(":", 1)[1])
        batch.append(t)
        if len(batch) >= TripletTable.BATCH:
            new += store.add_triplets(batch, actor=actor)
            batch.clear()
    new += store.add_triplets(batch, actor=actor)
    for name in sorted(annotators):
        store.add_annotator(name)
    stamp = now()
    bases = []
    for t in merge.table.rows():
        bases.append((key_json(triplet_key(t)), _CHOICE_HASH[t["choice"]], stamp))
        if len(bases) >= TripletTable.BATCH:
            store.set_judgment_bases(bases)
            bases.clear()
    store.set_judgment_bases(bases)
    return new


def _summary(ws: Workspace, plan: DatasetPlan, merge: _Merge, new_triplets: int, dry_run: bool) -> dict[str, Any]:
    counts = Counter(c.action for c in merge.changes)
    counts["insert"] += merge.triplets.inserts
    lines = [c.describe() for c in merge.changes[:merge.triplets.at]]
    lines += [Change("triplets", triplet_key(t), "row", "insert", f"triplets.csv: line {t['line']}", None,
                     {"choice": t["choice"]}).describe() for t in merge.triplets.table.inserted_rows()]
    lines += [c.describe() for c in merge.changes[merge.triplets.at:]]
    return {"images": len(plan.images), "patients": len(plan.patients), "wounds": len(plan.wounds),
            "triplets": len(plan.triplets), "new_triplets": new_triplets, "dry_run": dry_run,
            "merge": {a: counts.get(a, 0) for a in ("insert", "update", "delete", "keep-app", "keep-deleted",
                                                    "not-in-file", "conflict", "renumber")},
            "changes": lines, "dropped_wounds": plan.dropped,
            "synthetic": plan.synthetic if dry_run else ws.is_synthetic, "workspace": str(ws.root)}


def _write_csv(path: Path, fixed: list[str], rows: list[dict[str, Any]] | Iterator[dict[str, Any]]) -> None:
    """``rows`` as CSV; a list may hold metadata columns beyond ``fixed``, an iterator (streamed) may not."""
    extra = sorted({k for r in rows for k in r} - set(fixed)) if isinstance(rows, list) else []
    with path.open("w",
                   newline="",  # pragma: no mutate (on POSIX None translates nothing either; csv writes \r\n)
                   encoding="utf-8",  # pragma: no mutate (the default, and 'UTF-8', name the same codec here)
                   ) as fh:
        writer = csv.DictWriter(fh, fieldnames=fixed + extra)
        writer.writeheader()
        writer.writerows(map(safe_row, rows))  # None is written as an empty cell; formulas neutralised


#: What ``export`` writes into a dataset folder; ``--force`` replaces exactly these.
EXPORT_ITEMS = ("images", "masks", "truth", "wounds.csv", "images.csv", "patients.csv", "triplets.csv",
                "dataset.json")


def export_dataset(ws: Workspace, out: str | Path, force: bool = False) -> dict[str, Any]:
    """Write the workspace as a dataset folder (label-map masks) that imports back losslessly.

    ``out`` must be new or empty; with ``force`` the dataset files already there
    (:data:`EXPORT_ITEMS`) are replaced and anything else is left alone. The folder is written
    beside ``out`` first and renamed into place, so an error leaves ``out`` as it was."""
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise DatasetError(f"{out}: not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise DatasetError(f"{out}: not empty; export into a new folder or give --force to replace "
                           "its dataset files")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-",  # pragma: no mutate (cosmetic: removed below)
                                    dir=out.parent))
    try:
        summary = _write_dataset(ws, staging)
        out.mkdir(exist_ok=True)
        replaced = staging / ".replaced"  # pragma: no mutate (an internal name inside staging)
        replaced.mkdir()
        for name in EXPORT_ITEMS:
            if (out / name).exists() or (out / name).is_symlink():
                os.replace(out / name, replaced / name)
            if (staging / name).exists():
                os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging,
                      ignore_errors=True,  # pragma: no mutate (removing our own staging folder does not fail)
                      )
    return {**summary, "out": str(out)}


def _write_dataset(ws: Workspace, out: Path) -> dict[str, Any]:
    (out / "images").mkdir()  # `out` is a fresh, empty staging folder
    (out / "masks").mkdir()
    store = ws.store
    with store.transaction():  # one consistent moment of the store and the masks (writers wait)
        images = store.images()
        wounds = store.wounds()
        patients = store.patients()
        n_triplets = _write_triplets_csv(store, out / "triplets.csv")
        with_wounds = {w["image_id"] for w in wounds}
        for img in images:
            if img["image_id"] in with_wounds or ws.mask_path(img["image_id"]).exists():
                _write_label_png(out / "masks" / f"{img['image_id']}.png", ws.load_mask(img["image_id"]))
    for img in images:  # photos never change in place (a re-import renames a new file in)
        copy_photo(ws.images_dir / img["file"], out / "images" / img["file"])
    _write_csv(out / "wounds.csv", ["image_id", "wound_index", "description"],
               [{"image_id": w["image_id"], "wound_index": w["wound_index"],
                 "description": w["description"], **w["metadata"]} for w in wounds])
    _write_csv(out / "images.csv", ["image_id", "patient_id"],
               [{"image_id": i["image_id"], "patient_id": i["patient_id"], **i["metadata"]}
                for i in images])
    _write_csv(out / "patients.csv", ["patient_id"],
               [{"patient_id": p["patient_id"], **p["metadata"]} for p in patients])
    (out / "dataset.json").write_text(json.dumps(
        {"name": ws.dataset_name, "synthetic": ws.is_synthetic, "mask_format": "label",
         "columns": column_schema([[w["metadata"] for w in wounds], [i["metadata"] for i in images],
                                   [p["metadata"] for p in patients]]),
         **({"marker": marker} if (marker := store.get_meta("marker")) is not None else {})}, indent=2))
    if ws.truth_dir.is_dir():
        _copy_truth(ws.truth_dir, out / "truth")
    return {"images": len(images), "patients": len(patients), "wounds": len(wounds),
            "triplets": n_triplets}


def _write_triplets_csv(store: Any, path: Path) -> int:
    """Every judgment, oldest first, streamed from the store into ``triplets.csv``; returns how many."""
    count = 0

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal count
        for anchor, ref_j, ref_k, choice, source, rep, latency, created in store.triplets_oldest_first():
            count += 1
            yield {"anchor": anchor, "ref_j": ref_j, "ref_k": ref_k, "choice": choice,
                   "annotator": source.split(":", 1)[1] if source.startswith("expert:") else "",
                   "source": source, "rep": rep, "latency_ms": "" if latency is None else repr(latency),
                   "created": created}

    _write_csv(path, ["anchor", "ref_j", "ref_k", "choice", "annotator", "source", "rep", "latency_ms", "created"],
               rows())
    return count
