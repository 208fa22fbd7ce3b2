"""Follow-up in Chromium: an admin adds a visit's photos, accepts the proposed track links with the
keyboard, sees the area curve and downloads the follow-up CSV."""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect
from streamlit_page import idle

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from core.phantoms.visits import build_visits
from tests.integration.test_followup_page import split_visits

expect.set_options(timeout=90_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

ADMIN = "Dr Admin"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "screenshots" / "followup.png"


@pytest.fixture
def server(tmp_path, start_app, add_account):
    src = tmp_path / "visits"
    build_visits(src, visits=3, patients=2, seed=5)
    before, after = split_visits(src, tmp_path, "_v03")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, before)
    add_account(ws.root, ADMIN, "admin")
    return ws, after, start_app(ws.root, tmp_path / "streamlit.log")


def test_add_a_visit_accept_links_see_the_curve_export(page, server, sign_in, screenshot, tmp_path):
    ws, after, app = server
    sign_in(page, app.url, ADMIN)
    page.get_by_role("link", name="Follow-up").click()
    expect(page.get_by_text("Links to confirm · 0")).to_be_visible()
    page.get_by_text("Add a visit's photos").click()
    page.get_by_label("Folder on the server").fill(str(after))
    page.get_by_label("Folder on the server").press("Enter")
    idle(page, settle_ms=300)
    page.get_by_role("button", name="Import the visit").click()
    expect(page.get_by_text("Imported")).to_be_visible()
    expect(page.get_by_text("Links to confirm · 0")).not_to_be_visible()
    idle(page, settle_ms=300)
    heading = page.get_by_text("Links to confirm ·")
    pending = int(heading.inner_text().split("·")[1])
    assert pending > 0
    for left in range(pending - 1, -1, -1):
        expect(page.get_by_role("button", name="Accept")).to_be_visible()
        page.locator("body").press("a")  # the keyboard, as on the Triplets page
        expect(page.get_by_text(f"Links to confirm · {left}")).to_be_visible()
        idle(page, settle_ms=300)
    linked = [w for w in ws.store.wounds() if w["image_id"].endswith("_v03")]
    assert all(w["metadata"].get("track_id") for w in linked)
    expect(page.locator(".js-plotly-plot").first).to_be_visible()
    with page.expect_download() as info:
        page.get_by_role("button", name="Download the follow-up CSV").click()
    path = tmp_path / "followup.csv"
    info.value.save_as(path)
    with path.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0])[:9] == ["patient", "track", "visit_date", "area_cm2", "length_cm", "width_cm", "closed",
                                 "measured_by", "method"]
    assert {r["measured_by"] for r in rows} >= {"import"} and any(r["visit_date"] for r in rows)
    shot = screenshot(page, "followup")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, SCREENSHOT)
