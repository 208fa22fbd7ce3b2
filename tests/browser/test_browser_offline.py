"""No request leaves the loopback: Chromium signs in and opens every page of the demo workspace, and every
request it makes (the page's, its components' frames', its WebSockets) goes to the app's own server (issue 54)."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect
from streamlit_page import idle

from app_common import PAGES

expect.set_options(timeout=60_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

LOCAL = {"127.0.0.1", "localhost"}


def test_no_request_leaves_the_loopback(app_server, chromium, add_account, sign_in):
    context = chromium.new_context(viewport={"width": 1440, "height": 1000})
    requests: list[str] = []
    context.on("request", lambda request: requests.append(request.url))
    pg = context.new_page()
    pg.set_default_timeout(120_000)
    pg.on("websocket", lambda socket: requests.append(socket.url))
    sign_in(pg, app_server.url, add_account(app_server.workspace, "Dr Offline", "admin"))
    idle(pg)
    for script, title, _, _ in PAGES:  # each by its address (a fresh session, signed in by the cookie)
        pg.goto(f"{app_server.url}/{re.sub(r'^[0-9]+_', '', Path(script).stem)}")
        expect(pg).to_have_title(f"{title} · TriDerm Studio")
        idle(pg)
    context.close()
    assert any(urlsplit(url).path == "/_stcore/stream" for url in requests)  # the recording saw the WebSocket
    leaving = sorted({url for url in requests if urlsplit(url).scheme not in ("data", "blob", "about")
                      and urlsplit(url).hostname not in LOCAL})
    assert leaving == []
