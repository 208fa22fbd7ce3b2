"""The second readings: the store's queries of the ``reading_photos`` and ``readings`` tables
(:class:`Readings`, which :class:`~annotations.store.store.Store` composes).

A photo an admin marked for second reading has a ``reading_photos`` row; each reader's outline of it is a
``readings`` row naming the reader's layer file (:mod:`annotations.followup.readings` writes the files).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from annotations.store.rows import now

if TYPE_CHECKING:
    import sqlite_utils


class Readings:
    """The ``reading_photos`` and ``readings`` tables' queries, a part of :class:`~annotations.store.store.Store`."""

    if TYPE_CHECKING:  # set by Store.__init__, defined by Store and Revisions
        db: sqlite_utils.Database

        transaction: Callable[[], Any]
        record_revision: Callable[..., int]

    def reading_photos(self) -> list[str]:
        """The photos marked for second reading, sorted."""
        return [r["image_id"] for r in self.db.query("SELECT image_id FROM reading_photos ORDER BY image_id")]

    def is_reading_photo(self, image_id: str) -> bool:
        """Whether the photo is marked for second reading."""
        return bool(list(self.db.query("SELECT 1 FROM reading_photos WHERE image_id = ?", [image_id])))

    def mark_reading_photo(self, image_id: str, actor: str) -> bool:
        """Mark the photo for second reading (its ``marked`` revision recorded); False when it already was."""
        with self.transaction():
            cur = self.db.execute("INSERT OR IGNORE INTO reading_photos (image_id, actor, created) VALUES (?, ?, ?)",
                                  [image_id, actor, now()])
            if cur.rowcount == 1:
                self.record_revision("reading_photos", image_id, "marked", "insert", False, True, actor)
        return cur.rowcount == 1

    def unmark_reading_photo(self, image_id: str, actor: str) -> bool:
        """Unmark the photo (its ``marked`` revision recorded; its readings stay); False when it was not marked."""
        with self.transaction():
            cur = self.db.execute("DELETE FROM reading_photos WHERE image_id = ?", [image_id])
            if cur.rowcount == 1:
                self.record_revision("reading_photos", image_id, "marked", "delete", True, False, actor)
        return cur.rowcount == 1

    def readings(self, image_id: str | None = None) -> list[dict[str, Any]]:
        """The readings rows ``{image_id, reader, file, wounds, area, updated}`` (of one photo, or of every
        photo), by photo then reader."""
        sql = "SELECT * FROM readings" + (" WHERE image_id = ?" if image_id is not None else "")
        return list(self.db.query(sql + " ORDER BY image_id, reader COLLATE NOCASE",
                                  [image_id] if image_id is not None else []))

    def reading(self, image_id: str, reader: str) -> dict[str, Any] | None:
        """The reader's readings row of the photo (the name compared ignoring case), or None."""
        rows = list(self.db.query("SELECT * FROM readings WHERE image_id = ? AND reader = ?", [image_id, reader]))
        return rows[0] if rows else None

    def upsert_reading(self, image_id: str, reader: str, file: str, wounds: int, area: int) -> None:
        """Insert the reader's readings row of the photo, or update its wounds, area and time (its file and
        the reader's name as first stored are kept)."""
        self.db.execute(
            "INSERT INTO readings (image_id, reader, file, wounds, area, updated) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(image_id, reader) DO UPDATE SET wounds = excluded.wounds, area = excluded.area, "
            "updated = excluded.updated", [image_id, reader, file, wounds, area, now()])
