"""A dataset import's and export's queries: the dataset's judgments in a temporary SQLite file of their own
(:class:`JudgmentTable`) and the re-import merge's and the export's reads and writes of the store's judgments and
their import bases (:class:`Imports`, which :class:`~annotations.store.store.Store` composes).

:mod:`annotations.io.dataset` holds the validation, the merge rules, the file swap and the transactions, and
asks these by name.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlite_utils

#: Rows read or written at a time: a million judgments never sit in memory
BATCH = 5000
#: A judgment's natural key (:func:`annotations.store.rows.triplet_key`), in the order the queries bind it
TRIPLET_KEY = ("source", "anchor", "ref_j", "ref_k", "rep")


class DuplicateJudgment(ValueError):
    """A judgment a :class:`JudgmentTable` holds twice (the first such, by line)."""

    def __init__(self, source: str, images: tuple[str, ...], rep: int) -> None:
        self.source, self.images, self.rep = source, images, rep
        super().__init__(f"the judgment {images} by {source} with rep {rep} is listed twice")


class JudgmentTable:
    """A dataset's judgments in file order, kept in a temporary SQLite file so that a million of
    them never sit in memory. Rows are dicts of :data:`COLUMNS` (plus the merge's ``action``,
    ``change`` and ``cur_id``); a row without ``rep`` gets the number of earlier rows with the same
    source and images (:meth:`finish`)."""

    COLUMNS = ("line", "anchor", "ref_j", "ref_k", "choice", "source", "rep", "latency_ms", "created")
    BATCH = BATCH

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="triderm-triplets-")
        self.db = sqlite3.connect(os.path.join(self._dir, "triplets.sqlite"), isolation_level=None,
                                  check_same_thread=False)  # closed by the finalizer, maybe in another thread
        self.db.execute("PRAGMA journal_mode = OFF")
        self.db.execute("PRAGMA synchronous = OFF")
        self.db.execute("CREATE TABLE t (line INTEGER PRIMARY KEY, anchor TEXT, ref_j TEXT, ref_k TEXT, choice TEXT, "
                        "source TEXT, rep INTEGER, latency_ms REAL, created TEXT, action TEXT, change TEXT, "
                        "cur_id INTEGER)")
        self._pending: list[tuple] = []
        self._count = 0
        self._close = weakref.finalize(self, _drop_table, self.db, self._dir)

    def add(self, row: tuple) -> None:
        """One row, in :data:`COLUMNS` order (``rep`` may be None)."""
        self._pending.append(row)
        if len(self._pending) >= self.BATCH:
            self._flush()

    def _flush(self) -> None:
        self.db.executemany(f"INSERT INTO t ({', '.join(self.COLUMNS)}) VALUES ({', '.join('?' * len(self.COLUMNS))})",
                            self._pending)
        self._count += len(self._pending)
        self._pending.clear()

    def finish(self) -> None:
        """Number the rows without ``rep``; raises :class:`DuplicateJudgment` when a judgment is listed twice."""
        self._flush()
        self.db.execute("UPDATE t SET rep = w.n FROM (SELECT line, row_number() OVER (PARTITION BY source, anchor, "
                        "ref_j, ref_k ORDER BY line) - 1 AS n FROM t) AS w WHERE t.rep IS NULL AND w.line = t.line")
        self._index()

    def _index(self) -> None:
        try:
            self.db.execute("CREATE UNIQUE INDEX t_key ON t (source, anchor, ref_j, ref_k, rep)")
        except sqlite3.IntegrityError:
            source, *ids, rep = self.db.execute(
                "SELECT source, anchor, ref_j, ref_k, rep FROM t GROUP BY source, anchor, ref_j, ref_k, rep "
                "HAVING count(*) > 1 ORDER BY min(line) LIMIT 1").fetchone()
            raise DuplicateJudgment(source, tuple(ids), rep) from None

    def rename(self, ref: Callable[[str], str]) -> None:
        """Replace every image id by ``ref(id)``; raises :class:`DuplicateJudgment` when two judgments become one."""
        self.db.create_function("ref", 1, ref, deterministic=True)
        self.db.execute("DROP INDEX t_key")
        self.db.execute("UPDATE t SET anchor = ref(anchor), ref_j = ref(ref_j), ref_k = ref(ref_k)")
        self._index()

    def __len__(self) -> int:
        return self._count

    def _rows(self, where: str) -> Iterator[dict[str, Any]]:
        cur = self.db.execute(f"SELECT * FROM t WHERE {where} ORDER BY line")
        names = [d[0] for d in cur.description]
        while batch := cur.fetchmany(self.BATCH):
            for values in batch:
                yield dict(zip(names, values))

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every row, in file order."""
        return self._rows("1")

    def decided_rows(self) -> Iterator[dict[str, Any]]:
        """The rows the merge decided to write (an ``action``), in file order."""
        return self._rows("action IS NOT NULL")

    def inserted_rows(self) -> Iterator[dict[str, Any]]:
        """The rows the merge reports as new judgments (``change`` insert), in file order."""
        return self._rows("change = 'insert'")

    def clear_decisions(self) -> None:
        """Forget every row's merge decision (``action``, ``change``, ``cur_id``)."""
        self.db.execute("UPDATE t SET action = NULL, change = NULL, cur_id = NULL")

    def decide_all_inserts(self) -> None:
        """Decide every row a new judgment (the merge into a store without judgments)."""
        self.db.execute("UPDATE t SET action = 'insert', change = 'insert'")

    def decide(self, decisions: Sequence[tuple[str | None, str | None, int | None, int]]) -> None:
        """Record the merge's decisions ``(action, change, cur_id, line)``."""
        self.db.executemany("UPDATE t SET action = ?, change = ?, cur_id = ? WHERE line = ?", decisions)

    def find(self, key: Mapping[str, Any]) -> bool:
        """Whether the judgment ``key`` (:func:`~annotations.store.rows.triplet_key`) is in the dataset."""
        return self.db.execute("SELECT 1 FROM t WHERE source = ? AND anchor = ? AND ref_j = ? AND ref_k = ? AND "
                               "rep = ?", [key[k] for k in TRIPLET_KEY]).fetchone() is not None

    def close(self) -> None:
        """Close and remove the on-disk table now (it is also removed when garbage-collected)."""
        self._close()


