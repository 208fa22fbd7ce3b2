"""The SQLite store, unit level: one small store per test in tmp_path, exact rows, revisions and errors.

Fast companion of tests/integration/test_store.py (mutation-checked, issue 22)."""
from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import threading
import time

import numpy as np
import pytest

from annotations.store import rows as rows_mod
from annotations.store import run_records
from annotations.store import store as store_mod
from annotations.store.store import MIGRATIONS, Store


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "t.sqlite")
    yield s
    s.close()


def photos(store: Store, ids: str = "abcd") -> None:
    for i in ids:
        store.upsert_image(i, f"{i}.png", i * 64, 8, 6)


def revs(store: Store, entity: str) -> list[tuple]:
    return [(r["key"], r["field"], r["action"], r["old"], r["new"], r["actor"]) for r in store.revisions(entity)]


# -- module helpers --------------------------------------------------------------------------------
def test_small_helpers():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", rows_mod.now())
    assert rows_mod.key_json({"b": 1, "a": np.int64(2)}) == '{"a": 2, "b": 1}'
    assert rows_mod.wound_key("p", np.int64(3)) == {"image_id": "p", "wound_index": 3}
    assert type(rows_mod.wound_key("p", 3.0)["wound_index"]) is int
    row = {"source": "s", "anchor": "a", "ref_j": "b", "ref_k": "c", "rep": "1", "choice": "j"}
    assert rows_mod.triplet_key(row) == {"source": "s", "anchor": "a", "ref_j": "b", "ref_k": "c", "rep": 1}
    assert rows_mod.image_file_value("f", "h", 4.0, np.int64(5)) == {"file": "f", "sha256": "h", "width": 4,
                                                                       "height": 5}
    assert rows_mod._dumps(None) == "{}" and rows_mod._dumps({"b": 1, "a": [1]}) == '{"a": [1], "b": 1}'
    assert rows_mod._dumps(np.arange(2)) == "[0, 1]"
    assert rows_mod._canonical({"b": 1, "a": None}) == '{"a": null, "b": 1}'
    with pytest.raises(TypeError, match=r"^not JSON serialisable: object$"):
        rows_mod._json_default(object())
    assert rows_mod._decode({"metadata": '{"x": 1}', "bbox": [1], "config": "[2]", "other": "{}"}) == \
        {"metadata": {"x": 1}, "bbox": [1], "config": [2], "other": "{}"}


def test_git_sha(monkeypatch):
    calls = []

    def fake(returncode=0, stdout="abc123def456\n", error=None):
        def run(args, **kw):
            calls.append((args, kw))
            if error:
                raise error
            return subprocess.CompletedProcess(args, returncode, stdout, "")
        return run

    monkeypatch.setattr(run_records.subprocess, "run", fake())
    assert run_records.git_sha() == "abc123def456"
    args, kw = calls[0]
    assert args == ["git", "rev-parse", "--short=12", "HEAD"]
    assert kw["check"] is False and kw["capture_output"] and kw["text"] and kw["timeout"] == 5
    assert kw["cwd"] == run_records.Path(run_records.__file__).resolve().parent
    for kw in ({"returncode": 128}, {"stdout": "  \n"}, {"error": OSError("no git")},
               {"error": subprocess.TimeoutExpired("git", 5)}):
        monkeypatch.setattr(run_records.subprocess, "run", fake(**kw))
        assert run_records.git_sha() == "unknown"


# -- opening and migrating --------------------------------------------------------------------------
def test_open_sets_pragmas_and_the_latest_schema(tmp_path):
    s = Store(tmp_path / "t.sqlite", timeout_s=2.5)
    def q(sql):
        return s.db.execute(sql).fetchone()[0]
    assert (q("PRAGMA busy_timeout"), q("PRAGMA journal_mode"), q("PRAGMA synchronous"), q("PRAGMA foreign_keys")) \
        == (2500, "wal", 1, 1)
    assert s.schema_version == len(MIGRATIONS) == 9 and s.timeout_s == 2.5 and s.path == tmp_path / "t.sqlite"
    assert not s.db.conn.in_transaction
    tables = set(s.db.table_names())
    assert {"meta", "images", "triplets", "revisions", "import_base", "accounts", "exclusions"} <= tables
    assert {"triplets_anchor", "images_patient"} <= {r[0] for r in s.db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index'")}
    s.set_meta("k", 1)
    assert Store(tmp_path / "t.sqlite").get_meta("k") == 1  # committed at once: another connection sees it
    errors = []
    worker = threading.Thread(target=lambda: errors.append(s.get_meta("k")))  # the app's threads share it
    worker.start()
    worker.join()
    assert errors == [1]
    s.close()
    s = Store(tmp_path / "t.sqlite")  # reopening migrates nothing and keeps the data
    assert s.timeout_s == 30.0
    assert s.schema_version == 9 and s.get_meta("k") == 1
    s.close()


def test_an_old_store_is_migrated_step_by_step(tmp_path):
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    con.executescript(";".join(MIGRATIONS[0]) + "; PRAGMA user_version = 1;")
    con.execute("INSERT INTO runs (kind, created) VALUES ('x', 'then')")
    con.commit()
    con.close()
    s = Store(path)
    assert s.schema_version == 9
    assert {"host", "pid_created", "heartbeat"} <= {c.name for c in s.db["runs"].columns}
    assert s.db.execute("SELECT kind FROM runs").fetchall() == [("x",)]
    s.close()


def test_a_newer_schema_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "new.sqlite"
    con = sqlite3.connect(path)
    con.execute("PRAGMA user_version = 10")
    con.close()
    with pytest.raises(RuntimeError, match=re.escape(
            f"{path}: schema version 10 is newer than this TriDerm Studio (9); upgrade the software")):
        Store(path)
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 10
    assert con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    con.close()


def test_a_new_workspace_is_private(tmp_path):
    from annotations.accounts import accounts
    from annotations.infra.workspace import Workspace

    old = os.umask(0o022)  # the usual umask: files 0644, folders 0755 unless made private
    try:
        ws = Workspace(tmp_path / "new" / "ws")
        ws.store.upsert_image("a", "a.png", "a" * 64, 8, 6)  # the WAL and shared-memory files exist now
        accounts.secret_key(ws.root)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in [ws.root, *ws.root.iterdir()]}
    assert modes == {"ws": 0o700, "images": 0o700, "masks": 0o700, "cache": 0o700, "runs": 0o700,
                     "triderm.sqlite": 0o600, "triderm.sqlite-wal": 0o600, "triderm.sqlite-shm": 0o600,
                     ".session_key": 0o600}
    ws.store.close()


