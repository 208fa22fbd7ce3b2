"""Two sessions edit the same wound on the Wound masks page (AppTest, no browser): a save writes only the
fields it changed, and a save from a stale copy is refused with both values, changing nothing."""
from __future__ import annotations

from annotations.infra.workspace import Workspace
from tests.integration.test_app_pages import app


def test_a_stale_page_saves_only_its_changed_field_and_refuses_a_stale_one(ws):
    annotator = app("masks", annotator="Ann", role="annotator")
    admin = app("masks", annotator="Ada", role="admin")  # both pages load the same wound
    photo = ws.store.images()[0]["image_id"]
    index = ws.store.wounds(photo)[0]["wound_index"]
    base = f"{photo}_{index}"
    before = ws.store.wound(photo, index)

    annotator.text_area(key=f"desc_{base}").input("Annotator: fibrin at 6 o'clock").run()
    admin.text_input(key=f"meta_size_cm_{base}").input("4.5").run()  # the admin's page still shows the old text
    wound = Workspace(ws.root).store.wound(photo, index)
    assert wound["description"] == "Annotator: fibrin at 6 o'clock"  # not reverted by the admin's save
    assert wound["metadata"]["size_cm"] == 4.5
    size_revisions = [r for r in ws.store.revisions("wounds") if r["actor"] == "Ada"]
    assert [r["field"] for r in size_revisions] == ["metadata"]  # history: the admin changed the size only
    assert not admin.error

    revisions = ws.store.revisions()
    admin.text_area(key=f"desc_{base}").input("Admin: clean granulation").run()
    assert Workspace(ws.root).store.wound(photo, index)["description"] == "Annotator: fibrin at 6 o'clock"
    assert ws.store.revisions() == revisions  # nothing recorded
    assert [e.value for e in admin.error if "Not saved: Ann" in e.value]
    shown = [t.value for t in admin.text]
    assert "Theirs: Annotator: fibrin at 6 o'clock" in shown and "Yours: Admin: clean granulation" in shown
    assert admin.text_area(key=f"desc_{base}").value == "Admin: clean granulation"  # the input is kept

    admin.button(key=f"mine_{base}").click().run()  # the admin saves over it, knowingly
    assert Workspace(ws.root).store.wound(photo, index)["description"] == "Admin: clean granulation"
    assert not [e for e in admin.error if "Not saved" in e.value]
    assert before["description"] != "Admin: clean granulation"


def test_use_theirs_puts_their_text_in_the_field_and_saves_nothing(ws):
    annotator = app("masks", annotator="Ann", role="annotator")
    admin = app("masks", annotator="Ada", role="admin")
    photo = ws.store.images()[0]["image_id"]
    base = f"{photo}_{ws.store.wounds(photo)[0]['wound_index']}"
    annotator.text_area(key=f"desc_{base}").input("theirs").run()
    admin.text_area(key=f"desc_{base}").input("mine").run()
    revisions = ws.store.revisions()
    admin.button(key=f"theirs_{base}").click().run()
    assert admin.text_area(key=f"desc_{base}").value == "theirs"
    assert ws.store.revisions() == revisions
    admin.text_area(key=f"desc_{base}").input("theirs, then mine").run()  # now edited from their text: saved
    assert Workspace(ws.root).store.wound(*base.rsplit("_", 1))["description"] == "theirs, then mine"


def test_an_outline_saved_over_one_changed_since_the_editor_drew_it_is_refused(ws, monkeypatch):
    """The outline editor's actions are fed to the page (the component itself is driven in tests/browser)."""
    import components.outline_editor as editor

    actions: list[dict] = []
    monkeypatch.setattr(editor, "outline_editor", lambda **kwargs: actions.pop(0) if actions else None)
    annotator = app("masks", annotator="Ann", role="annotator")
    admin = app("masks", annotator="Ada", role="admin")  # both editors draw the stored outlines
    photo = ws.store.images()[0]["image_id"]
    wound = ws.store.wounds(photo)[0]
    x0, y0, x1, y1 = wound["bbox"]

    def square(inset: float, nonce: str) -> dict:
        a, b = x0 + (x1 - x0) * inset, y0 + (y1 - y0) * inset
        c, d = x1 - (x1 - x0) * inset, y1 - (y1 - y0) * inset
        return {"type": "save", "index": wound["wound_index"], "nonce": nonce,
                "polys": [[[a, b], [c, b], [c, d], [a, d]]]}

    actions.append(square(0.3, "ann-1"))
    annotator.run()
    theirs = Workspace(ws.root).store.wound(photo, wound["wound_index"])
    assert theirs["area"] != wound["area"] and not annotator.error
    revisions = ws.store.revisions()
    actions.append(square(0.2, "ada-1"))  # drawn over the outline as the admin's editor last showed it
    admin.run()
    assert any(f"Not saved: Ann changed wound {wound['wound_index']}" in e.value for e in admin.error)
    assert Workspace(ws.root).store.wound(photo, wound["wound_index"]) == theirs
    assert ws.store.revisions() == revisions
    actions.append(square(0.2, "ada-2"))  # the editor has redrawn the stored outline: now saved
    admin.run()
    assert Workspace(ws.root).store.wound(photo, wound["wound_index"])["area"] != theirs["area"]


