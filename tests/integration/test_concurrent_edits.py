"""Optimistic concurrency in the store: an editor saves only the fields it changed, and only when each still
holds the value it loaded (compare-and-set in one transaction); a stale edit is refused with both values."""
from __future__ import annotations

import pytest

from annotations.accounts import accounts
from annotations.store.revisions import StaleEdit
from annotations.store.rows import wound_key
from annotations.store.store import Store

KEY = wound_key("im0", 1)


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "t.sqlite")
    s.upsert_patient("p1", {"sex": "F"})
    s.upsert_image("im0", "im0.png", "0" * 64, 10, 10, "p1", {"visit_date": "2026-01-02"})
    s.upsert_wound("im0", 1, 20, [0, 0, 5, 4], "old text", {"size_cm": 2.0, "origin": "drawn"})
    return s


def test_two_sessions_change_different_fields_both_kept(store):
    a, b = store.fields("wounds", KEY), store.fields("wounds", KEY)  # two pages load the same wound
    assert a == {"description": "old text", "outline": {"area": 20, "bbox": [0, 0, 5, 4]},
                 "metadata.size_cm": 2.0, "metadata.origin": "drawn"}
    store.edit("wounds", KEY, a, {"description": "annotator's text"}, actor="annotator")
    assert store.edit("wounds", KEY, b, {"metadata.size_cm": 3.5}, actor="admin") == {"metadata.size_cm": 3.5}
    row = store.wound("im0", 1)
    assert row["description"] == "annotator's text"
    assert row["metadata"] == {"size_cm": 3.5, "origin": "drawn"}
    changes = [(r["actor"], r["field"], r["new"]) for r in store.revisions("wounds", KEY) if r["action"] == "update"]
    assert changes == [("annotator", "description", "annotator's text"),
                       ("admin", "metadata", {"size_cm": 3.5, "origin": "drawn"})]


def test_stale_description_is_refused_with_both_values(store):
    a, b = store.fields("wounds", KEY), store.fields("wounds", KEY)
    store.edit("wounds", KEY, a, {"description": "annotator's text"}, actor="annotator")
    before = store.revisions()
    with pytest.raises(StaleEdit) as caught:
        store.edit("wounds", KEY, b, {"description": "admin's text", "metadata.size_cm": 9.0}, actor="admin")
    assert caught.value.conflicts == {"description": ("annotator's text", "admin's text")}
    assert caught.value.by == "annotator" and not caught.value.gone
    assert "annotator's text" in str(caught.value) and "admin's text" in str(caught.value)
    row = store.wound("im0", 1)
    assert row["description"] == "annotator's text" and row["metadata"]["size_cm"] == 2.0  # nothing written
    assert store.revisions() == before  # history unchanged


def test_saving_a_value_that_is_already_there_writes_nothing(store):
    loaded = store.fields("wounds", KEY)
    assert store.edit("wounds", KEY, loaded, {"description": "old text"}, actor="a") == {}
    assert [r for r in store.revisions("wounds", KEY) if r["action"] == "update"] == []


def test_a_deleted_wound_refuses_the_edit(store):
    loaded = store.fields("wounds", KEY)
    store.delete_wound("im0", 1, actor="other")
    with pytest.raises(StaleEdit) as caught:
        store.edit("wounds", KEY, loaded, {"description": "x"}, actor="me")
    assert caught.value.gone and store.wound("im0", 1) is None


def test_photo_and_patient_metadata_edits_are_checked(store):
    photo, patient = store.fields("images", "im0"), store.fields("patients", "p1")
    store.edit("images", "im0", photo, {"metadata.visit_date": "2026-02-03"}, actor="a")
    with pytest.raises(StaleEdit, match="2026-02-03"):
        store.edit("images", "im0", photo, {"metadata.visit_date": "2026-03-04"}, actor="b")
    store.edit("images", "im0", photo, {"patient_id": None}, actor="b")  # another field: saved
    assert store.image("im0")["metadata"] == {"visit_date": "2026-02-03"} and store.image("im0")["patient_id"] is None
    store.edit("patients", "p1", patient, {"metadata.sex": "M", "metadata.age": 60}, actor="a")
    with pytest.raises(StaleEdit):
        store.edit("patients", "p1", patient, {"metadata.sex": ""}, actor="b")
    assert store.patient("p1")["metadata"] == {"sex": "M", "age": 60}


def test_expecting_guards_other_writers(store):
    """A write through another module (an outline, a track, a role) inside :meth:`Store.expecting`."""
    loaded = store.fields("wounds", KEY)
    store.upsert_wound("im0", 1, 30, [0, 0, 6, 5], "old text", {"size_cm": 2.0}, actor="other")
    with pytest.raises(StaleEdit) as caught, store.expecting("wounds", KEY, {"outline": loaded["outline"]}):
        store.upsert_wound("im0", 1, 40, [0, 0, 7, 6], "old text", {}, actor="me")
    assert caught.value.conflicts["outline"][0] == {"area": 30, "bbox": [0, 0, 6, 5]}
    assert store.wound("im0", 1)["area"] == 30
    accounts.add_account(store, "Ann", "annotator", None, "test", email="ann@example.org")
    role = store.fields("accounts", "Ann")
    assert role == {"role": "annotator", "email": "ann@example.org", "disabled": False}
    accounts.set_role(store, "Ann", "viewer", "admin1")
    with pytest.raises(StaleEdit), store.expecting("accounts", "Ann", {"role": role["role"]}, {"role": "admin"}):
        accounts.set_role(store, "Ann", "admin", "admin2")
    assert store.fields("accounts", "Ann")["role"] == "viewer"


def test_edit_refuses_fields_it_cannot_check_or_write(store):
    loaded = store.fields("wounds", KEY)
    with pytest.raises(ValueError, match="no loaded value"):
        store.edit("wounds", KEY, {}, {"description": "x"}, actor="a")
    with pytest.raises(ValueError, match="not wounds"):
        store.edit("wounds", KEY, loaded, {"outline": {"area": 1, "bbox": [0, 0, 1, 1]}}, actor="a")


def test_the_refusal_names_who_changed_that_field(store):
    loaded = store.fields("wounds", KEY)
    store.edit("wounds", KEY, loaded, {"description": "by the annotator"}, actor="annotator")
    store.edit("wounds", KEY, store.fields("wounds", KEY), {"metadata.size_cm": 1.0}, actor="admin")
    with pytest.raises(StaleEdit) as caught:
        store.edit("wounds", KEY, loaded, {"description": "stale"}, actor="other")
    assert caught.value.by == "annotator"  # the description's last writer, not the row's


def test_the_same_edit_made_in_two_sessions_is_no_conflict(store):
    a, b = store.fields("wounds", KEY), store.fields("wounds", KEY)
    store.edit("wounds", KEY, a, {"description": "same words"}, actor="annotator")
    assert store.edit("wounds", KEY, b, {"description": "same words"}, actor="admin") == {}
    assert [r["actor"] for r in store.revisions("wounds", KEY) if r["action"] == "update"] == ["annotator"]


def test_a_workspace_setting_is_checked_like_a_field(store):
    assert store.fields("meta", "ollama_hosts") == {"value": None}
    store.set_meta("ollama_hosts", ["a"])
    with pytest.raises(StaleEdit), store.expecting("meta", "ollama_hosts", {"value": None}, {"value": ["b"]}):
        store.set_meta("ollama_hosts", ["b"])
    assert store.get_meta("ollama_hosts") == ["a"]
