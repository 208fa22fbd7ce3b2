"""The SQLite annotation store: patients, images, wounds, annotators, triplet judgments and LLM
answers here; the run records, the revisions, the second readings, a patient's erasure, the accounts, the
scheduler's reads and an import's and export's judgments in the query modules :class:`Store` composes
(:mod:`annotations.store.run_records`, :mod:`annotations.store.revisions`, :mod:`annotations.store.readings`,
:mod:`annotations.store.erasure`, :mod:`annotations.store.accounts`, :mod:`annotations.store.leases`,
:mod:`annotations.store.imports`).

One file per workspace (``triderm.sqlite``), opened in WAL mode with a busy timeout so the app,
background jobs and several annotators can write at once. Natural-key unique constraints make
every insert idempotent: a re-import or a double click never duplicates a row.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from annotations.infra import jobs
from annotations.infra.fileio import write_step
from annotations.store.accounts import Accounts
from annotations.store.erasure import Erasure
from annotations.store.imports import Imports
from annotations.store.leases import Scheduling
from annotations.store.readings import Readings
from annotations.store.revisions import Revisions
from annotations.store.rows import (SYSTEM_ACTOR, _decode, _dumps, image_file_value, key_json, now,
                                    triplet_key, wound_key)
from annotations.store.run_records import RunRecords

CHOICES = ("j", "k", "skip")

_SCHEMA_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE patients (
    patient_id TEXT PRIMARY KEY,
    metadata TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE images (
    image_id TEXT PRIMARY KEY,
    file TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    patient_id TEXT REFERENCES patients(patient_id),
    metadata TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE wounds (
    id INTEGER PRIMARY KEY,
    image_id TEXT NOT NULL REFERENCES images(image_id) ON DELETE CASCADE,
    wound_index INTEGER NOT NULL CHECK (wound_index >= 1),
    area INTEGER NOT NULL,
    bbox TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}',
    UNIQUE (image_id, wound_index)
);
CREATE TABLE annotators (name TEXT PRIMARY KEY, created TEXT NOT NULL);
CREATE TABLE triplets (
    id INTEGER PRIMARY KEY,
    anchor TEXT NOT NULL REFERENCES images(image_id) ON DELETE CASCADE,
    ref_j TEXT NOT NULL REFERENCES images(image_id) ON DELETE CASCADE,
    ref_k TEXT NOT NULL REFERENCES images(image_id) ON DELETE CASCADE,
    choice TEXT NOT NULL CHECK (choice IN ('j', 'k', 'skip')),
    source TEXT NOT NULL,
    rep INTEGER NOT NULL DEFAULT 0,
    latency_ms REAL,
    created TEXT NOT NULL,
    CHECK (anchor <> ref_j AND anchor <> ref_k AND ref_j <> ref_k),
    UNIQUE (source, anchor, ref_j, ref_k, rep)
);
CREATE INDEX triplets_source ON triplets (source);
CREATE TABLE llm_queries (
    id INTEGER PRIMARY KEY,
    oracle TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    anchor TEXT NOT NULL,
    ref_j TEXT NOT NULL,
    ref_k TEXT NOT NULL,
    choice TEXT NOT NULL CHECK (choice IN ('j', 'k', 'skip')),
    raw TEXT,
    latency_ms REAL,
    tokens_in INTEGER,
    tokens_out INTEGER,
    created TEXT NOT NULL,
    UNIQUE (oracle, model, prompt_version, anchor, ref_j, ref_k)
);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT,
    config TEXT NOT NULL DEFAULT '{}',
    seed INTEGER,
    git_sha TEXT,
    status TEXT NOT NULL DEFAULT 'running',
    progress REAL NOT NULL DEFAULT 0,
    message TEXT,
    metrics TEXT NOT NULL DEFAULT '{}',
    artifacts TEXT NOT NULL DEFAULT '{}',
    pid INTEGER,
    created TEXT NOT NULL,
    finished TEXT
);
CREATE INDEX runs_kind ON runs (kind);
"""

# v2: one revisions table for every change to a description, mask, metadata or judgment — the
# data-safety merge, the app's audit and the admin review all read it; an earlier state is restored
# from ``old``. ``entity`` names the table, ``key`` the row (JSON of its natural key).
_SCHEMA_V2 = """
CREATE TABLE revisions (
    id INTEGER PRIMARY KEY,
    entity TEXT NOT NULL,
    key TEXT NOT NULL,
    field TEXT NOT NULL,
    action TEXT NOT NULL CHECK (action IN ('insert', 'update', 'delete', 'restore')),
    old TEXT,
    new TEXT,
    actor TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE INDEX revisions_entity_key ON revisions (entity, key);
"""

