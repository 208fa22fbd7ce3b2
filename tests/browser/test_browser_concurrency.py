"""Two people on the same wound in Chromium (issue 49): an annotator describes it while an admin's page, opened
before, changes only its size — the description stays; the admin then edits the description from that stale
page and is refused, with both texts shown and nothing overwritten."""
from __future__ import annotations

import pytest
from conftest import PASSWORD
from playwright.sync_api import expect
from wound_photos import open_wound_masks, settled

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

expect.set_options(timeout=90_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

ANNOTATOR, ADMIN = "Dr Annot", "Dr Admin"
THEIRS, MINE = "Annotator: fibrin at 6 o'clock, dry edge", "Admin: clean granulation"


@pytest.fixture
def server(demo_dataset, tmp_path, start_app, add_account):
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, demo_dataset)
    photo = ws.store.images()[0]["image_id"]
    index = ws.store.wounds(photo)[0]["wound_index"]
    ws.store.close()
    add_account(tmp_path / "ws", ANNOTATOR, "annotator")
    add_account(tmp_path / "ws", ADMIN, "admin")
    return tmp_path / "ws", photo, index, start_app(tmp_path / "ws", tmp_path / "streamlit.log")


def leave(pg, what: str, field, text: str) -> None:
    """Type ``text`` into ``field`` and leave it (which saves it), waiting for the run that follows."""
    with settled(pg, what):
        field.fill(text)
        pg.get_by_role("heading", name="Wound masks").click()


def test_a_stale_admin_page_keeps_the_annotators_description_and_refuses_a_stale_edit(chromium, server):
    root, photo, index, app = server
    base = f"{photo}_{index}"
    pages = []
    for _ in range(2):
        context = chromium.new_context(viewport={"width": 1440, "height": 1000})
        pages.append(context.new_page())
        pages[-1].set_default_timeout(120_000)
    annotator, admin = pages
    open_wound_masks(admin, app.url, ADMIN, PASSWORD, photo)  # the admin's page loads the wound first
    open_wound_masks(annotator, app.url, ANNOTATOR, PASSWORD, photo)
    before = Workspace(root).store.wound(photo, index)

    leave(annotator, "the annotator's description", annotator.locator(f".st-key-desc_{base} textarea"), THEIRS)
    assert Workspace(root).store.wound(photo, index)["description"] == THEIRS
    leave(admin, "the admin's size", admin.locator(f".st-key-meta_size_cm_{base} input"), "4.5")
    wound = Workspace(root).store.wound(photo, index)
    assert wound["description"] == THEIRS  # the admin's stale copy did not revert it
    assert wound["metadata"]["size_cm"] == 4.5 and before["metadata"].get("size_cm") != 4.5
    expect(admin.get_by_text("Not saved")).to_have_count(0)

    revisions = Workspace(root).store.revisions()
    leave(admin, "the admin's stale description", admin.locator(f".st-key-desc_{base} textarea"), MINE)
    expect(admin.get_by_text(f"Not saved: {ANNOTATOR}")).to_be_visible()
    expect(admin.get_by_text(f"Theirs: {THEIRS}")).to_be_visible()
    expect(admin.get_by_text(f"Yours: {MINE}")).to_be_visible()
    expect(admin.locator(f".st-key-desc_{base} textarea")).to_have_value(MINE)  # the admin's input is kept
    assert Workspace(root).store.wound(photo, index)["description"] == THEIRS
    assert Workspace(root).store.revisions() == revisions
    for pg in pages:
        pg.context.close()