def test_a_failing_migration_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "MIGRATIONS", [*MIGRATIONS, ("CREATE TABLE extra (x)", "SELECT nonsense FROM nowhere")])
    with pytest.raises(sqlite3.OperationalError, match="no such table: nowhere"):
        Store(tmp_path / "t.sqlite")
    con = sqlite3.connect(tmp_path / "t.sqlite")
    assert con.execute("PRAGMA user_version").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    con.close()


def test_a_migration_with_a_trigger_and_a_semicolon_literal_runs_whole(tmp_path, monkeypatch):
    script = """
CREATE TABLE notes (text TEXT NOT NULL DEFAULT 'a;b');
CREATE TRIGGER notes_tag AFTER INSERT ON notes BEGIN
    UPDATE notes SET text = new.text || ';tagged' WHERE rowid = new.rowid;
END;
"""
    assert len(store_mod.sql_statements(script)) == 2
    monkeypatch.setattr(store_mod, "MIGRATIONS", [*MIGRATIONS, store_mod.sql_statements(script)])
    s = Store(tmp_path / "t.sqlite")
    assert s.schema_version == len(MIGRATIONS) + 1
    s.db.execute("INSERT INTO notes DEFAULT VALUES")
    assert s.db.execute("SELECT text FROM notes").fetchall() == [("a;b;tagged",)]
    s.close()


def test_transactions_nest_and_roll_back(store):
    with store.transaction() as conn:
        assert conn is store.db.conn and conn.in_transaction
        with store.transaction():
            store.set_meta("a", 1)
        assert conn.in_transaction  # the inner one joined, it did not commit
    assert not store.db.conn.in_transaction and store.get_meta("a") == 1
    with pytest.raises(KeyError), store.transaction():
        store.set_meta("b", 2)
        raise KeyError("x")
    assert store.get_meta("b") is None and not store.db.conn.in_transaction
    other = Store(store.path, timeout_s=0.05)
    with store.transaction(), pytest.raises(sqlite3.OperationalError, match="locked"):  # IMMEDIATE: writer lock
        other.set_meta("c", 3)
    other.close()


# -- meta, patients, images ----------------------------------------------------------------------------
def test_meta(store):
    assert store.get_meta("k") is None and store.get_meta("k", 5) == 5
    store.set_meta("k", {"a": [1, 2]})
    store.set_meta("k", {"a": [3]})
    store.set_meta("z", 0)
    assert store.get_meta("k", 5) == {"a": [3]} and store.get_meta("z", 5) == 0


def test_patients_and_their_revisions(store):
    store.upsert_patient("p2")
    store.upsert_patient("p1", {"age": np.int64(70)}, actor="amy")
    store.upsert_patient("p1", {"age": np.int64(70)}, actor="bob")  # unchanged: no revision
    store.upsert_patient("p1", {"age": 71}, actor="cid")
    assert store.patients() == [{"patient_id": "p1", "metadata": {"age": 71}}, {"patient_id": "p2", "metadata": {}}]
    assert store.patient("p1") == {"patient_id": "p1", "metadata": {"age": 71}} and store.patient("x") is None
    assert revs(store, "patients") == [
        ("p2", "row", "insert", None, {"metadata": {}}, "system"),
        ("p1", "row", "insert", None, {"metadata": {"age": 70}}, "amy"),
        ("p1", "metadata", "update", {"age": 70}, {"age": 71}, "cid"),
    ]


