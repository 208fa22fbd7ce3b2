"""Second reading in Chromium: an admin marks a photo, two annotators outline it blind into their own
layers, and the admin's Review page shows their Dice beside the triplet κ; annotators never see it."""
from __future__ import annotations

import re

import pytest
from PIL import Image
from playwright.sync_api import expect
from streamlit_page import idle
from wound_photos import draw, tool, wound_photo

from annotations.followup import readings
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

expect.set_options(timeout=60_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

ADMIN, READER_A, READER_B = "Dr Admin", "Dr Ames", "Dr Bell"
# A reads wound 1 as the square x 60–140, y 60–130 (80×70 = 5,600 px); B as x 80–160 (5,600 px, 4,200
# shared): Dice = 2·4,200 / 11,200 = 0.75
SQUARE_A = [(60, 60), (140, 60), (140, 130), (60, 130)]
SQUARE_B = [(80, 60), (160, 60), (160, 130), (80, 130)]
TRIPLETS = [("leg-01", "leg-02", "leg-03"), ("leg-02", "leg-01", "leg-03"), ("leg-03", "leg-01", "leg-02")]


@pytest.fixture
def server(tmp_path, start_app, add_account):
    """leg-01 with two stored wounds, leg-02 and leg-03 without; an admin and two annotators who answered
    the same three triplets."""
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "masks").mkdir()
    img, labels = wound_photo(0, [(60, 60, 140, 130), (190, 110, 270, 190)])
    Image.fromarray(img).save(data / "images" / "leg-01.png")
    Image.fromarray(labels).save(data / "masks" / "leg-01.png")
    for n, image_id in enumerate(("leg-02", "leg-03"), start=1):
        Image.fromarray(wound_photo(n, [(100, 70, 200, 160)])[0]).save(data / "images" / f"{image_id}.png")
    (data / "wounds.csv").write_text("image_id,wound_index,description\nleg-01,1,fibrin\nleg-01,2,\n")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, data)
    add_account(ws.root, ADMIN, "admin")
    for name, choices in ((READER_A, "jjk"), (READER_B, "jkk")):  # shared triplets, so that κ has a pair too
        add_account(ws.root, name, "annotator")
        for (anchor, ref_j, ref_k), choice in zip(TRIPLETS, choices):
            ws.store.add_triplet(anchor, ref_j, ref_k, choice, f"expert:{name}")
    return ws, start_app(ws.root, tmp_path / "streamlit.log")


def draw_and_save(pg, points: list[tuple[int, int]]) -> None:
    """Draw the closed outline ``points`` (each vertex awaited), then Save outline."""
    draw(pg, points)
    tool(pg, "Save outline").click()


