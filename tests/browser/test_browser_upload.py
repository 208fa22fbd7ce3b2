"""Photo upload in Chromium on a 1366×768 laptop screen: an annotator uploads a known patient's new visit
through the file chooser (one broken file first: nothing stored, the file named), then sees the photos in
the workspace (Home's counts and the Wound masks page's photo list), goes to the first uploaded photo by the
worklist's "Next not outlined", outlines a wound on it, deletes it after the confirmation and restores it by
Undo (issue 54: upload → outline via the worklist → delete → undo)."""
from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect
from streamlit_page import idle
from wound_photos import choose_photo, draw, settled, tool, watch_runs

from annotations.infra.workspace import Workspace
from annotations.io.upload import upload_photos
from tests.integration.test_upload import NURSE, jpeg, png16

expect.set_options(timeout=90_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]
LAPTOP = {"width": 1366, "height": 768}


@pytest.fixture
def server(tmp_path, start_app, add_account):
    """A clinic's workspace: patient P-3's first visit (one photo), an annotator account."""
    ws = Workspace(tmp_path / "ws")
    upload_photos(ws, [("p3-visit1.jpg", jpeg())], "P-3", "2024-03-01", account=NURSE)
    add_account(ws.root, "Nurse Kim", "annotator")
    return ws, start_app(ws.root, tmp_path / "streamlit.log")


def choose(pg, files: list[Path]) -> None:
    """Open the Upload expander (when closed), put ``files`` in its chooser and pick patient P-3."""
    dropzone = pg.get_by_test_id("stFileUploaderDropzone")
    if not dropzone.is_visible():
        pg.get_by_text("Upload photos", exact=True).click()
        expect(dropzone).to_be_visible()
    pg.get_by_test_id("stFileUploader").locator("input[type='file']").set_input_files([str(f) for f in files])
    for f in files:
        expect(pg.get_by_text(f.name, exact=True)).to_be_visible()  # listed under the chooser: uploaded
    patient = pg.get_by_role("combobox", name="Patient")
    for _ in range(3):  # CI, loaded: the open list lost its options once and never showed them again (a late
        patient.click()  # rerun redrew the box); an annotator would open it again, so the test does too
        patient.fill("")
        patient.press_sequentially("P-")  # the known patients show as one types
        try:
            pg.get_by_role("option", name="P-3", exact=True).click(timeout=30_000)
            break
        except PlaywrightTimeoutError:
            pg.keyboard.press("Escape")
    expect(patient).to_have_value("P-3")


def test_an_annotator_uploads_a_visit_in_the_browser(server, chromium, sign_in, screenshot, tmp_path):
    ws, app = server
    files = {"p3-visit2-a.jpg": jpeg(6), "p3-visit2-b.jpg": jpeg(), "p3-visit2-c.png": png16(),
             "broken.jpg": b"\xff\xd8 not a photo"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    context = chromium.new_context(viewport=LAPTOP)
    pg = context.new_page()
    pg.set_default_timeout(120_000)  # as the page fixture: a first render on 2 shared, loaded cores
    watch_runs(pg)
    sign_in(pg, app.url, "Nurse Kim")
    idle(pg)

    choose(pg, [tmp_path / n for n in ("p3-visit2-a.jpg", "broken.jpg")])
    pg.get_by_role("button", name="Upload the visit").click()
    expect(pg.get_by_text("Nothing uploaded: broken.jpg: cannot be read as a JPEG image")).to_be_visible()
    assert [i["image_id"] for i in ws.store.images()] == ["p3-visit1"]
    pg.reload()  # a new session: the chooser empty again
    expect(pg.get_by_text("Signed in as").first).to_be_visible()
    idle(pg)

    chosen = [tmp_path / n for n in ("p3-visit2-a.jpg", "p3-visit2-b.jpg", "p3-visit2-c.png")]
    choose(pg, chosen)
    screenshot(pg, "upload_1366x768")
    pg.get_by_role("button", name="Upload the visit").click()
    expect(pg.get_by_text(f"Uploaded 3 photo(s) of patient P-3 dated {date.today().isoformat()} (a known patient; "
                          "earlier visits 2024-03-01)")).to_be_visible()
    idle(pg)
    metrics = {m.get_by_test_id("stMetricLabel").inner_text(): m.get_by_test_id("stMetricValue").inner_text()
               for m in pg.get_by_test_id("stMetric").all()}
    assert (metrics["Photos"], metrics["Patients"]) == ("4", "1")
    rows = {i["image_id"]: i for i in ws.store.images()}
    assert {i: (r["patient_id"], r["metadata"]["visit_date"]) for i, r in rows.items() if "visit2" in i} == {
        f.stem: ("P-3", date.today().isoformat()) for f in chosen}
    assert (rows["p3-visit2-a"]["width"], rows["p3-visit2-a"]["height"]) == (40, 60)  # upright

    with settled(pg, "opening Wound masks"):
        pg.get_by_role("link", name="Outline the wounds: Wound masks").click()
        expect(pg.locator(".oe svg image")).to_be_attached()
    pg.get_by_role("combobox", name="Photo").click()
    for f in chosen:
        expect(pg.get_by_role("option", name=f.stem, exact=True)).to_be_visible()
    pg.keyboard.press("Escape")

    # the worklist goes to the first uploaded photo of the new visit; an outline drawn, deleted, undone
    choose_photo(pg, "p3-visit1")
    with settled(pg, "Next not outlined"):
        pg.get_by_role("button", name="Next not outlined").click()
        expect(pg.get_by_role("heading", name="Wounds of p3-visit2-a")).to_be_visible()
    draw(pg, [(8, 10), (32, 10), (32, 50), (8, 50)])  # the upright 40×60 photo
    with settled(pg, "saving the outline"):
        tool(pg, "Save outline").click()
        expect(pg.get_by_text("Saved wound 1 of p3-visit2-a (drawn)")).to_be_visible()
    saved, mask = ws.store.wound("p3-visit2-a", 1), ws.load_mask("p3-visit2-a").copy()
    with settled(pg, "asking to delete wound 1"):
        pg.get_by_role("button", name="Delete wound 1").click()
        expect(pg.get_by_text("Delete wound 1: its outline, description and metadata?")).to_be_visible()
    with settled(pg, "confirming the deletion"):
        pg.get_by_role("button", name="Yes, delete wound 1").click()
        expect(pg.get_by_text("Deleted wound 1 of p3-visit2-a")).to_be_visible()
    assert ws.store.wound("p3-visit2-a", 1) is None
    with settled(pg, "undoing the deletion"):
        pg.get_by_role("button", name="Undo delete of wound 1").click()
        expect(pg.get_by_text("Restored wound 1 of p3-visit2-a")).to_be_visible()
    restored = ws.store.wound("p3-visit2-a", 1)
    assert {k: restored[k] for k in ("area", "bbox")} == {k: saved[k] for k in ("area", "bbox")} and saved["area"] > 0
    assert (ws.load_mask("p3-visit2-a") == mask).all()
    context.close()