def test_images_upsert_and_revisions(store):
    store.upsert_patient("p")
    store.upsert_image("b", "b.png", "h1", 8.0, 6, patient_id="p", metadata={"site": "foot"}, actor="amy")
    store.upsert_image("a", "a.png", "h0", 4, 4)
    store.upsert_image("b", "b2.png", "h2", 8, 6, patient_id="p", metadata={"site": "foot"}, actor="bob")
    assert [i["image_id"] for i in store.images()] == ["a", "b"]
    assert store.image("b") == {"image_id": "b", "file": "b2.png", "sha256": "h2", "width": 8, "height": 6,
                                "patient_id": "p", "metadata": {"site": "foot"}}
    assert store.image("zz") is None
    assert revs(store, "images") == [
        ("b", "row", "insert", None, {"file": {"file": "b.png", "sha256": "h1", "width": 8, "height": 6},
                                      "patient_id": "p", "metadata": {"site": "foot"}}, "amy"),
        ("a", "row", "insert", None, {"file": {"file": "a.png", "sha256": "h0", "width": 4, "height": 4},
                                      "patient_id": None, "metadata": {}}, "system"),
        ("b", "file", "update", {"file": "b.png", "sha256": "h1", "width": 8, "height": 6},
         {"file": "b2.png", "sha256": "h2", "width": 8, "height": 6}, "bob"),
    ]


def test_delete_image_takes_its_wounds_and_judgments_along(store):
    photos(store)
    store.upsert_wound("a", 1, 10, [0, 0, 2, 5])
    store.upsert_wound("b", 1, 9, [1, 1, 3, 3])
    keep = store.add_triplet("b", "c", "d", "j", "expert:x")
    store.add_triplet("c", "a", "d", "k", "expert:x")
    store.add_triplet("d", "b", "a", "j", "llm:m")
    store.delete_image("zz", actor="amy")  # nothing to delete: nothing recorded
    store.delete_image("a", actor="amy")
    assert [i["image_id"] for i in store.images()] == ["b", "c", "d"]
    assert [w["image_id"] for w in store.wounds()] == ["b"]
    assert [t["id"] for t in store.triplets()] == [keep]
    deletes = [r for r in store.revisions() if r["action"] == "delete"]
    assert [(r["entity"], r["actor"]) for r in deletes] == [("wounds", "amy"), ("triplets", "amy"),
                                                             ("triplets", "amy"), ("images", "amy")]
    assert (deletes[-1]["key"], deletes[-1]["field"]) == ("a", "row") and deletes[-1]["old"] == {
        "file": "a.png", "sha256": "a" * 64, "width": 8, "height": 6, "patient_id": None, "metadata": {}}


# -- wounds ---------------------------------------------------------------------------------------------
def test_wounds_upsert_keep_outline_pixels_and_delete(store):
    photos(store, "ab")
    outline = {"area": 12, "bbox": [0, 0, 4, 3], "png": "PIXELS"}
    wid = store.upsert_wound("a", 2, 12, (0, 0, 4, 3), description="deep", metadata={"m": 1}, actor="amy",
                             outline=outline)
    assert wid == store.wound("a", 2)["id"]
    assert store.upsert_wound("a", 1, 5, [np.int64(1), 1, 2, 2], description=None) != wid
    store.upsert_wound("b", 1, 3, [0, 0, 1, 1])
    assert store.wound("b", 1)["description"] == ""
    assert store.revisions("wounds", {"image_id": "a", "wound_index": 1})[0]["new"]["description"] == ""
    assert [(w["image_id"], w["wound_index"]) for w in store.wounds()] == [("a", 1), ("a", 2), ("b", 1)]
    assert [w["wound_index"] for w in store.wounds("a")] == [1, 2]
    assert store.wound("a", 1) | {"id": 0} == {"id": 0, "image_id": "a", "wound_index": 1, "area": 5,
                                               "bbox": [1, 1, 2, 2], "description": "", "metadata": {}}
    assert store.wound("a", 9) is None
    # a new description, same geometry and no outline given: the pixels recorded before are kept
    assert store.upsert_wound("a", 2, 12, [0, 0, 4, 3], description="shallow", metadata={"m": 1}, actor="bob") == wid
    key = {"image_id": "a", "wound_index": 2}
    assert [(r["field"], r["action"], r["old"], r["new"], r["actor"]) for r in store.revisions("wounds", key)] == [
        ("row", "insert", None, {"outline": outline, "description": "deep", "metadata": {"m": 1}}, "amy"),
        ("description", "update", "deep", "shallow", "bob"),
    ]
    # new geometry without pixels: recorded as geometry
    store.upsert_wound("a", 2, 20, [0, 0, 5, 4], description="shallow", metadata={"m": 1}, actor="cid")
    assert store.revisions("wounds", key)[-1]["old"] == outline
    assert store.revisions("wounds", key)[-1]["new"] == {"area": 20, "bbox": [0, 0, 5, 4]}
    store.delete_wound("a", 2, actor="dan")
    store.delete_wound("a", 2, actor="dan")  # already gone: nothing recorded
    last = store.revisions("wounds", key)
    assert len(last) == 4 and (last[-1]["field"], last[-1]["action"], last[-1]["new"], last[-1]["actor"]) == \
        ("row", "delete", None, "dan")
    assert last[-1]["old"] == {"outline": {"area": 20, "bbox": [0, 0, 5, 4]}, "description": "shallow",
                               "metadata": {"m": 1}}
    assert store.wound("a", 2) is None


