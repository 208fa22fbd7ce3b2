"""Waits shared by the browser tests: a finished script run, a photo decoded and laid out."""
from __future__ import annotations


def idle(pg, settle_ms: int = 0) -> None:
    """Wait until the app's script run has finished (Streamlit marks the root element).

    ``settle_ms`` adds a fixed wait for pages whose rerun can start late (after a fragment or a rerun).
    """
    pg.wait_for_selector('[data-test-script-state="notRunning"]', state="attached")
    if settle_ms:
        pg.wait_for_timeout(settle_ms)


def image_shown(pg, selector: str) -> None:
    """Wait until the first image matching ``selector`` is decoded and laid out with a non-zero size.

    A dialog's ``img`` is attached before its bytes arrive; its box is 0 px high until they do.
    """
    pg.wait_for_function(
        """sel => { const img = document.querySelector(sel);
                    return !!img && img.complete && img.naturalWidth > 0
                           && img.getBoundingClientRect().height > 0; }""",
        arg=selector,
    )
