"""Accounts in Chromium: roles' missing pages and buttons, sign-in kept over a reload, sign-out
(revoking a copied cookie), lock-out, forged and expired cookies, the demo guard."""
from __future__ import annotations

import json
import shutil
import time

import pytest
from itsdangerous import TimestampSigner, URLSafeTimedSerializer
from playwright.sync_api import expect
from streamlit_page import idle, wait_for_cookie

from annotations.accounts import accounts
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

expect.set_options(timeout=60_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]

ALL_PAGES = ["Wound masks", "Triplet judgments", "LLM oracle", "Train", "Explore", "Report", "Review", "Accounts"]
VISIBLE = {"annotator": {"Wound masks", "Triplet judgments"},
           "viewer": {"Explore", "Report"},
           "researcher": {"LLM oracle", "Train", "Explore", "Report"},
           "admin": set(ALL_PAGES)}


def links(pg) -> set[str]:
    expect(pg.get_by_role("link", name="Home")).to_be_visible()
    idle(pg)
    return {name for name in ALL_PAGES if pg.get_by_role("link", name=name).count()}


def test_roles_see_only_their_pages_and_buttons(app_server, chromium, add_account, sign_in, screenshot):
    for role, visible in VISIBLE.items():
        name = add_account(app_server.workspace, f"Dr {role.title()}", role)
        context = chromium.new_context(viewport={"width": 1366, "height": 900})
        pg = context.new_page()
        sign_in(pg, app_server.url, name)
        expect(pg.get_by_text(f"({role})").first).to_be_visible()
        assert links(pg) == visible, role
        if role == "viewer":  # docs/screenshots/navigation_viewer.png (TRIDERM_SCREENSHOT_DIR=docs/screenshots)
            screenshot(pg, "navigation_viewer")
        demo = pg.get_by_role("button", name="Build demo")
        if role == "admin":
            pg.get_by_text("Import a dataset folder or build the demo").click()
            expect(demo).to_be_visible()
        else:
            assert demo.count() == 0 and pg.get_by_role("button", name="Import").count() == 0
        if role == "annotator":  # an admin page opened by URL: a clear message, nothing of the page
            pg.goto(f"{app_server.url}/Review")
            expect(pg.get_by_text("Review is only for admins")).to_be_visible()
            assert pg.get_by_test_id("stDataFrame").count() == 0
            pg.goto(f"{app_server.url}/Train")
            expect(pg.get_by_text("Train is only for admins and researchers")).to_be_visible()
            assert pg.get_by_role("button", name="Start training").count() == 0
        context.close()


def test_a_signed_out_deep_link_signs_in_then_lands_on_the_page_asked_for(browser_workspace, start_app, page,
                                                                          add_account, sign_in, tmp_path):
    name = add_account(browser_workspace, "Dr Deep Link")
    server = start_app(browser_workspace, tmp_path / "streamlit.log")  # the deep link is its first request
    deep_link = f"{server.url}/Triplets"
    page.goto(deep_link)
    expect(page.get_by_role("textbox", name="Account name")).to_be_visible()
    idle(page)
    assert page.get_by_text("Page not found").count() == 0
    assert page.get_by_role("heading", name="Triplet judgments").count() == 0  # nothing of the page signed out
    assert page.get_by_role("link", name="Wound masks").count() == 0  # nor the list of pages
    sign_in(page, deep_link, name, expect_ok=False)
    expect(page.get_by_role("heading", name="Triplet judgments")).to_be_visible()
    assert page.url.endswith("/Triplets")


def test_a_signed_in_deep_link_as_a_fresh_servers_first_request_lists_only_the_roles_pages(
        browser_workspace, start_app, chromium, add_account, sign_in, tmp_path):
    """A signed-in annotator (cookie from an earlier server) opens /Triplets as a restarted server's first
    request: the page opens and the sidebar lists only the annotator's pages, never every page."""
    name = add_account(browser_workspace, "Dr Fresh Link")
    first = start_app(browser_workspace, tmp_path / "first.log")
    context = chromium.new_context(viewport={"width": 1366, "height": 768})
    pg = context.new_page()
    sign_in(pg, first.url, name)
    idle(pg)
    wait_for_cookie(pg)
    first.stop()
    fresh = start_app(browser_workspace, tmp_path / "fresh.log")  # cookies are per host, not per port
    pg.goto(f"{fresh.url}/Triplets", timeout=300_000)
    expect(pg.get_by_role("heading", name="Triplet judgments")).to_be_visible(timeout=300_000)
    assert links(pg) == VISIBLE["annotator"]
    context.close()


def test_sign_in_survives_reload_and_sign_out_works(app_server, page, add_account, sign_in, screenshot):
    name = add_account(app_server.workspace, "Dr Reload")
    sign_in(page, app_server.url, name.upper())  # names ignore case
    expect(page.get_by_text(f"Signed in as {name}").first).to_be_visible()
    idle(page)
    wait_for_cookie(page)
    page.reload()
    expect(page.get_by_text(f"Signed in as {name}").first).to_be_visible()
    page.goto(f"{app_server.url}/Triplets")  # a new connection: the signed cookie restores the session
    expect(page.get_by_role("heading", name="Triplet judgments")).to_be_visible()
    captured = next(c for c in page.context.cookies() if c["name"] == accounts.COOKIE_NAME)
    page.goto(app_server.url)
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("textbox", name="Account name")).to_be_visible()
    wait_for_cookie(page, present=False)
    thief = page.context.browser.new_context(viewport={"width": 1366, "height": 900})
    thief.add_cookies([captured])  # the cookie copied before sign-out, in a fresh browser
    stolen = thief.new_page()
    stolen.goto(f"{app_server.url}/Triplets")
    expect(stolen.get_by_text("no longer valid")).to_be_visible()
    assert stolen.get_by_role("heading", name="Triplet judgments").count() == 0
    thief.close()
    page.reload()
    expect(page.get_by_role("textbox", name="Account name")).to_be_visible()
    assert page.get_by_text("Signed in as").count() == 0
    screenshot(page, "sign_in")


