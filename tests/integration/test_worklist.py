"""The outline worklist's data layer (issue 54): photos marked done, the worklist's rows, and undoing a
wound's deletion exactly (outline pixels, description, metadata)."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from annotations import session
from annotations.history import restore_revision
from annotations.store import MIGRATIONS, Store


def test_done_marks_are_stored_recorded_and_listed_in_the_worklist(demo_workspace):
    ws = demo_workspace
    store = ws.store
    ids = [im["image_id"] for im in store.images()]
    outlined, bare = ids[0], ids[-1]
    for w in store.wounds(bare):
        session.delete_wound(ws, bare, w["wound_index"], actor="system")
    assert {r["image_id"]: r["wounds"] for r in store.worklist("Ann")}[bare] == 0
    assert store.done_photos() == {}
    assert store.set_done(outlined, True, actor="Ann") is True
    assert store.set_done(outlined, True, actor="Bob") is False  # already done: Ann's mark stays
    assert store.done_photos()[outlined]["actor"] == "Ann"
    (rev,) = store.revisions("images", outlined)[-1:]
    assert (rev["field"], rev["old"], rev["new"], rev["actor"]) == ("done", False, True, "Ann")

    session.add_wound(ws, bare, np.pad(np.ones((8, 8), bool), ((4, ws.load_mask(bare).shape[0] - 12),
                                                                 (4, ws.load_mask(bare).shape[1] - 12))),
                      actor="Bob")
    rows = {r["image_id"]: r for r in store.worklist("bob")}  # account names are case-insensitive
    assert list(rows) == ids
    assert rows[outlined]["done_by"] == "Ann" and not rows[outlined]["mine"]
    assert rows[bare]["wounds"] == 1 and rows[bare]["mine"] and rows[bare]["done_by"] is None
    assert {r["image_id"] for r in store.worklist("Ann") if r["mine"]} == {outlined}

    restore_revision(ws, rev["id"], "Ann")  # the history undoes a done mark too
    assert outlined not in store.done_photos()
    with pytest.raises(ValueError, match="no photo 'nope'"):
        store.set_done("nope", True, actor="Ann")
    assert store.done_photos() == {}


def test_the_done_table_arrives_by_migration(tmp_path):
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    for statements in MIGRATIONS[:-1]:
        for statement in statements:
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) - 1}")
    conn.execute("INSERT INTO images (image_id, file, sha256, width, height) VALUES ('a', 'a.png', 'x', 4, 4)")
    conn.commit()
    conn.close()
    store = Store(path)
    assert store.schema_version == len(MIGRATIONS)
    assert store.set_done("a", True, actor="Ann") and list(store.done_photos()) == ["a"]
    store.close()


def test_undo_delete_restores_the_outline_description_and_metadata_exactly(demo_workspace):
    ws = demo_workspace
    photo, wound = next((w["image_id"], w) for w in ws.store.wounds() if w["metadata"])
    index = wound["wound_index"]
    ws.store.edit("wounds", {"image_id": photo, "wound_index": index},
                  ws.store.fields("wounds", {"image_id": photo, "wound_index": index}),
                  {"description": "fibrin, <b>raised</b> border", "metadata.size_cm": 3.5}, actor="Ann")
    before_row, before_mask = ws.store.wound(photo, index), ws.load_mask(photo).copy()
    rev = session.delete_wound(ws, photo, index, actor="Ann")
    assert rev is not None and ws.store.wound(photo, index) is None and not (ws.load_mask(photo) == index).any()

    assert session.undo_delete(ws, rev, actor="Ann") == index
    after = ws.store.wound(photo, index)
    assert {k: after[k] for k in ("area", "bbox", "description", "metadata")} == {
        k: before_row[k] for k in ("area", "bbox", "description", "metadata")}
    assert (ws.load_mask(photo) == before_mask).all()
    assert ws.store.revisions("wounds", {"image_id": photo, "wound_index": index})[-1]["action"] == "restore"
    with pytest.raises(ValueError, match=f"wound {index} of {photo} exists again"):
        session.undo_delete(ws, rev, actor="Ann")  # a second undo changes nothing


def test_undo_delete_refuses_when_another_wound_took_its_pixels(demo_workspace):
    ws = demo_workspace
    photo = next(im["image_id"] for im in ws.store.images() if len(ws.store.wounds(im["image_id"])) >= 2)
    index = 1  # not the photo's last number: a new wound takes another
    region = ws.load_mask(photo) == index
    rev = session.delete_wound(ws, photo, index, actor="Ann")
    taken = session.add_wound(ws, photo, region, actor="Bob")
    mask = ws.load_mask(photo).copy()
    with pytest.raises(ValueError, match=f"now overlaps wound\\(s\\) {taken}"):
        session.undo_delete(ws, rev, actor="Ann")
    assert taken != index and (ws.load_mask(photo) == mask).all() and ws.store.wound(photo, index) is None
    with pytest.raises(ValueError, match="is not a wound's deletion"):
        session.undo_delete(ws, ws.store.revisions("wounds")[0]["id"], actor="Ann")
