"""Text from data is shown as text in Chromium (issue 49): a dataset name, a patient id, track ids, a wound
description and an import error holding Markdown images and links, HTML and colour/emoji directives render no
image, link or markup, and the browser asks nothing of any server but the app (fonts and page icon included)."""
from __future__ import annotations

import re
import shutil

import pytest
from conftest import sign_in_as
from playwright.sync_api import expect
from streamlit_page import idle

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from core.phantoms.visits import build_visits
from tests.integration.test_followup_page import split_visits

expect.set_options(timeout=90_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

ADMIN = "Dr Admin"
IMAGE = "![x](http://127.0.0.2/x.png)"
LINK = "[link](http://evil.example/)"
HTML = "<img src=http://127.0.0.2/y.png>"
COLOUR = ":red[x] :smile:"
PAYLOAD = f"{IMAGE} {LINK} {HTML} {COLOUR}"
#: a link (not a heading's own #anchor) or an image made from the data (a colour or emoji made from it would
#: not show its source text, which each check reads)
FROM_DATA = 'a[href*="evil"]:not([href^="#"]), a[href*="127.0.0.2"]:not([href^="#"]), img[src*="127.0.0.2"]'


@pytest.fixture
def server(tmp_path, start_app, add_account):
    build_visits(tmp_path / "visits", visits=2, patients=1, seed=5)
    before, after = split_visits(tmp_path / "visits", tmp_path, "_v02")
    ws = Workspace(tmp_path / "ws")
    import_dataset(ws, before)
    import_dataset(ws, after)
    store = ws.store
    store.set_meta("dataset_name", PAYLOAD)
    store.upsert_patient(PAYLOAD, {})
    for im in store.images():
        store.upsert_image(im["image_id"], im["file"], im["sha256"], im["width"], im["height"], PAYLOAD,
                           im["metadata"])
    for n, w in enumerate(store.wounds(), start=1):
        meta = dict(w["metadata"])
        if meta.get("track_id"):
            meta["track_id"] = f"{(IMAGE, LINK)[n % 2]} T{n}"
        store.upsert_wound(w["image_id"], w["wound_index"], w["area"], w["bbox"], PAYLOAD, meta)
    bad = tmp_path / "bad"
    shutil.copytree(before, bad)
    with (bad / "wounds.csv").open("a", encoding="utf-8") as fh:
        fh.write(f"{store.images()[0]['image_id']},9,x,a,b,{PAYLOAD}\n")  # a 'closed' cell that is no boolean
    add_account(ws.root, ADMIN, "admin")
    store.close()
    return bad, start_app(tmp_path / "ws", tmp_path / "streamlit.log")


def shown(locator) -> str:
    """A locator's text as the reader sees it (word joiners, invisible, left out)."""
    return locator.inner_text().replace("\u2060", "")


def test_text_from_data_renders_no_image_link_or_markup_and_nothing_leaves_the_app(chromium, server):
    bad, app = server
    context = chromium.new_context(viewport={"width": 1440, "height": 1000})
    requests: list[str] = []
    context.on("request", lambda r: requests.append(r.url))
    pg = context.new_page()
    pg.set_default_timeout(120_000)
    sign_in_as(pg, app.url, ADMIN)

    heading = pg.get_by_role("heading", name=re.compile("^Workspace ·"))
    expect(heading).to_be_visible()
    assert PAYLOAD in shown(heading)
    pg.get_by_text("Import a dataset folder or build the demo").click()
    pg.get_by_label("Dataset folder on the server").fill(str(bad))
    pg.get_by_label("Dataset folder on the server").press("Enter")  # commit the path: its rerun could eat the click
    idle(pg, settle_ms=300)
    pg.get_by_role("button", name="Import", exact=True).click()
    error = pg.get_by_text(re.compile("^Nothing imported"))
    expect(error).to_be_visible()
    assert f"'{PAYLOAD}' is not a boolean" in shown(error)
    assert pg.locator(FROM_DATA).count() == 0

    pg.get_by_role("link", name="Wound masks").click()
    expect(pg.get_by_role("heading", name=re.compile("^Wounds of"))).to_be_visible()
    idle(pg, settle_ms=500)
    assert f"patient {PAYLOAD}" in shown(pg.get_by_text(re.compile("px · patient")))
    assert pg.locator(FROM_DATA).count() == 0

    pg.goto(f"{app.url}/Follow_up")  # the Wound masks page keeps its sidebar collapsed
    proposed = pg.get_by_text(re.compile("^Proposed:"))
    expect(proposed).to_be_visible()
    assert re.search(r"Proposed: (!\[x\]\(http://127\.0\.0\.2/x\.png\)|\[link\]\(http://evil\.example/\)) T\d",
                     shown(proposed))
    expect(pg.locator(".js-plotly-plot").first).to_be_visible()
    idle(pg, settle_ms=500)
    assert pg.locator(FROM_DATA).count() == 0
    assert "\u2060" not in pg.locator(".js-plotly-plot").first.inner_text()  # plotly text is escaped as HTML

    outside = [u for u in requests if not u.startswith((app.url, "data:", "blob:"))]
    assert outside == [], outside
    context.close()
