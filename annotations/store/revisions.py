"""The revisions table and edits from a loaded copy: the store's queries of every recorded change
(:class:`Revisions`, which :class:`~annotations.store.store.Store` composes), and the import bases.

Every write through the store records a revision (who, when, which row and field, old and new value);
an edit from a loaded copy is a compare-and-set that raises :class:`StaleEdit` when someone changed a
field since.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from annotations.store.rows import _canonical, _json_default, key_json, now, where_equal

if TYPE_CHECKING:
    import sqlite_utils


class Revisions:
    """The ``revisions`` and ``import_base`` tables' queries, a part of :class:`~annotations.store.store.Store`."""

    if TYPE_CHECKING:  # set by Store.__init__, defined by Store
        db: sqlite_utils.Database
        _action_override: str | None

        transaction: Callable[[], Any]
        get_meta: Callable[..., Any]
        patient: Callable[[str], dict | None]
        image: Callable[[str], dict | None]
        wound: Callable[[str, int], dict | None]
        upsert_patient: Callable[..., None]
        upsert_image: Callable[..., None]
        upsert_wound: Callable[..., int]

    def record_revision(self, entity: str, key: Any, field: str, action: str, old: Any, new: Any,
                        actor: str) -> int:
        """Append one change to the revisions table (JSON-encoded ``key``, ``old`` and ``new``)."""
        if not actor or not str(actor).strip():
            raise ValueError("a revision needs an actor (account name, 'import' or a job name)")
        action = self._action_override or action
        cur = self.db.execute(
            "INSERT INTO revisions (entity, key, field, action, old, new, actor, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [entity, key_json(key), field, action,
             json.dumps(old, sort_keys=True, default=_json_default),
             json.dumps(new, sort_keys=True, default=_json_default), str(actor).strip(), now()])
        assert cur.lastrowid is not None  # set by the INSERT
        return cur.lastrowid

    def _record_changes(self, entity: str, key: Any, old: dict | None, new: dict, actor: str) -> None:
        """One ``insert`` revision for a new row, else one ``update`` per changed field."""
        if old is None:
            self.record_revision(entity, key, "row", "insert", None, new, actor)
            return
        for field_name, value in new.items():
            if _canonical(old.get(field_name)) != _canonical(value):
                self.record_revision(entity, key, field_name, "update", old.get(field_name), value, actor)

    # -- edits from a loaded copy (optimistic concurrency) ------------------------------------------
    def fields(self, entity: str, key: Any) -> dict[str, Any] | None:
        """The editable fields of one row as an editor loads them, None when the row does not exist.

        ``entity`` and ``key`` as in the revisions: ``wounds`` (:func:`wound_key`) gives ``description``,
        ``outline`` ({area, bbox}) and ``metadata.<name>``; ``images`` (photo id) ``patient_id`` and
        ``metadata.<name>``; ``patients`` (patient id) ``metadata.<name>``; ``accounts`` (name) ``role``,
        ``email`` and ``disabled``; ``meta`` (a workspace setting's key) ``value``. A field not listed is None."""
        if entity == "meta":
            return {"value": self.get_meta(key)}
        if entity == "accounts":
            rows = list(self.db.query("SELECT role, email, disabled FROM accounts WHERE name = ?", [key]))
            return {**rows[0], "disabled": bool(rows[0]["disabled"])} if rows else None
        if entity == "wounds":
            row = self.wound(key["image_id"], key["wound_index"])
            top = {} if row is None else {
                "description": row["description"],
                "outline": {"area": int(row["area"]), "bbox": [int(v) for v in row["bbox"]]}}
        elif entity == "images":
            row = self.image(key)
            top = {} if row is None else {"patient_id": row["patient_id"]}
        elif entity == "patients":
            row, top = self.patient(key), {}
        else:
            raise ValueError(f"no editable fields for {entity!r}")
        if row is None:
            return None
        return {**top, **{f"metadata.{name}": value for name, value in (row["metadata"] or {}).items()}}

    @contextlib.contextmanager
    def expecting(self, entity: str, key: Any, loaded: Mapping[str, Any],
                  yours: Mapping[str, Any] | None = None) -> Iterator[None]:
        """One write transaction (compare-and-set) that first checks every field of ``loaded`` (field →
        value as the editor loaded it, see :meth:`fields`) still holds that value, or already ``yours``
        (the same edit made twice); the body's writes join it. Raises :class:`StaleEdit` (their value
        and ``yours`` per changed field), and nothing is written, when one changed since or the row is
        gone."""
        with self.transaction():
            current = self.fields(entity, key)
            now_ = current or {}
            mine = yours or {}
            conflicts = {name: (now_.get(name), mine.get(name)) for name, value in loaded.items()
                         if current is None or _canonical(now_.get(name)) not in {
                             _canonical(value), *([_canonical(mine[name])] if name in mine else [])}}
            if conflicts:
                recorded = sorted({name.split(".")[0] for name in conflicts} | {"row"})  # metadata.x: metadata
                last = self.db.execute(
                    f"SELECT actor, created FROM revisions WHERE entity = ? AND key = ? AND field IN "
                    f"({', '.join('?' * len(recorded))}) ORDER BY id DESC LIMIT 1",
                    [entity, key_json(key), *recorded]).fetchone()
                raise StaleEdit(entity, key, conflicts, gone=current is None, by=last[0] if last else None,
                                at=last[1] if last else None)
            yield

    def edit(self, entity: str, key: Any, loaded: Mapping[str, Any], changes: Mapping[str, Any], *,
             actor: str) -> dict[str, Any]:
        """Save only ``changes`` (field → new value; a ``metadata.<name>`` of None or "" removes it) of a
        wound, photo or patient, provided each changed field still holds its ``loaded`` value (a metadata
        field missing from ``loaded`` was absent), in one transaction (:meth:`expecting`). Returns the
        fields written (a field already at its new value is not rewritten), each recorded as a revision
        under ``actor``. Raises :class:`StaleEdit` otherwise, ValueError for a field without its loaded
        value or one this method does not write."""
        missing = sorted(n for n in changes if n not in loaded and not n.startswith("metadata."))
        if missing:  # a metadata field the row did not have loads as None
            raise ValueError(f"no loaded value for {', '.join(missing)}: cannot check the edit")
        writable = {"wounds": ("description",), "images": ("patient_id",), "patients": ()}.get(entity)
        if writable is None or any(not n.startswith("metadata.") and n not in writable for n in changes):
            raise ValueError(f"edit writes the description and metadata of wounds, photos and patients "
                             f"and a photo's patient, not {entity} {sorted(changes)}")
        with self.expecting(entity, key, {name: loaded.get(name) for name in changes}, changes):
            current = self.fields(entity, key) or {}
            writes = {n: v for n, v in changes.items() if _canonical(current.get(n)) != _canonical(v)
                      and not (n.startswith("metadata.") and v in (None, "") and current.get(n) in (None, ""))}
            if writes:
                self._write_fields(entity, key, writes, actor)
            return writes

    def _write_fields(self, entity: str, key: Any, writes: Mapping[str, Any], actor: str) -> None:
        """Write ``writes`` (fields of :meth:`edit`) over the row's other values, through its upsert."""
        row = (self.wound(key["image_id"], key["wound_index"]) if entity == "wounds"
               else self.image(key) if entity == "images" else self.patient(key))
        assert row is not None  # checked by expecting()
        metadata = dict(row["metadata"] or {})
        for name, value in writes.items():
            if name.startswith("metadata."):
                if value in (None, ""):
                    metadata.pop(name[len("metadata."):], None)
                else:
                    metadata[name[len("metadata."):]] = value
        if entity == "wounds":
            self.upsert_wound(key["image_id"], key["wound_index"], row["area"], row["bbox"],
                              writes.get("description", row["description"]), metadata, actor=actor)
        elif entity == "images":
            self.upsert_image(key, row["file"], row["sha256"], row["width"], row["height"],
                              writes.get("patient_id", row["patient_id"]), metadata, actor=actor)
        else:
            self.upsert_patient(key, metadata, actor=actor)

    def revision(self, revision_id: int) -> dict | None:
        """One revision by id (key and values decoded), or None."""
        rows = self._revision_rows("SELECT * FROM revisions WHERE id = ?", [int(revision_id)])
        return rows[0] if rows else None

    def _revision_rows(self, sql: str, args: list) -> list[dict]:
        rows = list(self.db.query(sql, args))
        for r in rows:
            for col in ("key", "old", "new"):
                # key/old/new are never SQL NULL (JSON 'null' is stored): the None branch never runs
                r[col] = json.loads(r[col]) if r[col] is not None else None  # pragma: no mutate
        return rows

    def last_revision_id(self) -> int:
        """The newest revision's id (0 when none): it grows with every recorded change."""
        return int(self.db.execute("SELECT coalesce(max(id), 0) FROM revisions").fetchone()[0])

    def last_outline_edit(self) -> str | None:
        """When a wound outline was last added, changed or deleted (ISO time in UTC), or None."""
        return self.db.execute("SELECT MAX(created) FROM revisions WHERE entity = 'wounds' "
                               "AND field IN ('outline', 'row')").fetchone()[0]

    def outline_authors(self) -> dict[str, str]:
        """Wound key JSON → who last drew its outline (the latest outline or insert revision)."""
        out = {}
        for key, actor in self.db.execute("SELECT key, actor FROM revisions WHERE entity = 'wounds' AND "
                                          "field IN ('outline', 'row') AND action != 'delete' ORDER BY id"):
            out[key] = actor
        return out

    def revisions(self, entity: str | None = None, key: Any = None) -> list[dict]:
        """Recorded changes, oldest first (``old``/``new``/``key`` decoded from JSON)."""
        where, args = where_equal(entity=entity, key=None if key is None else key_json(key))
        return self._revision_rows("SELECT * FROM revisions" + where + " ORDER BY id", args)

    # -- import bases (what each import last read, for the re-import merge) -----------------------
    def import_bases(self) -> dict[tuple[str, str, str], str]:
        """``(entity, key JSON, field) → sha256`` of the value the last import read."""
        return {(r["entity"], r["key"], r["field"]): r["hash"]
                for r in self.db.query("SELECT entity, key, field, hash FROM import_base")}

    def set_import_base(self, entity: str, key: Any, field: str, value_hash: str | None) -> None:
        """Remember (or, with ``None``, forget) what an import read for one row field."""
        if value_hash is None:
            self.db.execute("DELETE FROM import_base WHERE entity = ? AND key = ? AND field = ?",
                            [entity, key_json(key), field])
        else:
            self.db.execute(
                "INSERT INTO import_base (entity, key, field, hash, updated) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(entity, key, field) DO UPDATE SET hash = excluded.hash, updated = excluded.updated",
                [entity, key_json(key), field, value_hash, now()])


class StaleEdit(ValueError):
    """An edit made from a stale copy: a field it changes was changed by someone else (``by``, at ``at``:
    the last revision of those fields or of the row) since the editor loaded it, or the row is ``gone``.
    ``conflicts``: field → (their value now, your value)."""

    def __init__(self, entity: str, key: Any, conflicts: dict[str, tuple[Any, Any]], *, gone: bool = False,
                 by: str | None = None, at: str | None = None) -> None:
        self.entity, self.key, self.conflicts, self.gone, self.by, self.at = entity, key, conflicts, gone, by, at
        what = "was deleted" if gone else "was changed"
        who = f" by {by}" if by else ""
        detail = "; ".join(f"{name}: theirs {theirs!r}, yours {mine!r}" for name, (theirs, mine) in conflicts.items())
        super().__init__(f"{entity} {key_json(key)} {what}{who} since you opened it; nothing was saved ({detail})")
