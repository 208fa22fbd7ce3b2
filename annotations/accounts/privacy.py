"""Privacy as a clinic expects: study ids instead of original photo names, and erasing a patient.

The mapping from original names to study ids is a CSV the user names, kept apart from the
photos (never inside the workspace's ``images/`` or ``masks/``), so an exported or shared
workspace holds only study ids.
"""
from __future__ import annotations

import csv
import io
import json
import mmap
import os
import re
from pathlib import Path
from typing import Any

from annotations.followup.readings import readings_dir
from annotations.infra.backup import backups_in_progress
from annotations.infra.fileio import write_text
from annotations.infra.journal import Swap
from annotations.infra.workspace import DB_NAME, Workspace
from annotations.io.csvsafe import neutralise, restore
from annotations.io.readers import DatasetError, valid_id
from annotations.store.leases import delete_leases
from annotations.store.rows import key_json

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
            original = restore((row.get(MAPPING_COLUMNS[0]) or "").strip())
            study = (row.get(MAPPING_COLUMNS[1]) or "").strip()
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
        """Rename every photo of a validated :class:`annotations.io.dataset.DatasetPlan` (and each
        reference to it) to its study id."""
        rename = {iid: self.study_id(iid) for iid in sorted(plan.images)}
        def ref(iid: str) -> str:
            return rename.get(iid) or self.ids.get(iid, iid)
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
        """Write the photo id → study id mapping (CSV, sorted by study id)."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(MAPPING_COLUMNS)
        rows = sorted(self.ids.items(), key=lambda kv: kv[1])
        writer.writerows([[neutralise(original), study] for original, study in rows])
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
    bases and every revision about them; the patient's and photos' ids are blanked in the other
    rows' revisions and runs, the scheduler's leases of the photos go, staged files of killed
    imports go, and any file under ``cache/`` or ``runs/`` that still names them is deleted (any
    other such file is named in ``files_still_naming``). The database is
    checkpointed and vacuumed so no freed page keeps them. Returns what was removed (counts, photo
    ids, the files deleted) and the backups it cannot reach (``backups``: they still hold the patient),
    those still being written among them (``backups_in_progress``, also named in ``note``).

    The photos leave through a journalled swap (:mod:`annotations.infra.journal`): a process killed
    midway leaves either the patient whole or erased, never half."""
    store = ws.store
    swap = Swap(ws.root, "erase")
    try:
        with store.transaction():
            rows = store.erase_patient_rows(patient_id)
            if rows is None:
                raise DatasetError(f"no patient {patient_id!r} in {ws.root}")
            removed, ids, texts = rows.removed, rows.removed["photos"], rows.descriptions
            gone = set(ids)
            moves: list[tuple[Path | None, Path]] = []
            for image_id, file in rows.files:
                layers = readings_dir(ws) / image_id  # second-reading layers (rows gone: ON DELETE CASCADE)
                moves += [(path, swap.dir / "gone" / str(len(moves) + n))
                          for n, path in enumerate((ws.images_dir / file, ws.mask_path(image_id), layers))
                          if os.path.lexists(path)]
            (swap.dir / "gone").mkdir()
            swap.plan(moves, commit="meta")
            store.set_meta(swap.meta_key, True)  # commits the swap with the rows
        swap.forward()
        swap.done()
        removed["files"] = len(moves)
        with store.transaction():
            store.delete_meta(swap.meta_key)
    finally:
        swap.close()
    ws.recover()  # staged photos left by killed imports
    if study_ids is not None:
        removed["mapping_rows"] = StudyIds(ws, study_ids).forget(gone)
    removed["leases"] = delete_leases(ws.cache_dir / "scheduler.sqlite", ids)
    removed["deleted_files"], removed["files_still_naming"] = _delete_naming(ws, [patient_id, *ids, *texts])
    runs = sorted(p.name for p in ws.runs_dir.iterdir() if p.is_dir())
    removed["note"] = (f"{len(runs)} run folder(s) under runs/ may hold embeddings computed from these photos; "
                       "delete or recompute those runs") if runs else ""
    running = backups_in_progress(ws)
    removed["backups_in_progress"] = sorted(e["out"] for e in running)
    removed["backups"] = sorted({*(b for b in store.get_meta("backups", []) if Path(b).exists()),
                                 *removed["backups_in_progress"]})
    if running:
        removed["note"] = " ".join(filter(None, [removed["note"], (
            f"{len(running)} backup(s) started before this erase are still in progress and will hold the "
            f"patient: {', '.join(removed['backups_in_progress'])}; delete them once they finish")]))
    store.free_deleted_pages()  # so the patient's data does not linger in the database file
    return removed


def _holds(path: Path, patterns: list[re.Pattern[bytes]]) -> bool:
    """Whether the file matches one of ``patterns`` (memory-mapped: a large run file is not loaded)."""
    with path.open("rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return False
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return any(p.search(data) for p in patterns)


#: Shortest id or text searched for in the workspace's other files (a shorter one would match
#: the bytes of nearly any binary file); shorter ones are named in the result instead.
MIN_NEEDLE = 4


def _delete_naming(ws: Workspace, needles: list[str]) -> tuple[list[str], list[str]]:
    """Find every file of the workspace outside the store, photos and masks that names one of
    ``needles`` (in UTF-8 as a whole token, or in UTF-16/32 as numpy and Windows tools store text):
    those under ``cache/`` and ``runs/`` (derived data) are deleted, any other (a file the user put
    there, e.g. a study-id mapping not given) is only named. Returns (deleted, named), relative."""
    keep = {ws.images_dir, ws.masks_dir}
    long = [n for n in needles if len(n) >= MIN_NEEDLE]
    patterns = [re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(n.encode()) + rb"(?![A-Za-z0-9_])") for n in long]
    patterns += [re.compile(re.escape(n.encode(enc))) for n in long for enc in ("utf-16-le", "utf-32-le")]
    deleted, named = [], []
    for dirpath, dirs, files in os.walk(ws.root):
        dirs[:] = [d for d in dirs if Path(dirpath, d) not in keep]
        for name in files:
            path = Path(dirpath, name)
            if (path.parent == ws.root and name.startswith(DB_NAME)) or path.is_symlink() or not _holds(path, patterns):
                continue
            if path.is_relative_to(ws.cache_dir) or path.is_relative_to(ws.runs_dir):
                path.unlink()
                deleted.append(path.relative_to(ws.root).as_posix())
            else:
                named.append(path.relative_to(ws.root).as_posix())
    return deleted, named
