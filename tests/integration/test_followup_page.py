"""The Follow-up page (AppTest, no browser): add a visit's photos, accept the proposed links, see the
area curve and the track's photos, download the follow-up CSV."""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from annotations.accounts import accounts
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from core.phantoms.visits import build_visits, read_truth

REPO = Path(__file__).resolve().parents[2]
PAGE = "pages/9_Follow_up.py"


def split_visits(src: Path, dst: Path, last_visit: str) -> tuple[Path, Path]:
    """The phantom visits as two dataset folders: every visit but ``last_visit`` (with tracks), and
    ``last_visit``'s photos with their tracks left out (a new visit to link)."""
    before, after = dst / "before", dst / "after"
    for out, keep in ((before, lambda i: not i.endswith(last_visit)), (after, lambda i: i.endswith(last_visit))):
        for sub in ("images", "masks"):
            (out / sub).mkdir(parents=True)
            for f in (src / sub).iterdir():
                if keep(f.stem):
                    shutil.copy(f, out / sub / f.name)
        shutil.copy(src / "dataset.json", out / "dataset.json")
        for name in ("images.csv", "wounds.csv", "patients.csv"):
            with (src / name).open(encoding="utf-8") as fh:
                rows = list(csv.reader(fh))
            kept = [rows[0]] + [r for r in rows[1:] if name == "patients.csv" or keep(r[0])]
            if name == "wounds.csv" and out is after:
                kept = [r[:3] + r[4:] for r in kept]  # no track_id: the page proposes them
            with (out / name).open("w", newline="", encoding="utf-8") as fh:
                csv.writer(fh, lineterminator="\n").writerows(kept)
    return before, after


@pytest.fixture
def visit_ws(tmp_path, monkeypatch):
    src = tmp_path / "visits"
    build_visits(src, visits=3, patients=2, seed=5)
    before, after = split_visits(src, tmp_path, "_v03")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, before)
    monkeypatch.setenv("TRIDERM_WORKSPACE", str(ws.root))
    accounts.add_account(ws.store, "Tess", "admin", "correct horse battery", "test")
    truth = {(t["image_id"], t["wound_index"]): t["track_id"] for t in read_truth(src)}
    return ws, after, truth


def page(ws: Workspace) -> AppTest:
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
    found = accounts.get(ws.store, "Tess")
    at.session_state["account"] = found
    at.session_state["_cookie"] = accounts.issue_token(ws.store, accounts.secret_key(ws.root), found)
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception, at.exception
    return at


def test_add_a_visit_accept_links_see_the_curve_and_export(visit_ws):
    ws, after, truth = visit_ws
    at = page(ws)
    at.text_input(key="fu_folder").input(str(after)).run()
    at.button(key="fu_import").click().run()
    assert not at.exception, at.exception
    pending = int(at.subheader[0].value.split("·")[1])
    assert pending == sum(1 for k in truth if k[0].endswith("_v03"))
    for _ in range(pending):
        at.button(key="fu_accept").click().run()
        assert not at.exception, at.exception
    assert "Every wound of a dated photo is on a track" in "\n".join(c.value for c in at.caption)
    linked = {(w["image_id"], w["wound_index"]): w["metadata"].get("track_id") for w in ws.store.wounds()}
    earlier = {t for k, t in truth.items() if not k[0].endswith("_v03")}
    third = [k for k in truth if k[0].endswith("_v03")]
    right = sum(linked[k] == truth[k] if truth[k] in earlier else linked[k] not in earlier for k in third)
    assert None not in {linked[k] for k in third} and right >= len(third) - 1  # new tracks get new ids
    assert at.get("plotly_chart")
    assert at.get("download_button")


def test_the_page_reports_a_marker_that_is_not_the_configured_one(visit_ws):
    ws, _, _ = visit_ws
    ws.store.set_meta("marker", {"dictionary": "DICT_4X4_50", "id": 9, "side_cm": 4.0})
    at = page(ws)
    assert any("is not the configured marker (id 9" in e.value for e in at.error)