def read_blind(chromium, url: str, sign_in, ws: Workspace, name: str, square: list[tuple[int, int]],
               extra: bool = False, shot=None) -> None:
    """Sign in as ``name``, open the marked photo: no outline is shown; draw ``square`` and save it.
    ``extra``: also an overlapping outline (refused) and a second wound, deleted again; ``shot``: the
    screenshot fixture, to keep the reader's page (docs/screenshots/second_reading.png)."""
    context = chromium.new_context(viewport={"width": 1440, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(120_000)
    sign_in(pg, url, name)
    idle(pg, settle_ms=300)
    pg.get_by_role("link", name="Wound masks").click()
    expect(pg.get_by_role("heading", name="Your reading of leg-01")).to_be_visible()
    expect(pg.get_by_text("Second reading", exact=False).first).to_be_visible()
    expect(pg.locator(".oe svg image")).to_be_attached()
    idle(pg, settle_ms=300)
    # blind: neither the stored outline (two wounds) nor the other reader's outline is drawn
    expect(pg.locator(".oe path.shape")).to_have_count(0)
    draw_and_save(pg, square)
    expect(pg.get_by_text("Saved wound 1 of your reading of leg-01.")).to_be_visible()
    idle(pg, settle_ms=300)
    expect(pg.locator(".oe path.shape")).to_have_count(1)
    if extra:
        before = readings.readings(ws)
        draw_and_save(pg, [(120, 100), (180, 100), (180, 150), (120, 150)])
        expect(pg.get_by_text(re.compile(r"overlaps wound\(s\) 1 of your reading.*Nothing was saved"))).to_be_visible()
        idle(pg, settle_ms=300)
        assert readings.readings(ws) == before
        pg.keyboard.press("Escape")
        draw_and_save(pg, [(200, 160), (240, 160), (240, 200), (200, 200)])
        expect(pg.get_by_text("Saved wound 2 of your reading of leg-01.")).to_be_visible()
        idle(pg, settle_ms=300)
        expect(pg.locator(".oe path.shape")).to_have_count(2)
        pg.get_by_role("button", name="Delete wound 2").click()
        expect(pg.get_by_text("Deleted wound 2 of your reading of leg-01.")).to_be_visible()
        idle(pg, settle_ms=300)
        expect(pg.locator(".oe path.shape")).to_have_count(1)
    assert pg.get_by_text(re.compile("Dice|agreement", re.IGNORECASE)).count() == 0  # no score on their page
    if shot is not None:
        shot(pg, "second_reading")
    pg.goto(f"{url}/Review")  # nor by URL
    expect(pg.get_by_text("Review is only for admins")).to_be_visible()
    assert pg.get_by_text(re.compile("Dice")).count() == 0
    context.close()


def test_two_blind_readings_and_their_dice_on_the_review_page(server, chromium, sign_in, screenshot):
    ws, app = server
    truth, wounds = ws.load_mask("leg-01").copy(), ws.store.wounds("leg-01")
    admin = chromium.new_context(viewport={"width": 1440, "height": 1000})
    pg = admin.new_page()
    pg.set_default_timeout(120_000)
    sign_in(pg, app.url, ADMIN)
    idle(pg, settle_ms=300)
    pg.get_by_role("link", name="Review").click()
    expect(pg.get_by_role("heading", name="Review")).to_be_visible()
    idle(pg, settle_ms=300)
    pg.get_by_role("tab", name="Second reading", exact=True).click()
    pg.get_by_test_id("stMultiSelect").filter(has_text="Photos for second reading").click()
    pg.get_by_role("option", name="leg-01", exact=True).click()
    pg.keyboard.press("Escape")
    pg.get_by_role("button", name="Save marks").click()
    idle(pg, settle_ms=300)
    assert readings.marked(ws) == ["leg-01"]

    # the admin sees the stored outline of the marked photo, and reads it blind only when asking to
    pg.get_by_role("link", name="Wound masks").click()
    expect(pg.get_by_role("heading", name="Wounds of leg-01")).to_be_visible()
    expect(pg.locator('.oe path.shape[data-key="w1"]')).to_have_count(1)
    idle(pg, settle_ms=300)
    pg.get_by_text("My second reading of this photo").click()
    expect(pg.get_by_role("heading", name="Your reading of leg-01")).to_be_visible()
    expect(pg.locator(".oe path.shape")).to_have_count(0)

    read_blind(chromium, app.url, sign_in, ws, READER_A, SQUARE_A, extra=True)
    read_blind(chromium, app.url, sign_in, ws, READER_B, SQUARE_B, shot=screenshot)
    a, b = (readings.load_layer(ws, "leg-01", n) for n in (READER_A, READER_B))
    assert int((a == 1).sum()) == 5600 and int((b == 1).sum()) == 5600 and int(((a > 0) & (b > 0)).sum()) == 4200
    assert (ws.load_mask("leg-01") == truth).all() and ws.store.wounds("leg-01") == wounds  # the truth untouched
    assert {r["actor"] for r in ws.store.revisions("readings")} == {READER_A, READER_B}

    pg.get_by_test_id("stExpandSidebarButton").click()  # the editor keeps the sidebar collapsed (screen width)
    pg.get_by_role("link", name="Review").click()
    expect(pg.get_by_role("heading", name="Review")).to_be_visible()
    idle(pg, settle_ms=300)
    pg.get_by_role("tab", name="Agreement", exact=True).click()
    expect(pg.get_by_text(re.compile(r"Cohen's κ between annotators.* mean κ = "))).to_be_visible()  # the triplet κ …
    expect(pg.get_by_text("mean Dice = 0.750")).to_be_visible()  # … beside the outline Dice
    expect(pg.get_by_text("Outline agreement per photo")).to_be_visible()
    # κ pairs, Dice pairs, Dice per photo, self-consistency (canvas grids: their cells are not in the DOM)
    expect(pg.get_by_role("tabpanel", name="Agreement").get_by_test_id("stDataFrame")).to_have_count(4)
    panel = pg.get_by_role("tabpanel", name="Agreement")  # the photo with the stored outline and each reading
    expect(panel.get_by_test_id("stImage")).to_have_count(3)
    for caption in ("stored outline", READER_A, READER_B):
        expect(panel.get_by_test_id("stImageCaption").filter(has_text=caption)).to_be_visible()
    (pair,) = readings.agreement(ws)["pairs"]
    assert (pair["a"], pair["b"], pair["n"]) == (READER_A, READER_B, 1) and pair["mean"] == pytest.approx(0.75)
    screenshot(pg, "review_agreement")
    admin.close()