def test_last_outline_falls_back_to_the_geometry(store):
    photos(store, "a")
    store.upsert_wound("a", 1, 12, [0, 0, 4, 3], outline={"area": 12, "bbox": [0, 0, 4, 3], "png": "P"})
    key = {"image_id": "a", "wound_index": 1}
    row = store.wound("a", 1)
    assert store._last_outline(key, row)["png"] == "P"
    assert store._last_outline(key, row | {"area": 13}) == {"area": 13, "bbox": [0, 0, 4, 3]}  # pixels of another
    assert store._last_outline({"image_id": "a", "wound_index": 7}, row) == {"area": 12, "bbox": [0, 0, 4, 3]}
    redrawn = {"area": 12, "bbox": [0, 0, 4, 3], "png": "P2"}
    store.upsert_wound("a", 1, 12, [0, 0, 4, 3], outline=redrawn)  # an "outline" revision holds the outline itself
    assert store.revisions("wounds", key)[-1]["field"] == "outline"
    assert store._last_outline(key, row) == redrawn
    store.delete_wound("a", 1)
    assert store.revisions("wounds", key)[-1]["old"]["outline"] == redrawn  # the pixels kept for an undo
    store.record_revision("wounds", key, "outline", "update", None, None, "x")  # a null "new"
    assert store._last_outline(key, row) == {"area": 12, "bbox": [0, 0, 4, 3]}
    store.record_revision("wounds", key, "outline", "update", None, [1, 2], "x")  # not a dict
    assert store._last_outline(key, row) == {"area": 12, "bbox": [0, 0, 4, 3]}
    store.record_revision("wounds", key, "description", "update", None, {"area": 12, "bbox": [0, 0, 4, 3]}, "x")
    assert store._last_outline(key, row) == {"area": 12, "bbox": [0, 0, 4, 3]}  # other fields are not outlines


# -- annotators and triplets --------------------------------------------------------------------------
def test_annotators(store):
    for bad in ("", "   "):
        with pytest.raises(ValueError, match=r"^annotator name is empty$"):
            store.add_annotator(bad)
    store.add_annotator(" zoe ")
    store.add_annotator("adam")
    store.add_annotator("zoe")
    assert store.annotators() == ["adam", "zoe"]


def test_add_triplet(store):
    photos(store)
    with pytest.raises(ValueError, match=r"^choice must be one of \('j', 'k', 'skip'\), got 'x'$"):
        store.add_triplet("a", "b", "c", "x", "expert:me")
    with pytest.raises(ValueError, match=r"^a triplet needs three different images, got a, b, a$"):
        store.add_triplet("a", "b", "a", "j", "expert:me")
    tid = store.add_triplet("a", "b", "c", "j", "expert:me", latency_ms=12.5, rep=True, created="T0")
    assert store.add_triplet("a", "b", "c", "k", "expert:me", rep=1) is None  # same key: stored once
    assert store.add_triplet("a", "b", "c", "k", "expert:me", actor="acct") != tid  # rep 0 is another key
    row = store.triplets()[0]
    assert row == {"id": tid, "anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "j", "source": "expert:me",
                   "rep": 1, "latency_ms": 12.5, "created": "T0"}
    assert {(r["field"], r["action"]) for r in store.revisions("triplets")} == {("row", "insert")}
    assert [(r["key"], r["new"], r["actor"]) for r in store.revisions("triplets")] == [
        ({"source": "expert:me", "anchor": "a", "ref_j": "b", "ref_k": "c", "rep": 1},
         {"choice": "j", "latency_ms": 12.5, "created": "T0"}, "expert:me"),
        ({"source": "expert:me", "anchor": "a", "ref_j": "b", "ref_k": "c", "rep": 0},
         {"choice": "k", "latency_ms": None, "created": store.triplets()[1]["created"]}, "acct"),
    ]


