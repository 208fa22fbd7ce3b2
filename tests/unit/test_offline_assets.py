"""The app works offline (issue 54): its code names no external asset, and the shipped settings turn off
Streamlit's usage statistics (the only request Streamlit's own page would send elsewhere) and serve on the
loopback. tests/browser/test_browser_offline.py records a whole browser session to the same end."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from triderm.__main__ import streamlit_flags

REPO = Path(__file__).resolve().parents[2]
APP_FILES = [REPO / "app.py", *sorted((REPO / "app").glob("*.py")), *sorted((REPO / "pages").glob("*.py")),
             *sorted(p for p in (REPO / "components").rglob("*") if p.suffix in (".py", ".js", ".css", ".html")),
             REPO / ".streamlit" / "config.toml"]
URL = re.compile(r"""(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}[^\s"'`)]*""", re.IGNORECASE)
#: URLs that are names, never fetched: the SVG namespace of the outline editor's createElementNS.
NAMES = {"http://www.w3.org/2000/svg"}


def external_urls(text: str) -> list[str]:
    """The URLs in ``text`` that a browser could fetch (:data:`NAMES` excepted)."""
    return [url for url in URL.findall(text) if url not in NAMES]


def test_the_finder_sees_a_url():
    """The check below can fail: a CDN font, an icon host and a protocol-relative script are all found."""
    text = ('st.markdown("<link href=\'https://fonts.googleapis.com/css2?family=Inter\'>")\n'
            'page_icon="http://example.org/icon.png"\nsrc="//cdn.jsdelivr.net/npm/x.js"\n'
            'document.createElementNS("http://www.w3.org/2000/svg", "g")')
    assert external_urls(text) == ["https://fonts.googleapis.com/css2?family=Inter", "http://example.org/icon.png",
                                   "//cdn.jsdelivr.net/npm/x.js"]


def test_the_app_names_no_external_asset():
    assert len(APP_FILES) > 12 and all(p.is_file() for p in APP_FILES)
    found = {str(p.relative_to(REPO)): urls for p in APP_FILES if (urls := external_urls(p.read_text("utf-8")))}
    assert found == {}


def test_the_page_icon_is_an_emoji():
    """A ``:material/…:`` page icon is fetched from an icon font host as the favicon; an emoji is a data: URL."""
    for path in (REPO / "app.py", REPO / "app" / "navigation.py"):
        icons = re.findall(r"page_icon=([^,)]+)", path.read_text("utf-8"))
        assert icons and all(re.fullmatch(r'"[^":/.]+"', icon) for icon in icons), (path.name, icons)


def test_the_shipped_settings_keep_the_browser_local():
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert config["browser"]["gatherUsageStats"] is False
    assert config["server"]["address"] == "127.0.0.1"
    flags = streamlit_flags()  # what `triderm app` passes (an installed app.py has no .streamlit/ beside it)
    assert "--browser.gatherUsageStats=false" in flags and "--server.address=127.0.0.1" in flags