# runs: the job runner's identity of a run's process (host, and the create time that tells it from a
# later process reusing the pid) and the heartbeat its process stamps while it lives.
_SCHEMA_RUNS = """
ALTER TABLE runs ADD COLUMN host TEXT;
ALTER TABLE runs ADD COLUMN pid_created REAL;
ALTER TABLE runs ADD COLUMN heartbeat TEXT;
"""

# What each import last read from the dataset, per row and field (sha256 of the value): with the
# current value it decides a re-import's three-way merge ("changed in the app since the last import").
_SCHEMA_IMPORT_BASE = """
CREATE TABLE import_base (
    entity TEXT NOT NULL,
    key TEXT NOT NULL,
    field TEXT NOT NULL,
    hash TEXT NOT NULL,
    updated TEXT NOT NULL,
    PRIMARY KEY (entity, key, field)
);
"""

# Accounts (annotations/accounts/accounts.py, its queries annotations/store/accounts.py): one row per person,
# names unique ignoring case; a session token names the account and its ``session_epoch``. ``exclusions``
# marks an annotator (by name) or one judgment (by triplet id) as left out of every metric; the rows stay.
_SCHEMA_ACCOUNTS = """
CREATE TABLE accounts (
    name TEXT PRIMARY KEY COLLATE NOCASE,
    password_hash TEXT,
    role TEXT NOT NULL CHECK (role IN ('admin', 'researcher', 'annotator', 'viewer')),
    email TEXT UNIQUE COLLATE NOCASE,
    failed INTEGER NOT NULL DEFAULT 0,
    locked_until TEXT,
    disabled INTEGER NOT NULL DEFAULT 0,
    session_epoch INTEGER NOT NULL DEFAULT 0,
    created TEXT NOT NULL
);
CREATE TABLE exclusions (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('annotator', 'triplet')),
    target TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    actor TEXT NOT NULL,
    created TEXT NOT NULL,
    UNIQUE (kind, target)
);
"""

# scale: child-key indexes so deleting a photo does not scan a million judgments per reference
# (ON DELETE CASCADE looks triplets up by anchor, ref_j and ref_k), the patient lookup of photos,
# and the scheduler's per-annotator, per-anchor lookup (source, anchor) is the UNIQUE key's prefix.
_SCHEMA_SCALE = """
CREATE INDEX IF NOT EXISTS triplets_anchor ON triplets (anchor);
CREATE INDEX IF NOT EXISTS triplets_ref_j ON triplets (ref_j);
CREATE INDEX IF NOT EXISTS triplets_ref_k ON triplets (ref_k);
CREATE INDEX IF NOT EXISTS images_patient ON images (patient_id);
"""

# Second reading (annotations/followup/readings.py): photos an admin marked for independent outlining, and each
# reader's own label map of such a photo (a file under masks/readings/); the stored truth is untouched.
_SCHEMA_READINGS = """
CREATE TABLE reading_photos (
    image_id TEXT PRIMARY KEY REFERENCES images(image_id) ON DELETE CASCADE,
    actor TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE TABLE readings (
    image_id TEXT NOT NULL REFERENCES images(image_id) ON DELETE CASCADE,
    reader TEXT NOT NULL COLLATE NOCASE,
    file TEXT NOT NULL,
    wounds INTEGER NOT NULL,
    area INTEGER NOT NULL,
    updated TEXT NOT NULL,
    PRIMARY KEY (image_id, reader)
);
"""

# Follow-up (annotations/followup/followup.py): a photo's visit date and a wound's track ride in their metadata,
# so import, export, merge, revisions, erase-patient and backup carry them as every field; the indexes
# find a track's wounds and a patient's visits, and the ``tracks`` view lists each track (its patient is
# its photos' patient, its site the first one recorded).
_SCHEMA_FOLLOWUP = """
CREATE INDEX wounds_track ON wounds (json_extract(metadata, '$.track_id'));
CREATE INDEX images_visit ON images (patient_id, json_extract(metadata, '$.visit_date'));
CREATE VIEW tracks AS
SELECT CAST(json_extract(w.metadata, '$.track_id') AS TEXT) AS track_id, i.patient_id AS patient_id,
       coalesce(min(json_extract(w.metadata, '$.site')), '') AS site, count(*) AS wounds,
       min(json_extract(i.metadata, '$.visit_date')) AS first_visit,
       max(json_extract(i.metadata, '$.visit_date')) AS last_visit
FROM wounds w JOIN images i ON i.image_id = w.image_id
WHERE coalesce(CAST(json_extract(w.metadata, '$.track_id') AS TEXT), '') <> ''
GROUP BY CAST(json_extract(w.metadata, '$.track_id') AS TEXT), i.patient_id
"""