def test_a_nan_latency_or_negative_rep_is_refused_not_stored_as_null(store):
    photos(store)
    for latency in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="latency_ms must be a finite number"):
            store.add_triplet("a", "b", "c", "j", "expert:me", latency_ms=latency)
        with pytest.raises(ValueError, match=r"^triplet row 1: latency_ms"):
            store.add_triplets([{"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "j", "source": "x"},
                                {"anchor": "a", "ref_j": "b", "ref_k": "d", "choice": "j", "source": "x",
                                 "latency_ms": latency}])
    with pytest.raises(ValueError, match="rep must be 0 or more, got -1"):
        store.add_triplet("a", "b", "c", "j", "expert:me", rep=-1)
    assert store.triplets() == []


def test_add_triplets_in_bulk(store):
    photos(store)
    rows = [{"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "j", "source": "expert:x"},
            {"anchor": "b", "ref_j": "c", "ref_k": "d", "choice": "skip", "source": "llm:m", "rep": 2,
             "latency_ms": 3.0, "created": "T1"},
            {"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "k", "source": "expert:x"}]  # a duplicate
    assert store.add_triplets(rows) == 2
    got = store.triplets()
    assert [(t["anchor"], t["choice"], t["source"], t["rep"], t["latency_ms"]) for t in got] == \
        [("a", "j", "expert:x", 0, None), ("b", "skip", "llm:m", 2, 3.0)]
    assert got[1]["created"] == "T1" and re.fullmatch(r"\d{4}-.*\+00:00", got[0]["created"])
    assert [(r["key"]["rep"], r["new"]["choice"], r["actor"], r["action"], r["old"]) for r in store.revisions()
            if r["entity"] == "triplets"] == [(0, "j", "expert:x", "insert", None), (2, "skip", "llm:m", "insert", None)]
    for t in got:  # the same revision key and JSON as one add_triplet writes
        (rev,) = store.revisions("triplets", rows_mod.triplet_key(t))
        assert (rev["field"], rev["action"], rev["new"]) == \
            ("row", "insert", {"choice": t["choice"], "latency_ms": t["latency_ms"], "created": t["created"]})
        raw = store.db.execute("SELECT new FROM revisions WHERE id = ?", [rev["id"]]).fetchone()[0]
        assert raw == json.dumps(rev["new"], sort_keys=True)
    assert store.add_triplets(rows[:1], actor="bulk") == 0
    assert store.add_triplets([{**rows[0], "anchor": "d"}], actor="bulk") == 1
    assert store.revisions()[-1]["actor"] == "bulk"


@pytest.mark.parametrize("bad, message", [
    ({"choice": "maybe"}, r"^triplet row 1: choice must be one of \('j', 'k', 'skip'\), got 'maybe'$"),
    ({"ref_k": "a"}, r"^triplet row 1: a triplet needs three different images, got a, b, a$"),
])
def test_add_triplets_rejects_a_bad_row_and_stores_nothing(store, bad, message):
    photos(store)
    good = {"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "j", "source": "expert:x"}
    with pytest.raises(ValueError, match=message):
        store.add_triplets([good, {**good, **bad}])
    assert store.triplets() == [] and store.revisions("triplets") == []


def test_add_triplets_is_one_transaction(store):
    photos(store)
    rows = [{"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "j", "source": "s"},
            {"anchor": "a", "ref_j": "b", "ref_k": "zz", "choice": "j", "source": "s"}]  # no photo zz
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        store.add_triplets(rows)
    assert store.triplets() == [] and store.revisions()[-1]["entity"] == "images"


def test_add_triplets_joins_an_open_transaction(store):
    photos(store)
    with pytest.raises(KeyError), store.transaction():
        assert store.add_triplets([{"anchor": "a", "ref_j": "b", "ref_k": "c", "choice": "j", "source": "s"}]) == 1
        raise KeyError("undo")
    assert store.triplets() == []


def test_delete_triplet(store):
    photos(store)
    tid = store.add_triplet("a", "b", "c", "j", "expert:x", latency_ms=4, created="T")
    other = store.add_triplet("b", "c", "d", "k", "expert:y")
    store.delete_triplet(999)
    store.delete_triplet(tid)
    assert store.revisions("triplets")[-1]["key"] == {"source": "expert:x", "anchor": "a", "ref_j": "b", "ref_k": "c",
                                                      "rep": 0}
    store.delete_triplet(other, actor="admin")
    assert store.triplets() == []
    assert [r["field"] for r in store.revisions("triplets")] == ["row"] * 4
    assert [(r["action"], r["old"], r["new"], r["actor"]) for r in store.revisions("triplets")][2:] == [
        ("delete", {"choice": "j", "latency_ms": 4, "created": "T"}, None, "expert:x"),
        ("delete", {"choice": "k", "latency_ms": None, "created": store.revisions("triplets")[1]["new"]["created"]},
         None, "admin"),
    ]


def test_triplet_queries_and_exclusions(store):
    photos(store)
    ids = [store.add_triplet("a", "b", "c", "j", s) for s in ("expert:x", "expert:y", "llm:m", "expertz", "expert:y2")]
    store.add_triplet("b", "c", "d", "j", "expert:x")
    assert [t["id"] for t in store.triplets(source="expert:y")] == [ids[1]]
    assert [t["source"] for t in store.triplets(prefix="expert:")] == ["expert:x", "expert:y", "expert:y2", "expert:x"]
    assert [t["source"] for t in store.triplets(prefix="expert:y")] == ["expert:y", "expert:y2"]
    assert len(store.triplets()) == 6
    for source in ("llm:50%x", "llm:50abc", "llm:a_b", "llm:axb", "llm:c\\d", "llm:c\\\\d"):
        store.add_triplet("d", "a", "b", "j", source)
    # LIKE wildcards (% _) and the escape character in a prefix are literal
    assert [t["source"] for t in store.triplets(prefix="llm:50%")] == ["llm:50%x"]
    assert [t["source"] for t in store.triplets(prefix="llm:a_")] == ["llm:a_b"]
    assert [t["source"] for t in store.triplets(prefix="llm:c\\d")] == ["llm:c\\d"]
    for t in store.triplets(prefix="llm:"):
        if t["anchor"] == "d":
            store.delete_triplet(t["id"])
    store.db.execute("INSERT INTO exclusions (kind, target, actor, created) VALUES ('triplet', ?, 'a', 'T')",
                     [str(ids[0])])
    store.db.execute("INSERT INTO exclusions (kind, target, actor, created) VALUES ('annotator', 'y', 'a', 'T')")
    assert [(t["source"], t["anchor"]) for t in store.expert_triplets()] == [("expert:y2", "a"), ("expert:x", "b")]
    assert len(store.expert_triplets(include_excluded=True)) == 4
    assert store.triplet_sources() == {"expert:x": 2, "expert:y": 1, "expert:y2": 1, "expertz": 1, "llm:m": 1}


def test_llm_answers_are_cached_once_and_stored_as_triplets(store):
    photos(store)
    assert store.add_llm_answer("o", "m1", "v1", "a", "b", "c", "k", raw="K", latency_ms=7.0, tokens_in=3,
                                tokens_out=1) is True
    assert store.add_llm_answer("o", "m1", "v1", "a", "b", "c", "j") is False  # cached: nothing written
    assert store.add_llm_answer("o", "m1", "v2", "b", "c", "d", "skip") is True
    cached = store.llm_cached("o", "m1", "v1", "a", "b", "c")
    assert {k: cached[k] for k in ("choice", "raw", "latency_ms", "tokens_in", "tokens_out")} == \
        {"choice": "k", "raw": "K", "latency_ms": 7.0, "tokens_in": 3, "tokens_out": 1}
    assert store.llm_cached("o", "m1", "v1", "a", "c", "b") is None
    assert [r["anchor"] for r in store.llm_answers("o", "m1", "v2")] == ["b"]
    assert store.llm_answers("o", "m2", "v1") == []
    assert [(t["source"], t["choice"], t["latency_ms"]) for t in store.triplets()] == \
        [("llm:m1", "k", 7.0), ("llm:m1", "skip", None)]


def test_llm_latencies_are_the_last_timed_answers_of_one_oracle_and_model(store):
    photos(store)
    store.add_llm_answer("o", "m1", "v1", "a", "b", "c", "k", latency_ms=7.0, tokens_in=3)
    store.add_llm_answer("o", "m1", "v1", "b", "c", "d", "j")  # untimed: left out
    store.add_llm_answer("o", "m1", "v2", "c", "d", "a", "j", latency_ms=9.0)
    store.add_llm_answer("o", "m2", "v1", "a", "b", "c", "k", latency_ms=1.0, tokens_in=5)
    store.add_llm_answer("p", "m1", "v1", "a", "b", "c", "k", latency_ms=2.0, tokens_in=5)
    assert store.llm_latencies("o", "m1", 10) == [(9.0, None), (7.0, 3)]
    assert store.llm_latencies("o", "m1", 1) == [(9.0, None)]
    assert store.llm_latencies("o", "m3", 10) == []


def test_image_ids_are_sorted(store):
    assert store.image_ids() == []
    photos(store, "cab")
    assert store.image_ids() == ["a", "b", "c"] == [r["image_id"] for r in store.images()]


# -- revisions and import bases ------------------------------------------------------------------------
def test_last_revision_id_and_last_outline_edit(store):
    assert store.last_revision_id() == 0 and store.last_outline_edit() is None
    photos(store, "a")
    store.upsert_patient("p1", {"age": 3})
    assert store.last_revision_id() == store.revisions()[-1]["id"] > 0
    assert store.last_outline_edit() is None  # photos and patients are no outline
    store.upsert_wound("a", 1, 12, [0, 0, 4, 3], outline={"area": 12, "bbox": [0, 0, 4, 3], "png": "P"})
    added = store.revisions("wounds")[-1]["created"]
    assert store.last_outline_edit() == added
    store.upsert_wound("a", 1, 12, [0, 0, 4, 3], description="deep")  # a description is no outline edit
    assert store.revisions("wounds")[-1]["field"] == "description"
    assert store.last_outline_edit() == added
    time.sleep(0.002)
    store.upsert_wound("a", 1, 20, [0, 0, 5, 4], description="deep")
    changed = store.revisions("wounds")[-1]
    assert changed["field"] == "outline" and store.last_outline_edit() == changed["created"] > added
    time.sleep(0.002)
    store.delete_wound("a", 1)
    assert store.last_outline_edit() == store.revisions("wounds")[-1]["created"] > changed["created"]
    assert store.last_revision_id() == store.revisions()[-1]["id"]


def test_record_revision_and_restoring(store):
    for bad in ("", "  ", None):
        with pytest.raises(ValueError, match=r"^a revision needs an actor \(account name, 'import' or a job name\)$"):
            store.record_revision("e", "k", "f", "update", 1, 2, bad)
    rid = store.record_revision("e", {"b": 1, "a": 2}, "f", "update", np.float64(1.5), {"x": np.arange(2)}, " amy ")
    assert store.revision(rid) | {"created": "T"} == {"id": rid, "entity": "e", "key": {"a": 2, "b": 1}, "field": "f",
                                                      "action": "update", "old": 1.5, "new": {"x": [0, 1]},
                                                      "actor": "amy", "created": "T"}
    assert store.db.execute("SELECT key FROM revisions").fetchone()[0] == '{"a": 2, "b": 1}'
    rid2 = store.record_revision("e", "k", "f", "update", {"b": np.int64(1), "a": 2}, {"x": np.arange(2), "a": 1}, "amy")
    assert store.db.execute("SELECT old, new FROM revisions WHERE id = ?", [rid2]).fetchone() == \
        ('{"a": 2, "b": 1}', '{"a": 1, "x": [0, 1]}')
    store.db.execute("DELETE FROM revisions WHERE id = ?", [rid2])
    assert store.revision(rid + 1) is None
    with store.restoring():
        assert store.db.conn.in_transaction
        store.record_revision("e", "k2", "f", "update", 1, 2, "bob")
    with pytest.raises(KeyError), store.restoring():
        raise KeyError("x")
    store.record_revision("e", "k3", "f", "update", 1, 2, "cid")
    assert [r["action"] for r in store.revisions("e")] == ["update", "restore", "update"]
    assert [r["key"] for r in store.revisions(key="k2")] == ["k2"]
    assert store.revisions("e", {"a": 2, "b": 1})[0]["id"] == rid and store.revisions("other") == []
    assert len(store.revisions()) == 3


def test_import_bases(store):
    store.set_import_base("images", "a", "file", "h1")
    store.set_import_base("wounds", {"image_id": "a", "wound_index": 1}, "outline", "h2")
    store.set_import_base("images", "a", "file", "h3")
    assert store.import_bases() == {("images", '"a"', "file"): "h3",
                                    ("wounds", '{"image_id": "a", "wound_index": 1}', "outline"): "h2"}
    store.set_import_base("images", "a", "file", None)
    store.set_import_base("images", "zz", "file", None)
    assert list(store.import_bases()) == [("wounds", '{"image_id": "a", "wound_index": 1}', "outline")]


# -- runs -----------------------------------------------------------------------------------------------
def test_runs_lifecycle(store, monkeypatch):
    monkeypatch.setattr(run_records, "git_sha", lambda: "sha0")
    first = store.start_run("fusion", {"k": 1}, seed=3, name="one")
    second = store.start_run("train", {})
    run = store.run(first)
    assert {k: run[k] for k in ("kind", "name", "config", "seed", "git_sha", "status", "progress", "metrics",
                                "artifacts", "message", "finished")} == \
        {"kind": "fusion", "name": "one", "config": {"k": 1}, "seed": 3, "git_sha": "sha0", "status": "running",
         "progress": 0.0, "metrics": {}, "artifacts": {}, "message": None, "finished": None}
    pid, created = run_records.jobs.process_identity()
    assert (run["pid"], run["pid_created"], run["host"]) == (pid, created, run_records.jobs.hostname())
    assert run["heartbeat"] == run["created"] and set(store._heartbeats) == {first, second}
    store.update_run(first, progress=0.5, metrics={"a": 1}, message="half", artifacts={"f": "x"})
    store.update_run(first, metrics={"b": 2}, artifacts={"g": "y"})
    store.update_run(first, metrics={}, artifacts={})
    run = store.run(first)
    assert (run["progress"], run["metrics"], run["message"], run["artifacts"]) == \
        (0.5, {"a": 1, "b": 2}, "half", {"f": "x", "g": "y"})
    with pytest.raises(KeyError, match="no run 99"):
        store.update_run(99, progress=1)
    with pytest.raises(ValueError, match=r"^status must be one of \('running', 'done', 'failed', 'stopped', "
                                         r"'interrupted'\), got 'ok'$"):
        store.finish_run(first, "ok")
    beats = dict(store._heartbeats)
    store.finish_run(second, "failed", message="boom")
    store.finish_run(first, metrics={"c": 3}, artifacts={"h": "z"})
    assert store._heartbeats == {} and all(b._stop.is_set() for b in beats.values())
    assert store.run(first)["artifacts"] == {"f": "x", "g": "y", "h": "z"}
    one, two = store.run(first), store.run(second)
    assert (one["status"], one["progress"], one["metrics"]) == ("done", 1.0, {"a": 1, "b": 2, "c": 3})
    assert (two["status"], two["progress"], two["message"]) == ("failed", 0.0, "boom")
    assert one["finished"] and two["finished"]
    assert [r["id"] for r in store.runs()] == [second, first]  # newest first
    assert [r["id"] for r in store.runs(kind="fusion")] == [first]
    assert [r["id"] for r in store.runs(status="failed")] == [second]
    assert store.runs(kind="fusion", status="failed") == [] and store.run(99) is None
    assert store._beat(first) is False  # done: the heartbeat stops stamping


def test_another_store_finishes_a_run_and_beats_with_the_store_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(run_records, "git_sha", lambda: "sha0")
    one, two = Store(tmp_path / "t.sqlite"), Store(tmp_path / "t.sqlite", timeout_s=7.0)
    rid = one.start_run("x", {})
    two.finish_run(rid, "done")  # a run this store did not start: no heartbeat of its own to stop
    assert one.run(rid)["status"] == "done"
    seen = []
    real = run_records.sqlite3.connect
    monkeypatch.setattr(run_records.sqlite3, "connect", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    two._beat(rid)
    assert seen == [{"timeout": 7.0}]
    one.close()
    two.close()


def test_a_running_run_is_stamped_by_its_heartbeat_thread(store, monkeypatch):
    monkeypatch.setattr(run_records, "git_sha", lambda: "sha0")
    monkeypatch.setattr(run_records.jobs, "HEARTBEAT_S", 0.01)
    rid = store.start_run("x", {})
    store.db.execute("UPDATE runs SET heartbeat = 'old' WHERE id = ?", [rid])
    deadline = time.monotonic() + 60  # an event wait (the thread beats every 10 ms), generous on a loaded machine
    while store.db.execute("SELECT heartbeat FROM runs WHERE id = ?", [rid]).fetchone()[0] == "old":
        assert time.monotonic() < deadline, "the heartbeat thread never stamped the run"
        time.sleep(0.01)
    store.finish_run(rid)


def test_beat_stamps_only_running_runs(store, monkeypatch):
    monkeypatch.setattr(run_records, "git_sha", lambda: "sha0")
    rid = store.start_run("x", {})
    store.db.execute("UPDATE runs SET heartbeat = 'old' WHERE id = ?", [rid])
    assert store._beat(rid) is True
    assert store.db.execute("SELECT heartbeat FROM runs WHERE id = ?", [rid]).fetchone()[0] != "old"
    assert store._beat(rid + 1) is False
    store.finish_run(rid, "stopped")
    assert store.run(rid)["progress"] == 0.0 and store.run(rid)["status"] == "stopped"


def test_a_run_whose_process_is_gone_is_marked_interrupted(store, monkeypatch):
    monkeypatch.setattr(run_records, "git_sha", lambda: "sha0")
    rid = store.start_run("x", {})
    keep = store.start_run("y", {})
    store.finish_run(keep, "done")
    monkeypatch.setattr(run_records.jobs, "run_gone", lambda run: "process gone" if run["status"] == "running" else None)
    (marked,) = [r for r in store.runs() if r["id"] == rid]  # as marked now, not read back
    assert (marked["status"], marked["message"]) == ("interrupted", "process gone")
    assert marked["finished"] >= marked["created"]  # stamped now; the clock is read to the millisecond, so equal is fine
    stored = store.db.execute("SELECT status, message, finished FROM runs WHERE id = ?", [rid]).fetchone()
    assert stored == ("interrupted", "process gone", marked["finished"])
    store.db.execute("UPDATE runs SET status = 'running', message = NULL WHERE id = ?", [rid])
    assert store.runs(status="running") == []
    run = store.run(rid)
    assert (run["status"], run["message"]) == ("interrupted", "process gone") and run["finished"]
    assert [r["id"] for r in store.runs(status="interrupted")] == [rid]
    assert store.run(keep)["status"] == "done"


def test_reconcile_reads_a_run_that_finished_meanwhile(store, monkeypatch):
    monkeypatch.setattr(run_records, "git_sha", lambda: "sha0")
    rid = store.start_run("x", {})
    store.finish_run(rid, "done", metrics={"m": 1})
    stale = {**store.run(rid), "status": "running"}
    monkeypatch.setattr(run_records.jobs, "run_gone", lambda run: "gone")
    got = store._reconciled(stale)
    assert (got["status"], got["metrics"]) == ("done", {"m": 1})


def test_reconcile_on_a_read_only_store_says_so_without_storing(tmp_path, monkeypatch):
    monkeypatch.setattr(run_records, "git_sha", lambda: "sha0")
    s = Store(tmp_path / "t.sqlite")
    rid = s.start_run("x", {})
    s.finish_run(rid, "done")
    s.db.execute("UPDATE runs SET status = 'running' WHERE id = ?", [rid])
    s.db.execute("PRAGMA query_only = ON")
    monkeypatch.setattr(run_records.jobs, "run_gone", lambda run: "gone")
    got = s.run(rid)
    assert (got["status"], got["message"]) == ("interrupted", "gone")
    assert s.db.execute("SELECT status FROM runs").fetchone()[0] == "running"
    s.close()


def test_counts(store):
    photos(store)
    store.upsert_patient("p")
    store.upsert_wound("a", 1, 5, [0, 0, 1, 1], description="  ")
    store.upsert_wound("a", 2, 5, [0, 0, 1, 1], description="deep")
    store.upsert_wound("b", 1, 5, [0, 0, 1, 1], description="x")
    store.add_triplet("a", "b", "c", "j", "expert:x")
    store.add_triplet("a", "b", "c", "j", "llm:m")
    store.add_triplet("a", "b", "d", "j", "llm:m")
    store.add_triplet("a", "b", "d", "j", "expertise")
    assert store.counts() == {"images": 4, "patients": 1, "wounds": 3, "described_wounds": 2, "images_with_wounds": 2,
                              "expert_triplets": 1, "llm_triplets": 2, "runs": 0}


def test_close_stops_heartbeats(tmp_path, monkeypatch):
    monkeypatch.setattr(run_records, "git_sha", lambda: "sha0")
    s = Store(tmp_path / "t.sqlite")
    s.start_run("x", {})
    beat = next(iter(s._heartbeats.values()))
    s.close()
    assert s._heartbeats == {} and beat._stop.is_set()
    with pytest.raises(sqlite3.ProgrammingError):
        s.db.execute("SELECT 1")
