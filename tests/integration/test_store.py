"""The SQLite store: uniqueness, runs, migrations and concurrent writers."""
from __future__ import annotations

import multiprocessing as mp
import sqlite3

import pytest

from annotations.infra.workspace import Workspace
from annotations.store.store import MIGRATIONS, Store


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "t.sqlite")
    for i in range(4):
        s.upsert_image(f"im{i}", f"im{i}.png", "0" * 64, 10, 10)
    return s


def test_pragmas_and_schema_version(store):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert store.schema_version == len(MIGRATIONS)
    Store(store.path)  # reopening does not re-run migrations
    assert store.schema_version == len(MIGRATIONS)


def test_triplet_double_click_is_one_row(store):
    assert store.add_triplet("im0", "im1", "im2", "j", "expert:ann", latency_ms=500) is not None
    assert store.add_triplet("im0", "im1", "im2", "j", "expert:ann", latency_ms=510) is None
    assert store.add_triplet("im0", "im1", "im2", "k", "expert:ann", rep=1) is not None
    assert len(store.expert_triplets()) == 2


def test_triplet_validation(store):
    with pytest.raises(ValueError, match="choice"):
        store.add_triplet("im0", "im1", "im2", "x", "expert:ann")
    with pytest.raises(ValueError, match="three different"):
        store.add_triplet("im0", "im0", "im2", "j", "expert:ann")
    with pytest.raises(sqlite3.IntegrityError):
        store.add_triplet("im0", "im1", "nope", "j", "expert:ann")


def test_llm_answer_cached_once_and_stored_as_triplet(store):
    args = ("ollama", "m", "v1", "im0", "im1", "im2")
    assert store.add_llm_answer(*args, "k", raw='{"answer": "k"}', latency_ms=12.0)
    assert not store.add_llm_answer(*args, "j")
    assert store.llm_cached(*args)["choice"] == "k"
    assert [t["choice"] for t in store.triplets(source="llm:m")] == ["k"]


def test_runs_record_config_metrics_and_status(store):
    rid = store.start_run("vision-triderm", {"lr": 0.01, "modality": "vision"}, seed=3)
    store.update_run(rid, progress=0.5, metrics={"loss": [3.0, 2.0]})
    store.update_run(rid, metrics={"balanced": 0.7})
    store.finish_run(rid, artifacts={"embeddings": "runs/1/embeddings.npz"})
    run = store.run(rid)
    assert run["status"] == "done" and run["progress"] == 1.0 and run["seed"] == 3
    assert run["metrics"] == {"loss": [3.0, 2.0], "balanced": 0.7}
    assert run["config"]["modality"] == "vision" and run["git_sha"]
    assert store.runs(kind="vision-triderm")[0]["id"] == rid
    with pytest.raises(ValueError):
        store.finish_run(rid, status="weird")


def test_wound_upsert_and_delete(store):
    wid = store.upsert_wound("im0", 1, 20, [0, 0, 5, 4], "red", {"site": "arm"})
    assert store.upsert_wound("im0", 1, 21, [0, 0, 5, 4], "red bed", {"site": "arm"}) == wid
    assert store.wounds("im0")[0]["description"] == "red bed"
    store.delete_wound("im0", 1)
    assert store.wounds() == []


def _insert_100(args: tuple[str, int]) -> int:
    root, worker = args
    ws = Workspace(root)
    ids = [r["image_id"] for r in ws.store.images()]
    n = 0
    for t in range(100):
        a, j, k = ids[t % 10], ids[10 + t % 10], ids[20 + (t // 10) % 10]
        n += ws.store.add_triplet(a, j, k, "j" if t % 2 else "k", f"expert:w{worker}",
                                  latency_ms=float(t)) is not None
    return n


def test_eight_processes_insert_800_triplets(tmp_path):
    ws = Workspace(tmp_path / "ws")
    for i in range(30):
        ws.store.upsert_image(f"im{i:02d}", f"im{i:02d}.png", "0" * 64, 10, 10)
    ctx = mp.get_context("spawn")
    with ctx.Pool(8) as pool:
        inserted = pool.map(_insert_100, [(str(ws.root), w) for w in range(8)])
    assert inserted == [100] * 8
    assert ws.store.db.execute("SELECT count(*) FROM triplets").fetchone()[0] == 800


def test_writes_record_revisions_with_their_actor(store):
    store.upsert_wound("im0", 1, 4, [0, 0, 2, 2], "red", {"site": "shin"}, actor="dr_a")
    store.upsert_wound("im0", 1, 4, [0, 0, 2, 2], "red, drying", {"site": "shin"}, actor="dr_b")
    store.upsert_wound("im0", 1, 4, [0, 0, 2, 2], "red, drying", {"site": "shin"}, actor="dr_b")  # no change
    store.delete_wound("im0", 1, actor="dr_c")
    revs = store.revisions("wounds", {"image_id": "im0", "wound_index": 1})
    assert [(r["action"], r["field"], r["actor"]) for r in revs] == [
        ("insert", "row", "dr_a"), ("update", "description", "dr_b"), ("delete", "row", "dr_c")]
    assert revs[1]["old"] == "red" and revs[2]["old"]["description"] == "red, drying"
    tid = store.add_triplet("im0", "im1", "im2", "j", "expert:ann")
    store.delete_triplet(tid)
    trip = store.revisions("triplets")
    assert [(r["action"], r["actor"], (r["new"] or r["old"])["choice"]) for r in trip] == [
        ("insert", "expert:ann", "j"), ("delete", "expert:ann", "j")]
    with pytest.raises(ValueError, match="actor"):
        store.upsert_patient("p1", {}, actor=" ")
    assert store.patient("p1") is None  # the failed write rolled back


def test_restoring_marks_its_revisions(store):
    with store.restoring():
        store.upsert_patient("p1", {"age": 3}, actor="admin")
    store.upsert_patient("p1", {"age": 4}, actor="admin")
    assert [r["action"] for r in store.revisions("patients")] == ["restore", "update"]


def test_import_bases_round_trip(store):
    store.set_import_base("wounds", {"image_id": "im0", "wound_index": 1}, "description", "abc")
    assert store.import_bases() == {("wounds", '{"image_id": "im0", "wound_index": 1}', "description"): "abc"}
    store.set_import_base("wounds", {"image_id": "im0", "wound_index": 1}, "description", None)
    assert store.import_bases() == {}
