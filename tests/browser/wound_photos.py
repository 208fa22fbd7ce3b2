"""Synthetic wound photos, outline-editor helpers and an event-based wait for Streamlit reruns, for the
browser tests (not a test module)."""
from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from PIL import Image, ImageDraw
from playwright.sync_api import Error as PlaywrightError


def wound_photo(seed: int, blobs: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """A 320×240 skin-coloured photo with dark red elliptic wounds, and its label map."""
    rng = np.random.default_rng(seed)
    img = np.full((240, 320, 3), (214, 170, 150), np.uint8) + rng.integers(0, 12, (240, 320, 3), dtype=np.uint8)
    mask = Image.new("L", (320, 240), 0)
    for n, box in enumerate(blobs, start=1):
        ImageDraw.Draw(mask).ellipse(box, fill=n)
    labels = np.asarray(mask)
    img[labels > 0] = (150, 40, 40)
    return img, labels


def to_screen(pg, x: float, y: float) -> tuple[float, float]:
    """Screen position of photo coordinates (x, y), through the outline editor's current zoom and pan."""
    return tuple(pg.locator(".oe svg").evaluate(
        "(svg, [x, y]) => { const p = svg.createSVGPoint(); p.x = x; p.y = y;"
        " const q = p.matrixTransform(svg.getScreenCTM()); return [q.x, q.y]; }", [x, y]))


def tool(pg, name: str):
    """The outline editor's toolbar button labelled exactly ``name``."""
    return pg.locator(".oe .bar button", has_text=re.compile(rf"^{re.escape(name)}$"))


# Counts finished Streamlit script runs: the app root's data-test-script-state turning to "notRunning".
_COUNT_RUNS = """
window.__trideRuns = 0;
new MutationObserver(ms => { for (const m of ms) {
  if (m.target.getAttribute("data-test-script-state") === "notRunning" && m.oldValue !== "notRunning") window.__trideRuns++;
}}).observe(document, {subtree: true, attributes: true, attributeOldValue: true,
                       attributeFilter: ["data-test-script-state"]});
"""
_STATE = "document.querySelector('[data-testid=stApp]')?.getAttribute('data-test-script-state')"


def watch_runs(pg) -> None:
    """Count the app's finished script runs in every page ``pg`` loads from now on (call before ``goto``)."""
    pg.add_init_script(_COUNT_RUNS)


@contextmanager
def settled(pg, what: str, timeout_ms: int = 120_000) -> Iterator[None]:
    """Run the body (an action and the checks of its outcome), then wait until a script run that finished
    after the body began has left the app idle: no fixed sleep, so no race with a rerun that starts late.
    Fails naming ``what`` when none does within ``timeout_ms`` (generous: a loaded machine)."""
    before = pg.evaluate("window.__trideRuns")
    if before is None:
        raise AssertionError("watch_runs(page) was not called before the page was opened")
    yield
    try:
        pg.wait_for_function(f"n => window.__trideRuns > n && {_STATE} === 'notRunning'", arg=before,
                             timeout=timeout_ms)
    except PlaywrightError as err:
        state = pg.evaluate(_STATE)
        raise AssertionError(f"the app did not finish a script run within {timeout_ms / 1000:.0f} s after {what} "
                             f"(script state now: {state})") from err
