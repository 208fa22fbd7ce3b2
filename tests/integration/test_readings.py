"""Second reading: per-annotator layers beside the stored truth, their guards, and Dice agreement."""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from annotations.accounts.privacy import erase_patient
from annotations.followup import readings
from annotations.followup.readings import ReadingError
from annotations.infra.workspace import Workspace

H, W = 20, 30


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """Two 30×20 photos of one patient; p1 has one stored wound (rows 2–5, cols 2–9)."""
    ws = Workspace(tmp_path / "ws")
    ws.store.upsert_patient("pat")
    for image_id in ("p1", "p2"):
        path = ws.images_dir / f"{image_id}.png"
        Image.new("RGB", (W, H), (200, 160, 150)).save(path)
        ws.store.upsert_image(image_id, path.name, hashlib.sha256(path.read_bytes()).hexdigest(), W, H,
                              patient_id="pat")
    truth = np.zeros((H, W), np.int32)
    truth[2:6, 2:10] = 1
    ws.save_mask("p1", truth)
    ws.store.upsert_wound("p1", 1, 32, [2, 2, 10, 6])
    ws.store.set_meta("min_wound_area", 4)
    return ws


def box(r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    m = np.zeros((H, W), bool)
    m[r0:r1, c0:c1] = True
    return m


def test_dice_hand_computed() -> None:
    a, b = box(0, 4, 0, 10), box(0, 4, 4, 14)  # 40 px each, 24 shared: 2·24/80
    assert readings.dice(a, b) == pytest.approx(0.6)
    assert readings.dice(a, a) == 1.0
    assert readings.dice(a, box(10, 14, 20, 30)) == 0.0
    assert readings.dice(np.zeros((H, W)), np.zeros((H, W))) == 1.0  # both saw no wound
    with pytest.raises(ValueError, match="differ in shape"):
        readings.dice(a, a[:5])


def test_layers_are_per_reader_and_leave_the_truth_alone(ws: Workspace) -> None:
    truth_before = ws.load_mask("p1").copy()
    wounds_before = ws.store.wounds("p1")
    assert readings.mark(ws, "p1", "Admin") is True and readings.mark(ws, "p1", "Admin") is False
    assert readings.marked(ws) == ["p1"]

    assert readings.add_wound(ws, "p1", box(2, 6, 2, 10), reader="Dr A", actor="Dr A") == 1
    assert readings.add_wound(ws, "p1", box(10, 14, 20, 25), reader="Dr A", actor="dr a") == 2  # names ignore case
    assert readings.add_wound(ws, "p1", box(2, 6, 6, 14), reader="Dr B", actor="Dr B") == 1

    a, b = readings.load_layer(ws, "p1", "DR A"), readings.load_layer(ws, "p1", "Dr B")
    assert int((a == 1).sum()) == 32 and int((a == 2).sum()) == 20 and int((b == 1).sum()) == 32
    assert (readings.load_layer(ws, "p1", "Dr C") == 0).all()  # not read: an empty layer
    rows = {r["reader"]: r for r in readings.readings(ws, "p1")}
    assert set(rows) == {"Dr A", "Dr B"} and rows["Dr A"]["wounds"] == 2 and rows["Dr A"]["area"] == 52
    assert rows["Dr A"]["file"] != rows["Dr B"]["file"]
    assert (readings.readings_dir(ws) / rows["Dr A"]["file"]).is_file()
    assert (ws.load_mask("p1") == truth_before).all() and ws.store.wounds("p1") == wounds_before

    # each change is one revision with its actor; redrawing wound 1 is an update holding the old outline
    readings.add_wound(ws, "p1", box(2, 7, 2, 10), wound_index=1, reader="Dr A", actor="Dr A")
    revs = ws.store.revisions("readings", {"image_id": "p1", "reader": "Dr A"})
    assert [(r["action"], r["actor"]) for r in revs] == [("insert", "Dr A"), ("update", "dr a"), ("update", "Dr A")]
    assert revs[-1]["old"]["1"]["area"] == 32 and revs[-1]["new"]["1"]["area"] == 40
    readings.delete_wound(ws, "p1", 2, reader="Dr A", actor="Dr A")
    assert set(np.unique(readings.load_layer(ws, "p1", "Dr A"))) == {0, 1}
    assert [r["actor"] for r in ws.store.revisions("reading_photos", "p1")] == ["Admin"]


def snapshot(ws: Workspace) -> tuple:
    files = sorted((p.relative_to(ws.root), p.read_bytes()) for p in readings.readings_dir(ws).rglob("*.png"))
    return readings.readings(ws), len(ws.store.revisions()), files, readings.marked(ws)


def test_bad_input_changes_nothing(ws: Workspace) -> None:
    readings.mark(ws, "p1", "Admin")
    readings.add_wound(ws, "p1", box(2, 6, 2, 10), reader="Dr A", actor="Dr A")
    before = snapshot(ws)
    cases = [
        (lambda: readings.add_wound(ws, "p2", box(2, 6, 2, 10), reader="Dr A", actor="Dr A"),
         r"Photo p2 is not marked for second reading .*Nothing was saved"),
        (lambda: readings.add_wound(ws, "p1", box(8, 12, 2, 10), reader="Dr A", actor="Dr B"),
         r"Dr B cannot change Dr A's reading of p1: each annotator outlines only into their own layer"),
        (lambda: readings.save_layer(ws, "p1", np.zeros((H, W), np.int32), reader="Dr A", actor="Dr B"),
         r"Dr B cannot change Dr A's reading"),
        (lambda: readings.delete_wound(ws, "p1", 1, reader="Dr A", actor="Dr B"), r"Dr B cannot change"),
        (lambda: readings.add_wound(ws, "p1", box(2, 3, 20, 22), reader="Dr A", actor="Dr A"),
         r"covers 2 px, less than this workspace's minimum wound area of 4 px"),
        (lambda: readings.add_wound(ws, "p1", box(4, 8, 8, 12), reader="Dr A", actor="Dr A"),
         r"overlaps wound\(s\) 1 of your reading"),
        (lambda: readings.add_wound(ws, "p1", box(10, 14, 10, 14), wound_index=5, reader="Dr A", actor="Dr A"),
         r"Your reading of p1 has no wound 5"),
        (lambda: readings.save_layer(ws, "p1", np.zeros((5, 5), np.int32), reader="Dr A", actor="Dr A"),
         r"The reading is \(5, 5\) px, photo p1 is 30×20 px"),
        (lambda: readings.save_layer(ws, "p1", np.full((H, W), -1), reader="Dr A", actor="Dr A"),
         r"label map of whole numbers"),
        (lambda: readings.mark(ws, "nope", "Admin"), r"Unknown photo 'nope'"),
    ]
    for call, message in cases:
        with pytest.raises(ReadingError, match=message):
            call()
        assert snapshot(ws) == before, message
    # a closed reading is kept (and counts) but no longer changes
    assert readings.unmark(ws, "p1", "Admin") is True and readings.unmark(ws, "p1", "Admin") is False
    with pytest.raises(ReadingError, match="Photo p1 is not marked"):
        readings.delete_wound(ws, "p1", 1, reader="Dr A", actor="Dr A")
    assert readings.readings(ws, "p1") == before[0]


def test_agreement_per_pair_per_photo_and_mean(ws: Workspace) -> None:
    for image_id in ("p1", "p2"):
        readings.mark(ws, image_id, "Admin")
    # p1: A = rows 2–5 × cols 2–9 (32 px, the stored wound), B = cols 6–13 (32 px, 16 shared) → 0.5;
    #     C = two wounds, union = A's pixels → A–C 1.0, B–C 0.5
    readings.add_wound(ws, "p1", box(2, 6, 2, 10), reader="A", actor="A")
    readings.add_wound(ws, "p1", box(2, 6, 6, 14), reader="B", actor="B")
    readings.add_wound(ws, "p1", box(2, 6, 2, 6), reader="C", actor="C")
    readings.add_wound(ws, "p1", box(2, 6, 6, 10), reader="C", actor="C")
    # p2: A = 40 px, B = 40 px with 24 shared → 0.6; C did not read p2
    readings.add_wound(ws, "p2", box(0, 4, 0, 10), reader="A", actor="A")
    readings.add_wound(ws, "p2", box(0, 4, 4, 14), reader="B", actor="B")

    result = readings.agreement(ws)
    p1, p2 = result["photos"]
    assert p1["image_id"] == "p1" and p1["readers"] == ["A", "B", "C"]
    assert {(p["a"], p["b"]): p["dice"] for p in p1["pairs"]} == pytest.approx(
        {("A", "B"): 0.5, ("A", "C"): 1.0, ("B", "C"): 0.5})
    assert p1["mean"] == pytest.approx(2 / 3)
    assert p1["vs_stored"] == pytest.approx({"A": 1.0, "B": 0.5, "C": 1.0})
    assert p2["pairs"] == [{"a": "A", "b": "B", "dice": pytest.approx(0.6)}] and p2["vs_stored"] == {}
    assert [(p["a"], p["b"], p["n"]) for p in result["pairs"]] == [("A", "B", 2), ("A", "C", 1), ("B", "C", 1)]
    assert [v for p in result["pairs"] for v in (p["mean"], p["min"])] == pytest.approx([0.55, 0.5, 1, 1, 0.5, 0.5])
    assert result["mean"] == pytest.approx((2 / 3 + 0.6) / 2)

    # an excluded annotator (any case) is left out of every figure; one reader left is no pair
    without_b = readings.agreement(ws, exclude={"b"})
    assert [p["image_id"] for p in without_b["photos"]] == ["p1"]
    assert [(p["a"], p["b"]) for p in without_b["pairs"]] == [("A", "C")] and without_b["mean"] == 1.0
    assert math.isnan(readings.agreement(ws, exclude={"A", "B"})["mean"])


def test_erasing_a_patient_removes_the_readings(ws: Workspace) -> None:
    readings.mark(ws, "p1", "Admin")
    readings.add_wound(ws, "p1", box(2, 6, 2, 10), reader="A", actor="A")
    layer = readings.readings_dir(ws) / readings.readings(ws)[0]["file"]
    assert layer.is_file()
    erase_patient(ws, "pat")
    assert readings.readings(ws) == [] and readings.marked(ws) == []
    assert not layer.exists() and not layer.parent.exists()
    assert ws.store.revisions("readings") == [] and ws.store.revisions("reading_photos") == []


def test_backup_and_restore_keep_the_readings(ws: Workspace, tmp_path: Path) -> None:
    from annotations.infra.backup import backup, restore

    readings.mark(ws, "p1", "Admin")
    readings.add_wound(ws, "p1", box(2, 6, 2, 10), reader="A", actor="A")
    backup(ws, tmp_path / "copy")
    restore(tmp_path / "copy", tmp_path / "restored")
    again = Workspace(tmp_path / "restored")
    assert readings.marked(again) == ["p1"] and [r["reader"] for r in readings.readings(again)] == ["A"]
    assert (readings.load_layer(again, "p1", "A") == readings.load_layer(ws, "p1", "A")).all()


def review_page(ws: Workspace, monkeypatch, name: str, role: str):
    """The Review page (AppTest, no browser) signed in as ``name`` with ``role``."""
    from streamlit.testing.v1 import AppTest

    from annotations.accounts import accounts

    monkeypatch.setenv("TRIDERM_WORKSPACE", str(ws.root))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=60)
    at.session_state["account"] = (accounts.get(ws.store, name)
                                   or accounts.add_account(ws.store, name, role, "correct horse battery", "test"))
    at.session_state["_cookie"] = accounts.issue_token(ws.store, accounts.secret_key(ws.root),
                                                       at.session_state["account"])
    at.run()
    at.switch_page("pages/7_Review.py").run()
    assert not at.exception, at.exception
    return at


