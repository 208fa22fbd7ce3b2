"""A store's copies for backup and restore: the online copy of a live store (:func:`copy_store`) and the checks
of a copy before it is restored (:func:`examine`, :func:`product_schema`).

:mod:`annotations.infra.backup` holds the write lock, the files, the manifest and the messages; these run the SQL.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from annotations.store.store import MIGRATIONS

#: A schema object of a database: (type, name, SQL)
SchemaObject = tuple[str, str, str | None]


class UnreadableDatabase(Exception):
    """A copied store that does not open or read as a database; the message is SQLite's."""


def copy_store(path: Path, dest: Path, without_meta: str) -> None:
    """Copy the store ``path`` to the new file ``dest`` with SQLite's online backup API, from a second connection
    that reads the committed state (WAL readers pass a held write lock), delete the meta key ``without_meta`` from
    the copy and make it one self-contained file (journal mode DELETE)."""
    source = sqlite3.connect(path)
    copy = sqlite3.connect(dest)
    try:
        source.backup(copy)
        with copy:
            copy.execute("DELETE FROM meta WHERE key = ?", [without_meta])
        copy.execute("PRAGMA journal_mode = DELETE")
    finally:
        copy.close()
        source.close()


def examine(path: Path) -> tuple[str, int, set[SchemaObject]]:
    """The first line of ``integrity_check``, the schema version and the schema objects of the database file
    ``path``, opened read-only and immutable; raises :class:`UnreadableDatabase` when it does not open or read."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as err:
        raise UnreadableDatabase(err) from None
    try:
        result = conn.execute("PRAGMA integrity_check").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        objects = set(conn.execute("SELECT type, name, sql FROM sqlite_master"))
    except sqlite3.DatabaseError as err:
        raise UnreadableDatabase(err) from None
    finally:
        conn.close()
    return result, version, objects


def product_schema(version: int) -> set[SchemaObject]:
    """The schema objects (type, name, SQL) of a database TriDerm brought to ``version``."""
    conn = sqlite3.connect(":memory:")
    try:
        for statements in MIGRATIONS[:version]:
            for statement in statements:
                conn.execute(statement)
        return set(conn.execute("SELECT type, name, sql FROM sqlite_master"))
    finally:
        conn.close()
