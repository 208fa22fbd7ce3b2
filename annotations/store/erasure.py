"""Erasing a patient: the store's queries that delete a patient's rows and blank their ids in the rows
that stay (:class:`Erasure`, which :class:`~annotations.store.store.Store` composes).

:func:`annotations.accounts.privacy.erase_patient` calls them inside its own transaction, with the files (and
the scheduler's leases of the photos: :func:`annotations.store.leases.delete_leases`).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import sqlite_utils

#: What an erased id becomes in the revisions and runs that stay
ERASED = "(erased)"


class ErasedRows(NamedTuple):
    """What :meth:`Erasure.erase_patient_rows` deleted."""

    #: patient, photos (their ids), wounds, judgments, llm_answers, revisions, revisions_blanked, runs_blanked
    removed: dict[str, Any]
    #: (image_id, file) of each of the patient's photos
    files: list[tuple[str, str]]
    #: the non-blank descriptions of their wounds
    descriptions: list[str]


class Erasure:
    """The queries of erasing a patient, a part of :class:`~annotations.store.store.Store`."""

    if TYPE_CHECKING:  # set by Store.__init__, defined by Store
        db: sqlite_utils.Database

        transaction: Callable[[], Any]

    def erase_patient_rows(self, patient_id: str) -> ErasedRows | None:
        """Delete the patient, their photos, wounds, the judgments and LLM answers naming the photos, and the
        revisions and import bases about any of them; blank their ids in the other revisions and the runs.
        None (nothing deleted) when there is no such patient. Joins the caller's open transaction."""
        db = self.db
        with self.transaction():
            if db.execute("SELECT 1 FROM patients WHERE patient_id = ?", [patient_id]).fetchone() is None:
                return None
            images = db.execute("SELECT image_id, file FROM images WHERE patient_id = ?", [patient_id]).fetchall()
            ids = [r[0] for r in images]
            marks = ",".join("?" * len(ids)) or "NULL"
            texts = [r[0] for r in db.execute(f"SELECT description FROM wounds WHERE image_id IN ({marks})", ids)
                     if r[0].strip()]
            refs = f"anchor IN ({marks}) OR ref_j IN ({marks}) OR ref_k IN ({marks})"
            removed: dict[str, Any] = {
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
            removed["revisions_blanked"] = _blank(db.conn, "revisions", ("old", "new"), {patient_id, *gone})
            removed["runs_blanked"] = _blank(db.conn, "runs", ("config", "metrics", "artifacts", "message"),
                                             {patient_id, *gone})
            return ErasedRows(removed, images, texts)

    def free_deleted_pages(self) -> None:
        """Checkpoint the write-ahead log, vacuum and checkpoint again, so that no freed page of the
        database file keeps deleted data."""
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.db.execute("VACUUM")
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _blank(conn: Any, table: str, columns: tuple[str, ...], ids: set[str]) -> int:
    """Replace every JSON string equal to one of ``ids`` by ``(erased)`` in ``columns`` of
    ``table`` (values that are not JSON are blanked when they equal an id); returns rows changed."""
    pairs = [(json.dumps(i), i) for i in ids]
    changed, hits = 0, set()
    for start in range(0, len(ids), 500):  # only the rows naming an id are read (SQLite finds them)
        chunk = sorted(ids)[start:start + 500]
        where = " OR ".join(f"instr({c}, ?) > 0" for c in columns for _ in chunk)
        hits.update(conn.execute(f"SELECT rowid FROM {table} WHERE {where}", chunk * len(columns)).fetchall())
    found = sorted(h[0] for h in hits)
    rows = []
    for start in range(0, len(found), 500):
        batch = found[start:start + 500]
        rows += conn.execute(f"SELECT rowid, {', '.join(columns)} FROM {table} WHERE rowid IN "
                             f"({','.join('?' * len(batch))})", batch).fetchall()
    for rowid, *values in rows:
        new = list(values)
        for n, value in enumerate(values):
            if not isinstance(value, str) or not any(q in value or value == i for q, i in pairs):
                continue
            try:
                new[n] = json.dumps(_blank_value(json.loads(value), ids), sort_keys=True)
            except json.JSONDecodeError:
                new[n] = ERASED if value in ids else value
        if new != values:
            conn.execute(f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in columns)} WHERE rowid = ?",
                         [*new, rowid])
            changed += 1
    return changed


def _blank_value(value: Any, ids: set[str]) -> Any:
    if isinstance(value, str):
        return ERASED if value in ids else value
    if isinstance(value, list):
        return [_blank_value(v, ids) for v in value]
    if isinstance(value, dict):
        return {(ERASED if k in ids else k): _blank_value(v, ids) for k, v in value.items()}
    return value


def _names(entity: str, key: Any, images: set[str], patient_id: str) -> bool:
    """Whether a revision or import base of ``entity`` with natural key ``key`` is about the patient or
    one of their photos."""
    if entity == "patients":
        return key == patient_id
    if entity in ("images", "reading_photos"):
        return key in images
    if entity in ("wounds", "readings"):
        return isinstance(key, dict) and key.get("image_id") in images
    if entity == "triplets":
        return isinstance(key, dict) and bool(images & {key.get("anchor"), key.get("ref_j"), key.get("ref_k")})
    return False
