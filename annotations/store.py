"""The SQLite annotation store: patients, images, wounds, annotators, triplet judgments, LLM
answers and run records.

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
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


from annotations import jobs
from annotations.fileio import write_step

CHOICES = ("j", "k", "skip")
#: ``interrupted``: the process ended without finishing its run (killed, crashed, machine restarted),
#: found by :func:`annotations.jobs.run_gone` when runs are listed or opened
RUN_STATUSES = ("running", "done", "failed", "stopped", "interrupted")
_JSON_COLUMNS = ("metadata", "bbox", "config", "metrics", "artifacts")

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

# Accounts (annotations/accounts.py): one row per person, names unique ignoring case; a session
# token names the account and its ``session_epoch``. ``exclusions`` marks an annotator (by name) or
# one judgment (by triplet id) as left out of every metric; the rows themselves stay.
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

# Second reading (annotations/readings.py): photos an admin marked for independent outlining, and each
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

# Follow-up (annotations/followup.py): a photo's visit date and a wound's track ride in their metadata,
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

#: Actor of writes made by code that names nobody (scripts, tests); people and jobs pass their own.
SYSTEM_ACTOR = "system"


def now() -> str:
    """UTC timestamp in ISO 8601 with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def git_sha() -> str:
    """The source tree's git commit (``unknown`` outside a checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], check=False, cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def _check_rep_latency(rep: int, latency_ms: float | None, where: str) -> None:
    """A judgment's repeat number is ≥ 0 and its latency a finite number ≥ 0 or None (SQLite would
    store a NaN as NULL: a measured latency silently becoming "not measured")."""
    if int(rep) < 0:
        raise ValueError(f"{where}: rep must be 0 or more, got {rep}")
    if latency_ms is not None and not (math.isfinite(latency_ms) and latency_ms >= 0):
        raise ValueError(f"{where}: latency_ms must be a finite number of 0 or more (or None), got {latency_ms}")


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for col in _JSON_COLUMNS:
        if col in row and isinstance(row[col], str):
            row[col] = json.loads(row[col])
    return row


def key_json(key: Any) -> str:
    """The canonical JSON of a row's natural key, as stored in ``revisions.key``."""
    return json.dumps(key, sort_keys=True, default=_json_default)


def wound_key(image_id: str, wound_index: int) -> dict[str, Any]:
    """The revision key of a wound."""
    return {"image_id": image_id, "wound_index": int(wound_index)}


def triplet_key(row: dict[str, Any]) -> dict[str, Any]:
    """The revision key of a judgment: source, anchor, references and repeat number."""
    return {k: row[k] for k in ("source", "anchor", "ref_j", "ref_k")} | {"rep": int(row["rep"])}


def image_file_value(file: str, sha256: str, width: int, height: int) -> dict[str, Any]:
    """An image's file as one revision/merge value."""
    return {"file": file, "sha256": sha256, "width": int(width), "height": int(height)}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=_json_default)


def _dumps(value: Any) -> str:
    return json.dumps(value if value is not None else {}, sort_keys=True, default=_json_default)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


CACHE_KIB = 65_536  # SQLite page cache per connection


