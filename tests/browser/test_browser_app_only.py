"""An ``[app]``-only server in Chromium at 1366×768 (issue 54): with the ``[ml]`` and ``[llm]`` extras' modules
not installed (hidden from the server's interpreter by a ``sitecustomize`` on its path, as ``scripts/app_smoke.py
--block-ml`` hides them from AppTest), the outline page keeps its photo and its model controls in place, disabled,
naming the ``[ml]`` extra, and the LLM oracle page names the ``[llm]`` extra with its run button disabled; neither
page shows a traceback or a page-wide "needs" message."""
from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator

import pytest
from conftest import REPO, AppServer
from playwright.sync_api import expect
from streamlit_page import idle

from annotations.infra.workspace import Workspace

expect.set_options(timeout=60_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAPTOP = {"width": 1366, "height": 768}
ML_HINT, LLM_HINT = 'pip install "triderm-studio[ml]"', 'pip install "triderm-studio[llm]"'
#: The server's ``sitecustomize``: a finder first on ``sys.meta_path`` for which the modules of the two extras do not
#: exist; the app's own guard (app.extras.MissingExtra, once a page imported app) is asked as on a server
#: where no finder has them.
HIDE_EXTRAS = textwrap.dedent('''
    import importlib.abc
    import sys

    from triderm import EXTRA_OF


    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if path is not None or EXTRA_OF.get(name) not in ("ml", "llm"):
                return None
            for finder in list(sys.meta_path):
                if type(finder).__name__ == "MissingExtra":
                    finder.find_spec(name, path, target)
            raise ModuleNotFoundError(f"No module named {name!r} (an [app]-only server)", name=name)


    sys.meta_path.insert(0, NotInstalled())
''')


@pytest.fixture
def app_only(browser_workspace, tmp_path, add_account) -> Iterator[tuple[AppServer, str]]:
    """A server of the browser workspace whose interpreter finds neither extra, and an admin account's name (the
    ``add_account`` fixture: in the full suite a late ``from conftest import`` may find another folder's conftest)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(HIDE_EXTRAS, encoding="utf-8")
    path = os.pathsep.join([str(tmp_path / "site"), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    server = AppServer(browser_workspace, tmp_path / "streamlit.log", env={"PYTHONPATH": path})
    yield server, add_account(browser_workspace, "Dr App Only", "admin")
    server.stop()


def no_traceback(pg) -> None:
    """The page's text holds no Python traceback and no page-wide "This page needs" stop."""
    text = pg.get_by_test_id("stMain").inner_text()
    assert "Traceback" not in text and 'File "' not in text and "This page needs" not in text, text[-2000:]


def tooltip_of(pg, control, tries: int = 3) -> str:
    """The help tooltip shown while the pointer rests on ``control`` (a disabled control: the pointer moved onto it
    from outside, in steps, so that the hover target sees it enter; in the full suite a single forced hover
    sometimes left no tooltip)."""
    tip = pg.get_by_test_id("stTooltipContent")
    for _ in range(tries - 1):
        pg.mouse.move(0, 0)
        control.scroll_into_view_if_needed()
        box = control.bounding_box()
        pg.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, steps=5)
        try:
            expect(tip).to_be_visible(timeout=10_000)
            return tip.inner_text()
        except AssertionError:
            continue
    control.hover(force=True)
    expect(tip).to_be_visible()
    return tip.inner_text()


def test_an_app_only_server_names_the_extras_and_shows_no_traceback(app_only, chromium, sign_in, screenshot):
    server, name = app_only
    image_id = Workspace(server.workspace).store.wounds()[0]["image_id"]
    context = chromium.new_context(viewport=LAPTOP)
    pg = context.new_page()
    pg.set_default_timeout(120_000)
    sign_in(pg, server.url, name)
    idle(pg)

    pg.goto(f"{server.url}/Wound_masks?photo={image_id}")
    expect(pg.get_by_role("heading", name=f"Wounds of {image_id}")).to_be_visible()
    suggest = pg.get_by_role("button", name="Suggest outlines")
    expect(suggest).to_be_visible()
    expect(suggest).to_be_disabled()
    assert ML_HINT in tooltip_of(pg, suggest)
    expect(pg.get_by_role("radiogroup", name="Click to outline uses").get_by_role("radio").first).to_be_disabled()
    expect(pg.locator(".oe svg image")).to_be_visible()  # the photo in the outline editor: drawing still works
    idle(pg)
    no_traceback(pg)
    screenshot(pg, "app_only_outline_1366x768")

    pg.goto(f"{server.url}/LLM_oracle")
    warning = pg.get_by_text("needs the `[llm]` extra this server does not have").or_(
        pg.get_by_text("needs the [llm] extra this server does not have"))
    expect(warning.first).to_be_visible()
    expect(pg.get_by_text(LLM_HINT).first).to_be_visible()
    start = pg.get_by_role("button", name="Start LLM run")
    expect(start).to_be_disabled()
    assert LLM_HINT in tooltip_of(pg, start)
    idle(pg)
    no_traceback(pg)
    screenshot(pg, "app_only_llm_1366x768")
    context.close()