# Worklist (pages/1_Wound_masks.py): a photo its annotator marked done with its outlines; the mark is
# recorded as the photo's ``done`` field in the revisions (who, when) and goes with the photo.
_SCHEMA_DONE = """
CREATE TABLE photo_done (
    image_id TEXT PRIMARY KEY REFERENCES images(image_id) ON DELETE CASCADE,
    actor TEXT NOT NULL,
    created TEXT NOT NULL
);
"""


def sql_statements(script: str) -> tuple[str, ...]:
    """The statements of ``script`` (without their ``;``), split only where SQLite's tokenizer says a
    statement is complete (:func:`sqlite3.complete_statement`): a ``';'`` literal or a trigger body
    stays whole."""
    out: list[str] = []
    start = 0
    for end, char in enumerate(script):
        if char == ";" and sqlite3.complete_statement(script[start:end + 1]):
            out.append(script[start:end])
            start = end + 1
    out.append(script[start:])
    return tuple(s for s in out if s.strip())


#: Ordered migrations, each a list of statements: ``MIGRATIONS[v]`` brings a database from version
#: ``v`` to ``v + 1``.
MIGRATIONS: list[tuple[str, ...]] = [sql_statements(script) for script in (
    _SCHEMA_V1, _SCHEMA_V2, _SCHEMA_RUNS, _SCHEMA_IMPORT_BASE, _SCHEMA_ACCOUNTS, _SCHEMA_SCALE, _SCHEMA_READINGS,
    _SCHEMA_FOLLOWUP, _SCHEMA_DONE)]

def _check_rep_latency(rep: int, latency_ms: float | None, where: str) -> None:
    """A judgment's repeat number is ≥ 0 and its latency a finite number ≥ 0 or None (SQLite would
    store a NaN as NULL: a measured latency silently becoming "not measured")."""
    if int(rep) < 0:
        raise ValueError(f"{where}: rep must be 0 or more, got {rep}")
    if latency_ms is not None and not (math.isfinite(latency_ms) and latency_ms >= 0):
        raise ValueError(f"{where}: latency_ms must be a finite number of 0 or more (or None), got {latency_ms}")


CACHE_KIB = 65_536  # SQLite page cache per connection