def test_review_page_marks_photos_and_shows_dice_to_admins_only(ws: Workspace, monkeypatch) -> None:
    at = review_page(ws, monkeypatch, "Ada", "admin")
    at.multiselect(key="reading_photos").set_value(["p2"])  # inside the form: sent with its submit button
    at.button(key="reading_save").click().run()
    assert readings.marked(ws) == ["p2"]
    assert [r["actor"] for r in ws.store.revisions("reading_photos", "p2")] == ["Ada"]
    readings.add_wound(ws, "p2", box(0, 4, 0, 10), reader="A", actor="A")
    readings.add_wound(ws, "p2", box(0, 4, 4, 14), reader="B", actor="B")
    at.run()
    shown = "\n".join(m.value for m in at.markdown)
    assert "mean Dice = 0.600" in shown
    frames = [f.value for f in at.dataframe]
    pair = next(f for f in frames if "lowest Dice" in f.columns)
    assert pair[["annotator A", "annotator B", "photos"]].values.tolist() == [["A", "B", 1]]
    assert pair["mean Dice"].tolist() == [0.6]
    photo = next(f for f in frames if "vs stored" in f.columns)
    assert photo[["photo", "pairs", "vs stored"]].values.tolist() == [["p2", "A–B 0.600", "no stored outline"]]

    annotator = review_page(ws, monkeypatch, "A", "annotator")
    assert any("is only for" in e.value for e in annotator.error)
    assert not annotator.dataframe and "Dice" not in "\n".join(m.value for m in annotator.markdown)


