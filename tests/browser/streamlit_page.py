"""Waits shared by the browser tests: a finished script run, a photo decoded and laid out, the session cookie."""
from __future__ import annotations

from playwright.sync_api import Error as PlaywrightError

from annotations.accounts import accounts


def idle(pg, settle_ms: int = 0) -> None:
    """Wait until the app's script run has finished (Streamlit marks the root element).

    ``settle_ms`` adds a fixed wait for pages whose rerun can start late (after a fragment or a rerun).
    """
    pg.wait_for_selector('[data-test-script-state="notRunning"]', state="attached")
    if settle_ms:
        pg.wait_for_timeout(settle_ms)


def image_shown(pg, selector: str, count: int = 1) -> None:
    """Wait until the first ``count`` images matching ``selector`` are decoded and laid out with a non-zero size.

    An ``img`` is attached before its bytes arrive; its box is 0 px high (and not yet its final width) until they do.
    """
    pg.wait_for_function(
        """([sel, n]) => { const imgs = [...document.querySelectorAll(sel)].slice(0, n);
                           return imgs.length === n && imgs.every(img => img.complete && img.naturalWidth > 0
                                                                  && img.getBoundingClientRect().height > 0); }""",
        arg=[selector, count],
    )


def wait_for_cookie(pg, present: bool = True, timeout_ms: int = 120_000) -> None:
    """Wait until the browser holds (or no longer holds) the session cookie the app writes (from page script,
    so ``document.cookie`` sees it); fails with a clear message after a generous timeout.

    The app writes it from a script after the sign-in run: "Signed in as" can show before it is set, and a
    ``goto`` in that moment opens a new session without it.
    """
    try:
        pg.wait_for_function("([name, present]) => document.cookie.split('; ').some(c => c.startsWith(name + '=')"
                             " && c.length > name.length + 1) === present", arg=[accounts.COOKIE_NAME, present],
                             timeout=timeout_ms)
    except PlaywrightError as err:
        raise AssertionError(f"session cookie {'never set' if present else 'never deleted'} within "
                             f"{timeout_ms / 1000:.0f} s") from err
    assert any(c["name"] == accounts.COOKIE_NAME for c in pg.context.cookies()) == present