def test_follow_up_link_and_visit_date_from_a_stale_page_are_refused(tmp_path, monkeypatch):
    from annotations.accounts import accounts
    from annotations.io.dataset import import_dataset
    from core.phantoms.visits import build_visits
    from tests.integration.test_followup_page import page, split_visits

    build_visits(tmp_path / "visits", visits=3, patients=2, seed=5)
    before, after = split_visits(tmp_path / "visits", tmp_path, "_v03")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, before)
    import_dataset(ws, after)  # the third visit's wounds wait for their links
    monkeypatch.setenv("TRIDERM_WORKSPACE", str(ws.root))
    accounts.add_account(ws.store, "Tess", "admin", "correct horse battery", "test")
    first, second = page(ws), page(ws)  # two browsers show the same pending link
    pending = int(first.subheader[0].value.split("·")[1])
    first.button(key="fu_accept").click().run()
    linked = {(w["image_id"], w["wound_index"]): w["metadata"].get("track_id") for w in ws.store.wounds()}
    revisions = ws.store.revisions()
    second.button(key="fu_new").click().run()  # a new track for the wound the first browser just linked
    assert any(e.value.startswith("Not linked: Tess put wound") for e in second.error)
    assert {(w["image_id"], w["wound_index"]): w["metadata"].get("track_id") for w in ws.store.wounds()} == linked
    assert ws.store.revisions() == revisions
    assert int(second.subheader[0].value.split("·")[1]) == pending - 1

    photo = first.selectbox(key="fu_photo").value
    second.selectbox(key="fu_photo").set_value(photo).run()
    second.date_input(key="fu_day").set_value("2025-03-04").run()  # the second browser's page is ready first
    first.date_input(key="fu_day").set_value("2025-01-02").run()
    first.button(key="fu_set_date").click().run()
    assert ws.store.image(photo)["metadata"]["visit_date"] == "2025-01-02"
    second.button(key="fu_set_date").click().run()
    assert any("2025-01-02" in e.value and "2025-03-04" in e.value for e in second.error)
    assert ws.store.image(photo)["metadata"]["visit_date"] == "2025-01-02"
    second.button(key="fu_set_date").click().run()  # the page now shows the first browser's date: saved
    assert ws.store.image(photo)["metadata"]["visit_date"] == "2025-03-04"


def test_an_account_change_from_a_stale_page_is_refused(ws):
    from annotations.accounts import accounts

    accounts.add_account(ws.store, "Ann", "annotator", "correct horse battery", "test")
    first, second = app("accounts", annotator="Ada"), app("accounts", annotator="Bo")
    for at in (first, second):
        at.selectbox(key="acct_who").set_value("Ann").run()
    second.selectbox(key="acct_role").set_value("researcher").run()  # the second admin's choice, made first
    first.selectbox(key="acct_role").set_value("viewer").run()
    next(b for b in first.button if b.label == "Change role").click().run()
    assert accounts.get(ws.store, "Ann").role == "viewer"
    next(b for b in second.button if b.label == "Change role").click().run()
    assert accounts.get(ws.store, "Ann").role == "viewer"
    assert any("viewer" in e.value and "researcher" in e.value and "Ada" in e.value for e in second.error)



def test_a_wound_changed_since_the_page_showed_it_is_not_deleted(ws):
    annotator = app("masks", annotator="Ann", role="annotator")
    admin = app("masks", annotator="Ada", role="admin")
    photo = ws.store.images()[0]["image_id"]
    index = ws.store.wounds(photo)[0]["wound_index"]
    annotator.text_area(key=f"desc_{photo}_{index}").input("a new finding").run()
    admin.button(key=f"del_{photo}_{index}").click().run()  # the admin's page shows the old description
    admin.button(key="mask_del_yes").click().run()  # a deletion is confirmed first
    assert Workspace(ws.root).store.wound(photo, index)["description"] == "a new finding"
    assert any(e.value.startswith("Not deleted: Ann changed wound") for e in admin.error)
    assert admin.text_area(key=f"desc_{photo}_{index}").value == "a new finding"  # shown as stored now
    admin.button(key=f"del_{photo}_{index}").click().run()  # shown again as stored: now deleted
    admin.button(key="mask_del_yes").click().run()
    assert Workspace(ws.root).store.wound(photo, index) is None


def test_saving_second_reading_marks_keeps_another_admins_marks(tmp_path, monkeypatch):
    from annotations.followup import readings
    from tests.integration.test_readings import review_page
    from tests.integration.test_readings import ws as photos

    ws = photos.__wrapped__(tmp_path)
    first, second = review_page(ws, monkeypatch, "Ada", "admin"), review_page(ws, monkeypatch, "Bo", "admin")
    first.multiselect(key="reading_photos").set_value(["p1"])
    first.button(key="reading_save").click().run()
    assert readings.marked(ws) == ["p1"]
    second.multiselect(key="reading_photos").set_value(["p2"])  # the form showed no mark: p1 is not its change
    second.button(key="reading_save").click().run()
    assert readings.marked(ws) == ["p1", "p2"]
    assert second.multiselect(key="reading_photos").value == ["p1", "p2"]  # the stored marks shown again


def test_an_ollama_allow_list_saved_from_a_stale_form_is_refused(ws):
    first, second = app("accounts", annotator="Ada"), app("accounts", annotator="Bo")
    next(t for t in first.text_area if t.label == "Allowed hosts").input("gpu-a:11434")
    next(b for b in first.button if b.label == "Save hosts").click().run()
    assert ws.store.get_meta("ollama_hosts") == ["gpu-a:11434"]
    next(t for t in second.text_area if t.label == "Allowed hosts").input("gpu-b:11434")
    next(b for b in second.button if b.label == "Save hosts").click().run()
    assert ws.store.get_meta("ollama_hosts") == ["gpu-a:11434"]
    assert any("gpu-a" in e.value and "gpu-b" in e.value for e in second.error)