class Store:
    """Typed access to a workspace's ``triderm.sqlite``."""

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

        ``outline`` ({area, bbox, png}: :func:`annotations.workspace.outline_value`) is the wound's
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

    # -- revisions -------------------------------------------------------------------------------
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

    def revisions(self, entity: str | None = None, key: Any = None) -> list[dict]:
        """Recorded changes, oldest first (``old``/``new``/``key`` decoded from JSON)."""
        where, args = [], []
        if entity is not None:
            where.append("entity = ?")
            args.append(entity)
        if key is not None:
            where.append("key = ?")
            args.append(key_json(key))
        sql = "SELECT * FROM revisions" + (" WHERE " + " AND ".join(where) if where else "")
        return self._revision_rows(sql + " ORDER BY id", args)

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

    # -- runs ----------------------------------------------------------------------------------
    def start_run(self, kind: str, config: dict, seed: int | None = None,
                  name: str | None = None) -> int:
        """Open a run record (status ``running``) with its config, seed, git sha and this process's
        identity (pid, create time, host); a heartbeat thread stamps it until :meth:`finish_run`."""
        pid, created = jobs.process_identity()
        stamp = now()
        cur = self.db.execute(
            "INSERT INTO runs (kind, name, config, seed, git_sha, status, pid, pid_created, host, heartbeat, "
            "created) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)",
            [kind, name, _dumps(config), seed, git_sha(), pid, created, jobs.hostname(), stamp, stamp])
        assert cur.lastrowid is not None  # set by the INSERT
        run_id = cur.lastrowid
        self._heartbeats[run_id] = jobs.Heartbeat(lambda: self._beat(run_id))
        return run_id

    def _beat(self, run_id: int) -> bool:
        """Stamp a running run's heartbeat on a connection of the calling (heartbeat) thread;
        False once the run is no longer running."""
        conn = sqlite3.connect(self.path, timeout=self.timeout_s)
        try:
            with conn:
                cur = conn.execute("UPDATE runs SET heartbeat = ? WHERE id = ? AND status = 'running'",
                                   [now(), run_id])
            return cur.rowcount == 1
        finally:
            conn.close()

    def update_run(self, run_id: int, progress: float | None = None, metrics: dict | None = None,
                   message: str | None = None, artifacts: dict | None = None) -> None:
        """Update a run in place; ``metrics`` and ``artifacts`` are merged into the stored JSON."""
        with self.transaction():
            run = self.run(run_id)
            if run is None:
                raise KeyError(f"no run {run_id}")
            # the keys are SQL column names (f"{c} = ?"), which SQLite reads case-insensitively
            updates: dict[str, Any] = {"heartbeat": now()}  # pragma: no mutate
            if progress is not None:
                updates["progress"] = float(progress)  # pragma: no mutate (a column name: any case)
            if message is not None:
                updates["message"] = message  # pragma: no mutate (a column name: any case)
            if metrics:
                updates["metrics"] = _dumps({**run["metrics"], **metrics})  # pragma: no mutate (a column name: any case)
            if artifacts:
                updates["artifacts"] = _dumps({**run["artifacts"], **artifacts})  # pragma: no mutate (a column name)
            cols = ", ".join(f"{c} = ?" for c in updates)
            self.db.execute(f"UPDATE runs SET {cols} WHERE id = ?", [*updates.values(), run_id])

    def finish_run(self, run_id: int, status: str = "done", metrics: dict | None = None,
                   artifacts: dict | None = None, message: str | None = None) -> None:
        """Mark a run finished with ``status`` (``done`` sets progress to 1) and its last metrics, artifacts, message."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
        self.update_run(run_id, progress=1.0 if status == "done" else None, metrics=metrics,
                        artifacts=artifacts, message=message)
        self.db.execute("UPDATE runs SET status = ?, finished = ? WHERE id = ?",
                        [status, now(), run_id])
        beat = self._heartbeats.pop(int(run_id), None)
        if beat is not None:
            beat.stop()

    def runs(self, kind: str | None = None, status: str | None = None) -> list[dict]:
        """Run records, newest first."""
        where, args = [], []
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
        rows = [self._reconciled(_decode(r)) for r in self.db.query(sql + " ORDER BY id DESC", args)]
        return [r for r in rows if status is None or r["status"] == status]

    def run(self, run_id: int) -> dict | None:
        """One run's row, marked interrupted when its process is gone, or None."""
        rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [int(run_id)]))
        return self._reconciled(_decode(rows[0])) if rows else None

    def _reconciled(self, run: dict) -> dict:
        """``run``, marked ``interrupted`` (in the store too) when it says running but its process
        is gone (:func:`annotations.jobs.run_gone`)."""
        reason = jobs.run_gone(run)
        if reason is None:
            return run
        stamp = now()
        marked = {**run, "status": "interrupted", "finished": stamp, "message": reason}
        try:
            cur = self.db.execute("UPDATE runs SET status = 'interrupted', finished = ?, message = ? "
                                  "WHERE id = ? AND status = 'running'", [stamp, reason, run["id"]])
        except sqlite3.OperationalError:  # read-only copy, or locked for long: say so, store it next time
            return marked
        # it finished meanwhile: read what it wrote (re-reading the row it just marked gives the marked values)
        if cur.rowcount != 1:  # pragma: no mutate
            return _decode(next(iter(self.db.query("SELECT * FROM runs WHERE id = ?", [run["id"]]))))
        return marked

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
