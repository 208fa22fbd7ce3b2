"""The triplet scheduler's queries: its leases in their own SQLite file (:class:`LeaseFile`; :func:`delete_leases`
for erase-patient) and its reads of the judgments in the store (:class:`Scheduling`, which
:class:`~annotations.store.store.Store` composes).

:class:`annotations.scheduling.scheduler.TripletScheduler` holds the drawing rules and asks these by name.
"""
from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlite_utils

_SCHEMA = """
CREATE TABLE IF NOT EXISTS served (
    annotator TEXT NOT NULL,
    anchor TEXT NOT NULL,
    ref_a TEXT NOT NULL,
    ref_b TEXT NOT NULL,
    rep INTEGER NOT NULL,
    kind TEXT NOT NULL,
    ref_j TEXT NOT NULL,
    ref_k TEXT NOT NULL,
    served_at REAL NOT NULL,
    PRIMARY KEY (annotator, anchor, ref_a, ref_b, rep)
);
CREATE INDEX IF NOT EXISTS served_rep_anchor ON served (rep, anchor)
"""


class LeaseFile:
    """The scheduler's lease file ``path`` (``<workspace>/cache/scheduler.sqlite``): every question served, one
    connection per use."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path,
                              timeout=60,  # pragma: no mutate (PRAGMA busy_timeout on the next line overrides it)
                              # writes run inside an explicit BEGIN IMMEDIATE … COMMIT: no implicit transaction opens
                              isolation_level=None,  # pragma: no mutate
                              )
        con.execute("PRAGMA busy_timeout = 60000")
        return con

    def create(self) -> None:
        """Create the lease table and its index unless they exist."""
        with self._connect() as con:
            for statement in _SCHEMA.split(";"):
                con.execute(statement)

    def served(self, annotator: str) -> list[dict[str, Any]]:
        """Every question served to ``annotator``, oldest first."""
        with self._connect() as con:
            con.row_factory = sqlite3.Row
            rows = con.execute(
                "SELECT * FROM served WHERE annotator = ? ORDER BY served_at, rowid", (annotator,)
            ).fetchall()
        return [dict(r) for r in rows]

    @contextlib.contextmanager
    def leasing(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` … ``COMMIT`` on a new connection (rolled back on any exception, then closed):
        no other draw reads or leases meanwhile."""
        con = self._connect()
        try:
            con.execute("BEGIN IMMEDIATE")
            yield con
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            con.close()

    @staticmethod
    def leased(con: sqlite3.Connection, annotator: str) -> list[tuple]:
        """(anchor, ref_a, ref_b, rep, kind, served_at) of every question served to ``annotator``, read in
        the open :meth:`leasing` transaction ``con``."""
        return con.execute(
            "SELECT anchor, ref_a, ref_b, rep, kind, served_at FROM served WHERE annotator = ?",
            (annotator,),
        ).fetchall()

    @staticmethod
    def anchor_load(con: sqlite3.Connection) -> dict[str, int]:
        """Anchor → number of first-time questions served with it (every annotator), read in ``con``."""
        return dict(con.execute("SELECT anchor, count(*) FROM served WHERE rep = 0 GROUP BY anchor"))

    @staticmethod
    def lease(con: sqlite3.Connection, annotator: str, anchor: str, ref_a: str, ref_b: str, rep: int, kind: str,
              ref_j: str, ref_k: str, served_at: float) -> None:
        """Record one question served (``ref_a`` < ``ref_b`` the sorted references) in ``con``."""
        con.execute(
            "INSERT INTO served VALUES (?,?,?,?,?,?,?,?,?)",
            (annotator, anchor, ref_a, ref_b, rep, kind, ref_j, ref_k, served_at),
        )

    def kind(self, annotator: str, anchor: str, ref_a: str, ref_b: str, rep: int) -> str | None:
        """The kind of the question served to ``annotator`` with these sorted references, or None."""
        with self._connect() as con:
            row = con.execute("SELECT kind FROM served WHERE annotator = ? AND anchor = ? AND ref_a = ? AND "
                              "ref_b = ? AND rep = ?", (annotator, anchor, ref_a, ref_b, rep)).fetchone()
        return row[0] if row else None


def delete_leases(path: Path, image_ids: list[str]) -> int:
    """Delete the scheduler's leases naming the photos from its lease file ``path``
    (``cache/scheduler.sqlite``), then vacuum it; returns how many were deleted (0 when the file or its
    lease table does not exist yet)."""
    if not path.exists() or not image_ids:
        return 0
    marks = ",".join("?" * len(image_ids))
    con = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        cols = ("anchor", "ref_a", "ref_b", "ref_j", "ref_k")
        count = con.execute(f"DELETE FROM served WHERE {' OR '.join(f'{c} IN ({marks})' for c in cols)}",
                            image_ids * len(cols)).rowcount
        con.execute("VACUUM")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.OperationalError:  # no lease table yet
        count = 0
    finally:
        con.close()
    return count


class Scheduling:
    """The scheduler's reads of the stored judgments and its lease file, a part of
    :class:`~annotations.store.store.Store`."""

    if TYPE_CHECKING:  # set by Store.__init__
        db: sqlite_utils.Database

    @staticmethod
    def lease_file(path: Path) -> LeaseFile:
        """The scheduler's lease file at ``path`` (its own SQLite file, apart from the store's)."""
        return LeaseFile(path)

    def expert_answers(self, source: str) -> list[tuple]:
        """(anchor, ref_j, ref_k, rep, choice) of every judgment of ``source``."""
        return self.db.execute(
            "SELECT anchor, ref_j, ref_k, rep, choice FROM triplets WHERE source = ?", [source]).fetchall()

    def other_experts_answer_count(self, source: str) -> int:
        """How many expert judgments are stored from sources other than ``source`` (two index counts)."""
        # a wrong count only recounts the ranking on every draw instead of when others' answers change
        return (self.db.execute("SELECT count(*) FROM triplets WHERE source >= 'expert:' AND source < 'expert;'")  # pragma: no mutate
                .fetchone()[0] - self.db.execute("SELECT count(*) FROM triplets WHERE source = ?",
                                                 [source]).fetchone()[0])

    def shared_expert_triplets(self, source: str, salt: int) -> list[tuple]:
        """(anchor, ref_a, ref_b, n, first id) of the triplets other experts than ``source`` answered first-time
        and not skipped, most-answered first, ties in the order ``salt`` shuffles them to."""
        return self.db.execute(
            "SELECT anchor, min(ref_j, ref_k), max(ref_j, ref_k), count(*) AS n, min(id) AS first FROM triplets"
            " WHERE source >= 'expert:' AND source < 'expert;' AND source <> ? AND rep = 0 AND choice <> 'skip'"
            " GROUP BY 1, 2, 3 ORDER BY n DESC, (first * ?) % 2147483647", [source, salt]).fetchall()

    def has_answer_since(self, source: str, since: str) -> bool:
        """Whether a judgment of ``source`` is stored at or after ``since``."""
        return self.db.execute("SELECT 1 FROM triplets WHERE source = ? AND created >= ? LIMIT 1",
                               [source, since]).fetchone() is not None

    def last_answer_since(self, source: str, since: str) -> dict[str, Any] | None:
        """{id, anchor, ref_j, ref_k, rep} of the newest judgment of ``source`` stored at or after ``since``,
        or None."""
        rows = list(self.db.query(
            "SELECT id, anchor, ref_j, ref_k, rep FROM triplets WHERE source = ? AND created >= ? "
            "ORDER BY id DESC LIMIT 1", [source, since]))
        return rows[0] if rows else None