class Store(RunRecords, Revisions, Readings, Erasure, Accounts, Scheduling, Imports):
    """Typed access to a workspace's ``triderm.sqlite``: the connection, the schema, photos, wounds and
    judgments here, the run records (:class:`RunRecords`), the revisions (:class:`Revisions`), the second
    readings (:class:`Readings`), a patient's erasure (:class:`Erasure`), the accounts and exclusions
    (:class:`Accounts`), the scheduler's reads and lease file (:class:`Scheduling`) and the re-import merge's and
    the export's reads of the judgments and their import bases (:class:`Imports`) in their own modules."""

    def __init__(self, path: str | Path, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        # created private (password hashes, clinical text); SQLite gives its -wal and -shm files the same mode
        with contextlib.suppress(FileExistsError):
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        conn = sqlite3.connect(self.path,
                               timeout=timeout_s,  # pragma: no mutate (PRAGMA busy_timeout below overrides it)
                               check_same_thread=False, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        # 64 MiB of page cache (SQLite's default is 2 MiB): a registry's judgment indexes outgrow 2 MiB
        # near 10⁵ rows, and every random B-tree insert then rereads pages (benchmarks/scale.py)
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        import sqlite_utils  # here, not at import: it imports pandas (about 1 s), which no --help needs

        self.db = sqlite_utils.Database(conn)
        self.timeout_s = timeout_s
        self._heartbeats: dict[int, jobs.Heartbeat] = {}
        self._action_override: str | None = None  # pragma: no mutate (read as `override or action`: '' is None)
        self._migrate()

    # -- schema --------------------------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        """The store's schema version (SQLite ``user_version``)."""
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        conn = self.db.conn
        if self.schema_version == len(MIGRATIONS):
            return  # up to date: no write lock to wait for
        conn.execute("BEGIN IMMEDIATE")  # one process migrates; the others wait, then see it done
        try:
            version = self.schema_version
            if version > len(MIGRATIONS):
                raise RuntimeError(
                    f"{self.path}: schema version {version} is newer than this TriDerm Studio "
                    f"({len(MIGRATIONS)}); upgrade the software")
            for v in range(version, len(MIGRATIONS)):
                for statement in MIGRATIONS[v]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {v + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def transaction(self):
        """Context manager: one atomic write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``)."""
        return _Transaction(self.db.conn)

    @contextlib.contextmanager
    def restoring(self) -> Iterator[None]:
        """One transaction whose writes are recorded as ``restore`` revisions."""
        with self.transaction():
            self._action_override = "restore"
            try:
                yield
            finally:
                self._action_override = None

    def close(self) -> None:
        """Stop the runs' heartbeats and close the connection."""
        for beat in self._heartbeats.values():
            beat.stop()
        self._heartbeats.clear()
        self.db.conn.close()

    # -- meta ----------------------------------------------------------------------------------
    def get_meta(self, key: str, default: Any = None) -> Any:
        """The workspace setting ``key`` (JSON-decoded), or ``default`` when unset."""
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return json.loads(row[0]) if row else default

    def set_meta(self, key: str, value: Any) -> None:
        """Store the workspace setting ``key`` as JSON."""
        self.db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                        "SET value = excluded.value", [key, json.dumps(value)])

    def delete_meta(self, key: str) -> None:
        """Remove the workspace setting ``key`` (nothing when it is unset)."""
        self.db.execute("DELETE FROM meta WHERE key = ?", [key])

    # -- patients and images ---------------------------------------------------------------------
    def upsert_patient(self, patient_id: str, metadata: dict | None = None, *,
                       actor: str = SYSTEM_ACTOR) -> None:
        """Insert or update a patient and its metadata (each change recorded)."""
        with self.transaction():
            old = self.patient(patient_id)
            self.db.execute(
                "INSERT INTO patients (patient_id, metadata) VALUES (?, ?) ON CONFLICT(patient_id) "
                "DO UPDATE SET metadata = excluded.metadata", [patient_id, _dumps(metadata)])
            self._record_changes("patients", patient_id, old, {"metadata": metadata or {}}, actor)

    def patient(self, patient_id: str) -> dict | None:
        """The patient's row (metadata decoded), or None."""
        rows = list(self.db.query("SELECT * FROM patients WHERE patient_id = ?", [patient_id]))
        return _decode(rows[0]) if rows else None

    def patients(self) -> list[dict]:
        """Every patient, by id."""
        return [_decode(r) for r in self.db.query("SELECT * FROM patients ORDER BY patient_id")]

    def upsert_image(self, image_id: str, file: str, sha256: str, width: int, height: int,
                     patient_id: str | None = None, metadata: dict | None = None, *,
                     actor: str = SYSTEM_ACTOR) -> None:
        """Insert or update a photo's row: file, checksum, size, patient and metadata (each change recorded)."""
        with self.transaction():
            old = self.image(image_id)
            self.db.execute(
                "INSERT INTO images (image_id, file, sha256, width, height, patient_id, metadata) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(image_id) DO UPDATE SET file = excluded.file, "
                "sha256 = excluded.sha256, width = excluded.width, height = excluded.height, "
                "patient_id = excluded.patient_id, metadata = excluded.metadata",
                [image_id, file, sha256, int(width), int(height), patient_id, _dumps(metadata)])
            new = {"file": image_file_value(file, sha256, width, height), "patient_id": patient_id,
                   "metadata": metadata or {}}
            if old is not None:
                old = {"file": image_file_value(old["file"], old["sha256"], old["width"], old["height"]),
                       "patient_id": old["patient_id"], "metadata": old["metadata"]}
            self._record_changes("images", image_id, old, new, actor)

    def delete_image(self, image_id: str, *, actor: str = SYSTEM_ACTOR) -> None:
        """Remove a photo's row; its wounds and the judgments naming it go with it (each recorded)."""
        with self.transaction():
            old = self.image(image_id)
            if old is None:
                return
            # pragma below: only this photo's wounds exist under its id, whichever wounds give the indices
            for w in self.wounds(image_id):  # pragma: no mutate
                self.delete_wound(image_id, w["wound_index"], actor=actor)
            for t in self.db.query("SELECT id FROM triplets WHERE ? IN (anchor, ref_j, ref_k)", [image_id]):
                self.delete_triplet(t["id"], actor=actor)
            self.db.execute("DELETE FROM images WHERE image_id = ?", [image_id])
            self.record_revision("images", image_id, "row", "delete",
                                 {k: old[k] for k in ("file", "sha256", "width", "height", "patient_id",
                                                      "metadata")}, None, actor)

    def image_ids(self) -> list[str]:
        """Every photo's id, sorted (no row decoded: cheap at 10^5 photos)."""
        return [r[0] for r in self.db.execute("SELECT image_id FROM images ORDER BY image_id")]

    def photo_checksums(self) -> dict[str, str]:
        """Every photo's file → its sha256 (a backup's check of the photos it copied)."""
        return {r[0]: r[1] for r in self.db.execute("SELECT file, sha256 FROM images")}

    def images(self) -> list[dict]:
        """Every photo's row, by id."""
        return [_decode(r) for r in self.db.query("SELECT * FROM images ORDER BY image_id")]

    def image(self, image_id: str) -> dict | None:
        """The photo's row (metadata decoded), or None."""
        rows = list(self.db.query("SELECT * FROM images WHERE image_id = ?", [image_id]))
        return _decode(rows[0]) if rows else None

    # -- wounds --------------------------------------------------------------------------------
    def upsert_wound(self, image_id: str, wound_index: int, area: int, bbox: Iterable[int],
                     description: str = "", metadata: dict | None = None, *,
                     actor: str = SYSTEM_ACTOR, outline: dict | None = None) -> int:
        """Insert or update the wound ``wound_index`` of ``image_id``; returns its id.

        ``outline`` ({area, bbox, png}: :func:`annotations.infra.workspace.outline_value`) is the wound's
        new pixels, kept in its revision so a redraw can be undone; without it only the geometry
        is recorded."""
        bbox = [int(v) for v in bbox]
        with self.transaction():
            old = self.wound(image_id, wound_index)
            self.db.execute(
                "INSERT INTO wounds (image_id, wound_index, area, bbox, description, metadata) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(image_id, wound_index) DO UPDATE SET "
                "area = excluded.area, bbox = excluded.bbox, description = excluded.description, "
                "metadata = excluded.metadata",
                [image_id, int(wound_index), int(area), json.dumps(bbox), description or "",
                 _dumps(metadata)])
            key = wound_key(image_id, wound_index)
            new_outline = outline if outline is not None else {"area": int(area), "bbox": bbox}
            new = {"outline": new_outline, "description": description or "", "metadata": metadata or {}}
            if old is not None:
                old = {"outline": self._last_outline(key, old), "description": old["description"],
                       "metadata": old["metadata"]}
                if outline is None and (old["outline"]["area"], old["outline"]["bbox"]) == (int(area), bbox):
                    new["outline"] = old["outline"]  # geometry unchanged: the pixels are too
            self._record_changes("wounds", key, old, new, actor)
            return self.db.execute("SELECT id FROM wounds WHERE image_id = ? AND wound_index = ?",
                                   [image_id, int(wound_index)]).fetchone()[0]

    def delete_wound(self, image_id: str, wound_index: int, *, actor: str = SYSTEM_ACTOR,
                     outline: dict | None = None) -> int | None:
        """Remove one wound (recorded); returns the id of its ``delete`` revision, None when it did not exist.

        ``outline`` ({area, bbox, png}) is the wound's pixels as the caller read them from the mask, kept in the
        revision (else the last recorded outline) so that the deletion can be undone exactly."""
        with self.transaction():
            old = self.wound(image_id, wound_index)
            if old is None:
                return None
            key = wound_key(image_id, wound_index)
            self.db.execute("DELETE FROM wounds WHERE image_id = ? AND wound_index = ?",
                            [image_id, int(wound_index)])
            return self.record_revision("wounds", key, "row", "delete",
                                        {"outline": outline or self._last_outline(key, old),
                                         "description": old["description"], "metadata": old["metadata"]},
                                        None, actor)

    def wound(self, image_id: str, wound_index: int) -> dict | None:
        """The wound's row, or None."""
        rows = list(self.db.query("SELECT * FROM wounds WHERE image_id = ? AND wound_index = ?",
                                  [image_id, int(wound_index)]))
        return _decode(rows[0]) if rows else None

    def _last_outline(self, key: dict, row: dict) -> dict:
        """The wound's outline as last recorded (with its pixels when a revision kept them)."""
        last = self.db.execute(
            "SELECT new FROM revisions WHERE entity = 'wounds' AND key = ? AND field IN ('outline', 'row') "
            "ORDER BY id DESC LIMIT 1", [key_json(key)]).fetchone()
        geometry = {"area": int(row["area"]), "bbox": [int(v) for v in row["bbox"]]}
        if last and last[0] is not None:
            value = json.loads(last[0])
            value = value.get("outline", value) if isinstance(value, dict) else None
            if isinstance(value, dict) and (value.get("area"), value.get("bbox")) == (geometry["area"],
                                                                                      geometry["bbox"]):
                return value
        return geometry

    def wounds(self, image_id: str | None = None) -> list[dict]:
        """The wounds of one photo by index, or of every photo by photo and index."""
        if image_id is None:
            rows = self.db.query("SELECT * FROM wounds ORDER BY image_id, wound_index")
        else:
            rows = self.db.query("SELECT * FROM wounds WHERE image_id = ? ORDER BY wound_index",
                                 [image_id])
        return [_decode(r) for r in rows]

    # -- follow-up -------------------------------------------------------------------------------
    def tracks(self) -> list[dict[str, Any]]:
        """Every wound track: id, patient, site, wounds, first and last visit (the schema's ``tracks`` view),
        by patient and track id."""
        return [dict(r) for r in self.db.query("SELECT * FROM tracks ORDER BY patient_id, track_id")]

    # -- worklist: photos marked done ---------------------------------------------------------------
    def set_done(self, image_id: str, done: bool, *, actor: str) -> bool:
        """Mark the photo done with its outlines (or not); returns whether the mark changed (recorded as the
        photo's ``done`` field). Raises ValueError for a photo that does not exist."""
        with self.transaction():
            if self.image(image_id) is None:
                raise ValueError(f"no photo {image_id!r}: nothing was marked")
            if done:
                cur = self.db.execute("INSERT OR IGNORE INTO photo_done (image_id, actor, created) VALUES (?, ?, ?)",
                                      [image_id, str(actor).strip(), now()])
            else:
                cur = self.db.execute("DELETE FROM photo_done WHERE image_id = ?", [image_id])
            if cur.rowcount:
                self.record_revision("images", image_id, "done", "update", not done, done, actor)
            return bool(cur.rowcount)

    def done_photos(self) -> dict[str, dict]:
        """Photo id → {actor, created} of every photo marked done."""
        return {r["image_id"]: {"actor": r["actor"], "created": r["created"]}
                for r in self.db.query("SELECT image_id, actor, created FROM photo_done")}

    def worklist(self, actor: str) -> list[dict]:
        """Every photo by id as the outline worklist sees it: ``image_id``, ``wounds`` (how many are outlined),
        ``done_by`` (who marked it done, else None) and ``mine`` (``actor`` wrote one of its outlines or
        marked it done)."""
        touched = {r[0] for r in self.db.execute(
            "SELECT DISTINCT json_extract(key, '$.image_id') FROM revisions WHERE entity = 'wounds' "
            "AND actor = ? COLLATE NOCASE", [actor])}
        rows = self.db.query(
            "SELECT i.image_id AS image_id, (SELECT count(*) FROM wounds w WHERE w.image_id = i.image_id) AS wounds, "
            "d.actor AS done_by FROM images i LEFT JOIN photo_done d ON d.image_id = i.image_id ORDER BY i.image_id")
        return [{**r, "mine": r["image_id"] in touched or (r["done_by"] or "").lower() == actor.lower()}
                for r in rows]

    # -- annotators and triplets -----------------------------------------------------------------
    def add_annotator(self, name: str) -> None:
        """Register an annotator by name (stripped; an existing name is kept); an empty name raises ValueError."""
        if not name or not name.strip():
            raise ValueError("annotator name is empty")
        self.db.execute("INSERT OR IGNORE INTO annotators (name, created) VALUES (?, ?)",
                        [name.strip(), now()])

    def annotators(self) -> list[str]:
        """Every registered annotator's name, sorted."""
        return [r["name"] for r in self.db.query("SELECT name FROM annotators ORDER BY name")]

    def add_triplet(self, anchor: str, ref_j: str, ref_k: str, choice: str, source: str,
                    latency_ms: float | None = None, rep: int = 0,
                    created: str | None = None, *, actor: str | None = None) -> int | None:
        """Store one judgment; returns its id, or ``None`` when it is already stored.

        ``actor`` defaults to ``source`` (``expert:<annotator>``, ``llm:<model>``)."""
        if choice not in CHOICES:
            raise ValueError(f"choice must be one of {CHOICES}, got {choice!r}")
        if len({anchor, ref_j, ref_k}) != 3:
            raise ValueError(f"a triplet needs three different images, got {anchor}, {ref_j}, {ref_k}")
        _check_rep_latency(rep, latency_ms, "triplet")
        created = created or now()
        with self.transaction():
            cur = self.db.execute(
                "INSERT OR IGNORE INTO triplets (anchor, ref_j, ref_k, choice, source, rep, latency_ms,"
                " created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [anchor, ref_j, ref_k, choice, source, int(rep), latency_ms, created])
            if cur.rowcount != 1:
                return None
            row = {"source": source, "anchor": anchor, "ref_j": ref_j, "ref_k": ref_k, "rep": rep}
            self.record_revision("triplets", triplet_key(row), "row", "insert", None,
                                 {"choice": choice, "latency_ms": latency_ms, "created": created},
                                 actor or source)
            return cur.lastrowid

    def add_triplets(self, rows: Iterable[Mapping[str, Any]], *, actor: str | None = None) -> int:
        """Store many judgments in one transaction; returns how many were new (a bulk load: a
        million rows in seconds). Each new row gets its ``insert`` revision, like :meth:`add_triplet`.

        Each row holds ``anchor``, ``ref_j``, ``ref_k``, ``choice``, ``source`` and optionally
        ``latency_ms``, ``rep``, ``created``. A bad row raises ValueError naming its index, and
        nothing is stored. Inside an open :meth:`transaction` it joins that transaction."""
        stamp = now()
        params = []
        for i, t in enumerate(rows):
            if t["choice"] not in CHOICES:
                raise ValueError(f"triplet row {i}: choice must be one of {CHOICES}, got {t['choice']!r}")
            if len({t["anchor"], t["ref_j"], t["ref_k"]}) != 3:
                raise ValueError(f"triplet row {i}: a triplet needs three different images, got "
                                 f"{t['anchor']}, {t['ref_j']}, {t['ref_k']}")
            _check_rep_latency(int(t.get("rep") or 0), t.get("latency_ms"), f"triplet row {i}")
            params.append((t["anchor"], t["ref_j"], t["ref_k"], t["choice"], t["source"], int(t.get("rep") or 0),
                           t.get("latency_ms"), t.get("created") or stamp))
        conn = self.db.conn
        with self.transaction():  # joins a transaction already open
            revisions = []
            for p in params:
                cur = conn.execute("INSERT OR IGNORE INTO triplets (anchor, ref_j, ref_k, choice, source, rep, "
                                   "latency_ms, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", p)
                if cur.rowcount == 1:
                    key = {"source": p[4], "anchor": p[0], "ref_j": p[1], "ref_k": p[2], "rep": p[5]}
                    revisions.append(("triplets", json.dumps(key, sort_keys=True), "row", "insert", "null",
                                      json.dumps({"choice": p[3], "latency_ms": p[6], "created": p[7]},
                                                 sort_keys=True), actor or p[4], stamp))
            conn.executemany("INSERT INTO revisions (entity, key, field, action, old, new, actor, created) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", revisions)
            return len(revisions)

    def delete_triplet(self, triplet_id: int, *, actor: str | None = None) -> None:
        """Remove one judgment (an undo); ``actor`` defaults to the judgment's source."""
        with self.transaction():
            rows = list(self.db.query("SELECT * FROM triplets WHERE id = ?", [int(triplet_id)]))
            if not rows:
                return
            self.db.execute("DELETE FROM triplets WHERE id = ?", [int(triplet_id)])
            row = rows[0]
            self.record_revision("triplets", triplet_key(row), "row", "delete",
                                 {k: row[k] for k in ("choice", "latency_ms", "created")}, None,
                                 actor or row["source"])

    def triplets(self, source: str | None = None, prefix: str | None = None) -> list[dict]:
        """Judgments, oldest first; filter by exact ``source`` or by a source ``prefix``."""
        if source is not None:
            return list(self.db.query("SELECT * FROM triplets WHERE source = ? ORDER BY id", [source]))
        if prefix is not None:  # LIKE wildcards in the prefix are literal characters
            escaped = prefix.replace("\\", "\\\\").replace("%", r"\%").replace("_", r"\_")
            return list(self.db.query("SELECT * FROM triplets WHERE source LIKE ? ESCAPE '\\' ORDER BY id",
                                      [escaped + "%"]))
        return list(self.db.query("SELECT * FROM triplets ORDER BY id"))

    def expert_triplets(self, include_excluded: bool = False) -> list[dict]:
        """Expert judgments, oldest first, without those an admin excluded from evaluation (a
        test/practice annotator or a single judgment) unless ``include_excluded``."""
        if include_excluded:
            return self.triplets(prefix="expert:")
        return list(self.db.query(
            # pragma: SQLite's LIKE ignores ASCII case, so 'EXPERT:%' matches the same sources
            "SELECT * FROM triplets WHERE source LIKE 'expert:%' AND id NOT IN (SELECT CAST(target AS INTEGER) "  # pragma: no mutate
            "FROM exclusions WHERE kind = 'triplet') AND substr(source, 8) NOT IN (SELECT target FROM exclusions "
            "WHERE kind = 'annotator') ORDER BY id"))

    def triplet_sources(self) -> dict[str, int]:
        """Number of judgments per source, by source."""
        return {r["source"]: r["n"] for r in self.db.query(
            "SELECT source, count(*) AS n FROM triplets GROUP BY source ORDER BY source")}

    # -- LLM answers -----------------------------------------------------------------------------
    def llm_cached(self, oracle: str, model: str, prompt_version: str, anchor: str, ref_j: str,
                   ref_k: str) -> dict | None:
        """The cached LLM answer to this exact question and prompt version, or None."""
        rows = list(self.db.query(
            "SELECT * FROM llm_queries WHERE oracle = ? AND model = ? AND prompt_version = ? AND "
            "anchor = ? AND ref_j = ? AND ref_k = ?",
            [oracle, model, prompt_version, anchor, ref_j, ref_k]))
        return rows[0] if rows else None

    def llm_answers(self, oracle: str, model: str, prompt_version: str) -> list[dict]:
        """Every cached answer of one LLM oracle, model and prompt version, oldest first."""
        return list(self.db.query(
            "SELECT * FROM llm_queries WHERE oracle = ? AND model = ? AND prompt_version = ? "
            "ORDER BY id", [oracle, model, prompt_version]))

    def llm_latencies(self, oracle: str, model: str, last: int) -> list[tuple[float, int | None]]:
        """(latency in ms, input tokens or None) of one LLM oracle and model's ``last`` timed answers,
        newest first."""
        return [(r[0], r[1]) for r in self.db.execute(
            "SELECT latency_ms, tokens_in FROM llm_queries WHERE oracle = ? AND model = ? AND latency_ms IS NOT NULL "
            "ORDER BY id DESC LIMIT ?", [oracle, model, last])]

    def add_llm_answer(self, oracle: str, model: str, prompt_version: str, anchor: str,
                       ref_j: str, ref_k: str, choice: str, raw: str | None = None,
                       latency_ms: float | None = None, tokens_in: int | None = None,
                       tokens_out: int | None = None) -> bool:
        """Cache one oracle answer and store it as a triplet with source ``llm:<model>``.

        Returns False (and writes nothing) when that query is already cached."""
        with self.transaction():
            cur = self.db.execute(
                "INSERT OR IGNORE INTO llm_queries (oracle, model, prompt_version, anchor, ref_j, "
                "ref_k, choice, raw, latency_ms, tokens_in, tokens_out, created) "  # pragma: no mutate (SQL case)
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [oracle, model, prompt_version, anchor, ref_j, ref_k, choice, raw, latency_ms,
                 tokens_in, tokens_out, now()])
            if cur.rowcount != 1:
                return False
            self.add_triplet(anchor, ref_j, ref_k, choice, f"llm:{model}", latency_ms=latency_ms)
        return True

    def counts(self) -> dict[str, int]:
        """Row counts for the workspace overview."""
        def q(sql: str) -> int:
            return self.db.execute(sql).fetchone()[0]
        return {
            "images": q("SELECT count(*) FROM images"),
            "patients": q("SELECT count(*) FROM patients"),
            "wounds": q("SELECT count(*) FROM wounds"),
            "described_wounds": q("SELECT count(*) FROM wounds WHERE trim(description) <> ''"),
            "images_with_wounds": q("SELECT count(DISTINCT image_id) FROM wounds"),
            # SQLite's LIKE ignores ASCII case: upper-cased patterns match the same sources
            "expert_triplets": q("SELECT count(*) FROM triplets WHERE source LIKE 'expert:%'"),  # pragma: no mutate
            "llm_triplets": q("SELECT count(*) FROM triplets WHERE source LIKE 'llm:%'"),  # pragma: no mutate (the same)
            "runs": q("SELECT count(*) FROM runs"),
        }


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (re-entrant: nested uses join the outer transaction)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.outer = False  # pragma: no mutate (__enter__ sets it before anything reads it)

    def __enter__(self) -> sqlite3.Connection:
        self.outer = not self.conn.in_transaction
        if self.outer:
            self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.outer:
            return
        if exc_type:
            self.conn.execute("ROLLBACK")
            return
        write_step()
        try:
            self.conn.execute("COMMIT")
        except BaseException:  # e.g. a full disk: the transaction ends rolled back, never left open
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