def _drop_table(db: sqlite3.Connection, folder: str) -> None:
    db.close()
    shutil.rmtree(folder, ignore_errors=True)


class Imports:
    """The re-import merge's and the export's queries of the judgments and the import bases, a part of
    :class:`~annotations.store.store.Store` (the other import bases: :class:`~annotations.store.revisions.Revisions`)."""

    if TYPE_CHECKING:  # set by Store.__init__
        db: sqlite_utils.Database

    def import_bases_but_judgments(self) -> dict[tuple[str, str, str], str]:
        """``(entity, key JSON, field) → sha256`` of what the last import read, judgments left out (the merge
        looks theirs up one by one: :meth:`judgment_base`)."""
        return {(e, k, n): h for e, k, n, h in self.db.execute(
            "SELECT entity, key, field, hash FROM import_base WHERE entity != 'triplets'")}

    def has_judgment_bases(self) -> bool:
        """Whether an import read any judgment."""
        return self.db.execute("SELECT 1 FROM import_base WHERE entity = 'triplets' LIMIT 1").fetchone() is not None

    def has_triplets(self) -> bool:
        """Whether the store holds any judgment."""
        return self.db.conn.execute("SELECT 1 FROM triplets LIMIT 1").fetchone() is not None

    def triplet_by_key(self, key: Mapping[str, Any]) -> tuple[int, str] | None:
        """``(id, choice)`` of the judgment ``key`` (:func:`~annotations.store.rows.triplet_key`), or None."""
        return self.db.conn.execute("SELECT id, choice FROM triplets WHERE source = ? AND anchor = ? AND ref_j = ? AND "
                                    "ref_k = ? AND rep = ?", [key[k] for k in TRIPLET_KEY]).fetchone()

    def judgment_base(self, key: str) -> str | None:
        """The sha256 of the judgment (its key JSON) the last import read, or None."""
        row = self.db.conn.execute("SELECT hash FROM import_base WHERE entity = 'triplets' AND key = ? AND "
                                   "field = 'row'", [key]).fetchone()
        return row[0] if row else None

    def judgment_bases(self) -> Iterator[tuple[str, str]]:
        """``(key JSON, sha256)`` of every judgment an import read, read :data:`BATCH` at a time."""
        cur = self.db.conn.execute("SELECT key, hash FROM import_base WHERE entity = 'triplets' AND field = 'row'")
        while batch := cur.fetchmany(BATCH):
            yield from batch

    def triplet_ids_naming(self, image_id: str) -> list[int]:
        """The ids of the judgments that name the photo (as anchor or either reference)."""
        return [tid for (tid,) in self.db.execute("SELECT id FROM triplets WHERE ? IN (anchor, ref_j, ref_k)",
                                                  [image_id])]

    def set_judgment_bases(self, bases: Sequence[tuple[str, str, str]]) -> None:
        """Remember what an import read of each judgment: ``(key JSON, sha256, updated)``."""
        self.db.conn.executemany(
            "INSERT INTO import_base (entity, key, field, hash, updated) VALUES ('triplets', ?, 'row', ?, ?) "
            "ON CONFLICT(entity, key, field) DO UPDATE SET hash = excluded.hash, updated = excluded.updated", bases)

    def triplets_oldest_first(self) -> Iterator[tuple[str, str, str, str, str, int, float | None, str]]:
        """Every judgment's ``(anchor, ref_j, ref_k, choice, source, rep, latency_ms, created)``, oldest first,
        read :data:`BATCH` at a time."""
        cur = self.db.conn.execute("SELECT anchor, ref_j, ref_k, choice, source, rep, latency_ms, created "
                                   "FROM triplets ORDER BY id")
        while batch := cur.fetchmany(BATCH):
            yield from batch
