"""Privacy as a clinic expects: study ids instead of original photo names, and erasing a patient.

The mapping from original names to study ids is a CSV the user names, kept apart from the
photos (never inside the workspace's ``images/`` or ``masks/``), so an exported or shared
workspace holds only study ids.
"""
from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path
from typing import Any

from annotations.fileio import write_text
from annotations.readers import DatasetError, valid_id
from annotations.readings import readings_dir
from annotations.store import key_json
from annotations.workspace import Workspace

MAPPING_COLUMNS = ("original", "study_id")


class StudyIds:
    """The ``original,study_id`` mapping CSV at ``path`` (created on first save)."""

    def __init__(self, ws: Workspace, path: str | Path) -> None:
        self.path = Path(path).expanduser().resolve()
        for inside in (ws.images_dir, ws.masks_dir):
            if self.path.is_relative_to(inside.resolve()):
                raise DatasetError(f"{self.path}: keep the study-id mapping apart from the photos "
                                   f"(not inside {inside})")
        self.ids: dict[str, str] = {}
        if self.path.exists():
            self._read()

    def _read(self) -> None:
        try:
            rows = list(csv.DictReader(io.StringIO(self.path.read_text(encoding="utf-8-sig"))))
        except (OSError, UnicodeDecodeError, csv.Error) as err:
            raise DatasetError(f"{self.path}: cannot read the study-id mapping ({err})") from None
        for line, row in enumerate(rows, start=2):
            original, study = (row.get(MAPPING_COLUMNS[0]) or "").strip(), (row.get(MAPPING_COLUMNS[1]) or "").strip()
            if not original or not valid_id(study):
                raise DatasetError(f"{self.path}: line {line}: needs columns {', '.join(MAPPING_COLUMNS)} "
                                   "with a valid study id")
            self.ids[original] = study

    def study_id(self, original: str) -> str:
        """The study id of ``original``, given a new one (``S000001``, …) the first time."""
        if original not in self.ids:
            used = {int(s[1:]) for s in self.ids.values() if s[:1] == "S" and s[1:].isdigit()}
            self.ids[original] = f"S{max(used, default=0) + 1:06d}"
        return self.ids[original]

    def apply(self, plan: Any) -> None:
        """Rename every photo of a validated :class:`annotations.dataset.DatasetPlan` (and each
        reference to it) to its study id."""
        rename = {iid: self.study_id(iid) for iid in sorted(plan.images)}
        ref = lambda iid: rename.get(iid) or self.ids.get(iid, iid)
        images = {}
        for iid, img in plan.images.items():
            img.image_id = rename[iid]
            images[img.image_id] = img
        plan.images = images
        plan.wounds = {(rename[iid], idx): w for (iid, idx), w in plan.wounds.items()}
        plan.triplets.rename(ref)
        plan.where = {(entity, _rename_key(entity, kj, ref), name): where
                      for (entity, kj, name), where in plan.where.items()}

    def save(self) -> None:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(MAPPING_COLUMNS)
        writer.writerows(sorted(self.ids.items(), key=lambda kv: kv[1]))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text(self.path, buf.getvalue())

    def forget(self, study_ids: set[str]) -> int:
        """Drop the rows of ``study_ids``; returns how many were dropped."""
        before = len(self.ids)
        self.ids = {o: s for o, s in self.ids.items() if s not in study_ids}
        if len(self.ids) != before:
            self.save()
        return before - len(self.ids)


def _rename_key(entity: str, kj: str, ref) -> str:
    key = json.loads(kj)
    if entity == "images":
        key = ref(key)
    elif entity == "wounds":
        key["image_id"] = ref(key["image_id"])
    elif entity == "triplets":
        for col in ("anchor", "ref_j", "ref_k"):
            key[col] = ref(key[col])
    return key_json(key)


def erase_patient(ws: Workspace, patient_id: str, study_ids: str | Path | None = None) -> dict[str, Any]:
    """Remove a patient: photos, masks, wounds, judgments, LLM answers naming the photos, import
    bases and every revision about them; returns what was removed (counts and photo ids)."""
    store = ws.store
    db = store.db
    with store.transaction():
        if db.execute("SELECT 1 FROM patients WHERE patient_id = ?", [patient_id]).fetchone() is None:
            raise DatasetError(f"no patient {patient_id!r} in {ws.root}")
        images = store.db.execute("SELECT image_id, file FROM images WHERE patient_id = ?", [patient_id]).fetchall()
        ids = [r[0] for r in images]
        marks = ",".join("?" * len(ids)) or "NULL"
        refs = f"anchor IN ({marks}) OR ref_j IN ({marks}) OR ref_k IN ({marks})"
        removed = {
            "patient": patient_id, "photos": ids,
            "wounds": db.execute(f"DELETE FROM wounds WHERE image_id IN ({marks})", ids).rowcount,
            "judgments": db.execute(f"DELETE FROM triplets WHERE {refs}", ids * 3).rowcount,
            "llm_answers": db.execute(f"DELETE FROM llm_queries WHERE {refs}", ids * 3).rowcount,
        }
        db.execute(f"DELETE FROM images WHERE image_id IN ({marks})", ids)
        db.execute("DELETE FROM patients WHERE patient_id = ?", [patient_id])
        gone = set(ids)
        revision_ids, base_keys = [], []
        for row in db.execute("SELECT id, entity, key FROM revisions").fetchall():
            if _names(row[1], json.loads(row[2]), gone, patient_id):
                revision_ids.append(row[0])
        for row in db.execute("SELECT entity, key FROM import_base").fetchall():
            if _names(row[0], json.loads(row[1]), gone, patient_id):
                base_keys.append(row)
        db.conn.executemany("DELETE FROM revisions WHERE id = ?", [[i] for i in revision_ids])
        db.conn.executemany("DELETE FROM import_base WHERE entity = ? AND key = ?", base_keys)
        removed["revisions"] = len(revision_ids)
    files = 0  # after the commit: a failed transaction leaves the photos in place
    for image_id, file in images:
        layers = readings_dir(ws) / image_id  # second-reading layers (rows gone with the photo: ON DELETE CASCADE)
        for path in (ws.images_dir / file, ws.mask_path(image_id), *sorted(layers.glob("*.png"))):
            if path.exists():
                path.unlink()
                files += 1
        if layers.is_dir():
            shutil.rmtree(layers)
    removed["files"] = files
    if study_ids is not None:
        removed["mapping_rows"] = StudyIds(ws, study_ids).forget(gone)
    runs = sorted(p.name for p in ws.runs_dir.iterdir() if p.is_dir())
    removed["note"] = (f"{len(runs)} run folder(s) under runs/ may hold embeddings computed from these photos; "
                       "delete or recompute those runs") if runs else ""
    # Free the deleted pages so the patient's data does not linger in the database file.
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("VACUUM")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return removed


def _names(entity: str, key: Any, images: set[str], patient_id: str) -> bool:
    if entity == "patients":
        return key == patient_id
    if entity in ("images", "reading_photos"):
        return key in images
    if entity in ("wounds", "readings"):
        return isinstance(key, dict) and key.get("image_id") in images
    if entity == "triplets":
        return isinstance(key, dict) and bool(images & {key.get("anchor"), key.get("ref_j"), key.get("ref_k")})
    return False
