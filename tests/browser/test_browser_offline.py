"""No request leaves the loopback (issue 54): on a 1366×768 window Chromium signs in, opens every page of the
demo workspace, answers a triplet, zooms a photo and asks to delete a wound, and every request it made (the
pages', their components' frames', their WebSockets) went to the app's own server. The server runs with the
shipped ``.streamlit/config.toml`` alone (no usage-statistics flag), and the same recorder, on a server whose
usage statistics are switched on, does catch Streamlit's request to its metrics host: the check can fail."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import AppServer
from playwright.sync_api import expect
from streamlit_page import idle

from annotations.infra.workspace import Workspace
from app.navigation import PAGES

expect.set_options(timeout=60_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAPTOP = {"width": 1366, "height": 768}
LOCAL = {"127.0.0.1", "localhost"}
#: The shipped settings only: no ``--browser.gatherUsageStats`` here, so the config file must turn it off.
SHIPPED = ("--server.headless", "true")


def leaving(urls: list[str]) -> list[str]:
    """The recorded URLs whose host is not the loopback (data:, blob: and about: URLs stay in the browser)."""
    return sorted({url for url in urls if urlsplit(url).scheme not in ("data", "blob", "about")
                   and urlsplit(url).hostname not in LOCAL})


@pytest.fixture
def shipped_server(browser_workspace, tmp_path) -> Iterator[AppServer]:
    server = AppServer(browser_workspace, tmp_path / "streamlit.log", flags=SHIPPED)
    yield server
    server.stop()


def page_address(url: str, script: str) -> str:
    """A page's own address: its file name without the ordering number (pages/2_Triplets.py → /Triplets)."""
    return f"{url}/{re.sub(r'^[0-9]+_', '', Path(script).stem)}"


def test_no_request_leaves_the_loopback(shipped_server, chromium, add_account, sign_in, tmp_path):
    server = shipped_server
    assert server.url.startswith("http://127.0.0.1:")
    name = add_account(server.workspace, "Dr Offline", "admin")
    ws = Workspace(server.workspace)
    outlined = ws.store.wounds()[0]["image_id"]
    wounds = len(ws.store.wounds(outlined))
    context = chromium.new_context(viewport=LAPTOP)
    requests: list[str] = []
    context.on("request", lambda request: requests.append(request.url))  # every page and frame of the context
    pg = context.new_page()
    pg.set_default_timeout(120_000)
    pg.on("websocket", lambda socket: requests.append(socket.url))
    sign_in(pg, server.url, name)  # Home, signed in
    idle(pg)
    for script, title, _, _ in PAGES:  # each by its address (a fresh session, signed in by the cookie)
        pg.goto(page_address(server.url, script) + (f"?photo={outlined}" if "Wound_masks" in script else ""))
        expect(pg).to_have_title(f"{title} · TriDerm Studio")
        idle(pg)
        if "Wound_masks" in script:  # the outline editor's frame, then the delete question (cancelled)
            expect(pg.get_by_role("heading", name=f"Wounds of {outlined}")).to_be_visible()
            expect(pg.locator(".oe svg image")).to_have_count(1)
            pg.get_by_role("button", name=re.compile(r"^Delete wound \d+$")).first.click()
            expect(pg.get_by_text(re.compile(r"^Delete wound \d+: its outline, description and metadata\?"))
                   ).to_be_visible()
            pg.get_by_role("button", name="Cancel", exact=True).click()
            expect(pg.get_by_role("button", name=re.compile(r"^Yes, delete wound"))).to_have_count(0)
            idle(pg)
        if "Triplets" in script:  # the zoom dialog, then one answer
            expect(pg.get_by_text(re.compile(rf"^{name}: 0 of"))).to_be_visible()
            idle(pg)
            pg.keyboard.press("w")
            dialog = pg.get_by_role("dialog")
            expect(dialog).to_be_visible()
            expect(dialog.locator("img").first).to_be_visible()
            pg.keyboard.press("Escape")
            expect(dialog).to_have_count(0)
            pg.keyboard.press("ArrowLeft")
            expect(pg.get_by_text(re.compile(rf"^{name}: 1 of"))).to_be_visible()
            idle(pg)
    context.close()
    (tmp_path / "requests.txt").write_text("\n".join(requests))  # the session's record, for a failing run
    assert [r["choice"] for r in ws.store.triplets(source=f"expert:{name}")] == ["j"]  # the session did act
    assert len(ws.store.wounds(outlined)) == wounds  # the cancelled question deleted nothing
    paths = {urlsplit(url).path for url in requests}
    assert "/_stcore/stream" in paths and len(requests) > 50  # the recording saw the WebSocket and the assets
    assert leaving(requests) == []


def test_the_recorder_catches_usage_statistics(browser_workspace, chromium, tmp_path):
    """The control: usage statistics switched on make the page fetch from Streamlit's metrics host, and the
    recorder above sees it (so the shipped ``gatherUsageStats = false`` is what keeps the session local)."""
    server = AppServer(browser_workspace, tmp_path / "streamlit.log",
                       flags=(*SHIPPED, "--browser.gatherUsageStats", "true"))
    try:
        context = chromium.new_context(viewport=LAPTOP)
        requests: list[str] = []
        context.on("request", lambda request: requests.append(request.url))
        pg = context.new_page()
        pg.set_default_timeout(120_000)
        with pg.expect_request(lambda request: urlsplit(request.url).hostname not in LOCAL, timeout=120_000):
            pg.goto(server.url)
        context.close()
    finally:
        server.stop()
    assert any(urlsplit(url).hostname == "data.streamlit.io" for url in leaving(requests)), leaving(requests)