def test_wrong_passwords_lock_the_account(app_server, page, add_account, sign_in):
    name = add_account(app_server.workspace, "Dr Locked")
    sign_in(page, app_server.url, "Nobody At All", expect_ok=False)
    expect(page.get_by_text(accounts.REFUSED)).to_be_visible()
    for n in range(accounts.MAX_FAILED):
        page.get_by_role("textbox", name="Account name").fill(name)
        page.get_by_label("Password", exact=True).fill(f"wrong {n}")
        page.get_by_role("button", name="Sign in").click()
        idle(page)  # each attempt answered before the next one is typed
        expect(page.get_by_text(accounts.REFUSED)).to_be_visible()  # the same answer as for an unknown name
    sign_in(page, app_server.url, name, expect_ok=False)  # the right password, while locked
    expect(page.get_by_text(accounts.REFUSED)).to_be_visible()
    assert page.get_by_text("Signed in as").count() == 0
    rows = accounts.list_accounts(Workspace(app_server.workspace).store)
    assert next(r for r in rows if r["name"] == name)["locked_until"]  # locked, though the page never said so


class _OldSigner(TimestampSigner):
    def get_timestamp(self) -> int:
        return int(time.time()) - accounts.SESSION_MAX_AGE_S - 60


@pytest.mark.parametrize("kind", ["forged", "expired"])
def test_forged_or_expired_cookie_signs_out_with_a_message(app_server, chromium, add_account, kind):
    name = add_account(app_server.workspace, "Dr Cookie", "admin")
    ws = Workspace(app_server.workspace)
    key = accounts.secret_key(ws.root)
    if kind == "forged":  # signed with another key: anyone could write this
        token = accounts.issue_token(ws.store, "not the server's key, but long enough", accounts.get(ws.store, name))
        message = "could not be verified"
    else:
        payload = {"name": name, "epoch": 0}
        token = URLSafeTimedSerializer(key, salt="triderm-session", signer=_OldSigner).dumps(payload)
        message = "Your sign-in has expired"
    context = chromium.new_context(viewport={"width": 1366, "height": 900})
    context.add_cookies([{"name": accounts.COOKIE_NAME, "value": token, "url": app_server.url}])
    pg = context.new_page()
    pg.goto(f"{app_server.url}/Review")
    expect(pg.get_by_text(message)).to_be_visible()
    expect(pg.get_by_role("textbox", name="Account name")).to_be_visible()
    assert pg.get_by_role("link", name="Review").count() == 0
    context.close()


def test_demo_guard_keeps_real_workspaces_real(demo_dataset, chromium, start_app, tmp_path, sign_in):
    real = tmp_path / "real"  # the demo's photos presented as a clinical (non-synthetic) dataset
    shutil.copytree(demo_dataset, real)
    (real / "dataset.json").write_text(json.dumps({"name": "clinic", "synthetic": False}))
    root = tmp_path / "ws"
    ws = Workspace(root)
    import_dataset(ws, real)
    accounts.add_account(ws.store, "Boss", "admin", "browser-test-password", "test")
    before = ws.store.counts()["images"]
    server = start_app(root, tmp_path / "streamlit.log")
    context = chromium.new_context(viewport={"width": 1366, "height": 900})
    pg = context.new_page()
    sign_in(pg, server.url, "Boss")
    assert pg.get_by_text("SYNTHETIC DATA").count() == 0
    pg.get_by_text("Import a dataset folder or build the demo").click()
    expect(pg.get_by_text("build or import the SYNTHETIC demo into a new, empty workspace")).to_be_visible()
    expect(pg.get_by_role("button", name="Build demo")).to_be_disabled()
    assert Workspace(root).store.counts()["images"] == before and not Workspace(root).is_synthetic
    context.close()


def test_build_demo_ends_with_a_confirmation(chromium, start_app, tmp_path, sign_in):
    root = tmp_path / "empty"
    accounts.add_account(Workspace(root).store, "Boss", "admin", "browser-test-password", "test")
    server = start_app(root, tmp_path / "streamlit.log")
    context = chromium.new_context(viewport={"width": 1366, "height": 768})
    pg = context.new_page()
    pg.goto(server.url)
    expect(pg.get_by_role("textbox", name="Account name")).to_be_visible(timeout=300_000)  # a fresh server's first page
    sign_in(pg, server.url, "Boss")
    pg.get_by_role("spinbutton", name="Photos", exact=True).fill("6")
    pg.get_by_role("button", name="Build demo").click()
    expect(pg.get_by_text("Demo imported: 6 synthetic photos")).to_be_visible(timeout=300_000)  # after the rerun
    idle(pg)
    expect(pg.get_by_text("Demo imported: 6 synthetic photos")).to_be_visible()
    assert Workspace(root).store.counts()["images"] == 6
    context.close()