# -- the Review page's tables (UI-free) -----------------------------------------------------------------
def test_review_tables_annotators_photos_and_audit_rows():
    from annotations.followup.readings import photo_rows
    from annotations.scheduling.consistency import annotator_rows
    from annotations.store.history import audit_rows, readable

    progress = {"ann": {"answered": 10, "skips": 2, "repeats": 3, "median_ms": 1234.0, "last": "2026-01-02T03:04:05"}}
    rows = annotator_rows(["ann", "test"], progress, {"ann": {"rate": 2 / 3}}, {"ann": "annotator"}, {"test": {}})
    assert rows[0] == {"annotator": "ann", "account": "annotator", "judgments": 10, "skips": 2, "planned repeats": 3,
                       "self-consistency": 0.667, "median seconds": 1.2, "last answer": "2026-01-02 03:04",
                       "in evaluation": True}
    assert rows[1]["account"] == "no account (free-text name)" and rows[1]["self-consistency"] is None
    assert rows[1]["median seconds"] is None and rows[1]["in evaluation"] is False

    photos = [{"image_id": "b", "readers": ["x", "y"], "mean": 0.9, "pairs": [{"a": "x", "b": "y", "dice": 0.9}],
               "vs_stored": {"y": 0.8, "x": 0.95}},
              {"image_id": "a", "readers": ["x"], "mean": math.nan, "pairs": [], "vs_stored": {}}]
    first = next(r for r in photo_rows(photos) if r["photo"] == "b")
    assert first == {"photo": "b", "readers": "x, y", "mean Dice": 0.9, "pairs": "x–y 0.900",
                     "vs stored": "x 0.950; y 0.800"}
    assert next(r for r in photo_rows(photos) if r["photo"] == "a")["vs stored"] == "no stored outline"

    assert readable({"site": "leg", "size_cm": None, "tags": ["a", "b"]}) == "site: leg · tags: a, b"
    assert readable(None) == readable("") == "—" and readable("x" * 200, limit=10) == "x" * 9 + "…"
    revisions = [{"created": f"2026-01-0{i}T10:00:00.123", "actor": "ann", "entity": "wounds", "key": {"wound": i},
                  "field": "description", "action": "update", "old": "", "new": f"text {i}"} for i in range(1, 5)]
    table = audit_rows(revisions, last=3)
    assert [r["new"] for r in table] == ["text 4", "text 3", "text 2"]
    assert table[0] == {"when": "2026-01-04 10:00:00", "account": "ann", "entity": "wounds", "row": "wound: 4",
                        "field": "description", "action": "update", "old": "—", "new": "text 4"}
