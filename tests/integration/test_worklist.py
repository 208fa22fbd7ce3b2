"""The outline worklist's data layer (issue 54): photos marked done, the worklist's rows, and undoing a
wound's deletion exactly (outline pixels, description, metadata)."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from annotations.accounts import session
from annotations.store.history import restore_revision
from annotations.store.store import MIGRATIONS, Store


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


# -- the outline page (Streamlit AppTest) -----------------------------------------------------------------
def masks_page(name: str = "Wanda", role: str = "annotator"):
    """The Wound masks page, signed in as ``name`` (helpers of test_app_pages)."""
    from test_app_pages import app

    return app("masks", annotator=name, role=role)


def button(at, label: str):
    return next(b for b in at.button if b.label == label)


def test_delete_asks_first_and_undo_restores_the_wound_exactly(ws):
    at = masks_page()
    photo = at.selectbox(key="mask_photo").value
    wound = ws.store.wounds(photo)[0]
    index = wound["wound_index"]
    at.text_area(key=f"desc_{photo}_{index}").input("fibrin, raised border").run()
    before, mask = ws.store.wound(photo, index), ws.load_mask(photo).copy()
    at.button(key=f"del_{photo}_{index}").click().run()
    assert ws.store.wound(photo, index) == before  # asked, not deleted
    assert any(f"Delete wound {index}: its outline, description and metadata?" in w.value for w in at.warning)
    at.button(key="mask_del_no").click().run()
    assert ws.store.wound(photo, index) == before and not any("Delete wound" in w.value for w in at.warning)
    at.button(key=f"del_{photo}_{index}").click().run()
    at.button(key="mask_del_yes").click().run()
    assert not at.exception and ws.store.wound(photo, index) is None and not (ws.load_mask(photo) == index).any()
    assert any(f"Deleted wound {index} of {photo}" in m.value for m in at.success)
    at.button(key="mask_undo_btn").click().run()
    assert not at.exception and not at.error
    after = ws.store.wound(photo, index)
    assert {k: after[k] for k in ("area", "bbox", "description", "metadata")} == {
        k: before[k] for k in ("area", "bbox", "description", "metadata")}
    assert (ws.load_mask(photo) == mask).all()
    assert at.text_area(key=f"desc_{photo}_{index}").value == "fibrin, raised border"
    assert not [b for b in at.button if b.key == "mask_undo_btn"]  # one undo per deletion


def test_the_worklist_walks_marks_done_and_keeps_the_photo_in_the_address(ws):
    ids = [im["image_id"] for im in ws.store.images()]
    for w in ws.store.wounds(ids[3]):
        session.delete_wound(ws, ids[3], w["wound_index"], actor="system")
    at = masks_page()
    assert at.selectbox(key="mask_photo").value == ids[0] and at.query_params["photo"] == ids[0]
    at.button(key="mask_next").click().run()
    assert at.selectbox(key="mask_photo").value == ids[1] and at.query_params["photo"] == ids[1]
    at.button(key="mask_prev").click().run()
    assert at.selectbox(key="mask_photo").value == ids[0]
    at.button(key="mask_next_bare").click().run()
    assert at.selectbox(key="mask_photo").value == ids[3]  # the only photo with no outline
    assert at.button(key="mask_next_bare").disabled  # no other
    at.button(key="mask_done").click().run()
    assert ws.store.done_photos()[ids[3]]["actor"] == "Wanda"
    assert any("Marked" in m.value for m in at.success) and at.button(key="mask_undone")
    at.selectbox(key="mask_filter").select("Not marked done").run()
    at.button(key="mask_prev").click().run()
    assert at.selectbox(key="mask_photo").value == ids[2]
    at.button(key="mask_next").click().run()
    assert at.selectbox(key="mask_photo").value == ids[4]  # the done photo is skipped
    at.selectbox(key="mask_filter").select("Mine").run()
    assert at.button(key="mask_next").disabled  # Wanda's only photo (marked done by her) lies behind
    at.button(key="mask_prev").click().run()
    assert at.selectbox(key="mask_photo").value == ids[3]

    from streamlit.testing.v1 import AppTest
    from test_app_pages import APP, PAGES, account, signed_in

    fresh = signed_in(AppTest.from_file(APP, default_timeout=60), account("Wanda", "annotator"))
    fresh.query_params["photo"] = ids[5]  # a reload: a new session on the same address
    fresh.run()
    fresh.switch_page(PAGES["masks"]).run()
    assert fresh.selectbox(key="mask_photo").value == ids[5]


def test_without_torch_the_model_controls_stay_disabled_with_the_extra_named(ws, monkeypatch):
    from app import extras

    hint = 'pip install "triderm-studio[ml]"'
    monkeypatch.setattr(extras, "extra_missing", lambda module: hint if module == "torch" else None)
    at = masks_page()
    assert not at.exception and not at.error
    suggest = button(at, "Suggest outlines")
    assert suggest.disabled and hint in suggest.help
    engine = at.radio(key="mask_click_engine")
    assert engine.disabled and hint in engine.help
    assert at.selectbox(key="mask_photo") and at.text_area  # the rest of the page is there


def test_extra_missing_names_the_extra_of_a_module_not_installed(monkeypatch):
    import sys

    from app import extras

    assert extras.extra_missing("torch") is None  # installed here

    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                raise ModuleNotFoundError("No module named 'torch' (hidden)", name=name)

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Hide(), *sys.meta_path])
    assert extras.extra_missing("torch") == 'pip install "triderm-studio[ml]"'
