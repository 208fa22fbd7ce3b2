"""Synthetic wound photos, outline-editor helpers and an event-based wait for Streamlit reruns, for the
browser tests (not a test module)."""
from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from google.protobuf.message import DecodeError
from PIL import Image, ImageDraw
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit_page import idle


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



_SOCKETS: dict[int, list] = {}  # id(page) -> the app websockets it opened, newest last


def _run_finished(payload: bytes | str) -> bool:
    """Whether a websocket frame is the app's "script run finished" message (not one cut short by a rerun)."""
    if not isinstance(payload, bytes):
        return False
    try:
        msg = ForwardMsg.FromString(payload)
    except DecodeError:
        return False
    return msg.WhichOneof("type") == "script_finished" and msg.script_finished != ForwardMsg.FINISHED_EARLY_FOR_RERUN


def watch_runs(pg) -> None:
    """Keep the Streamlit websockets ``pg`` opens (call before ``goto``), for :func:`settled`."""
    sockets = _SOCKETS.setdefault(id(pg), [])
    pg.on("websocket", lambda ws: sockets.append(ws) if "/_stcore/stream" in ws.url else None)


@contextmanager
def settled(pg, what: str, timeout_ms: int = 120_000) -> Iterator[None]:
    """Run the body (an action and the checks of its outcome), then wait for the event that the script
    run it caused has finished: the server's ``script_finished`` message, received after the body began
    (no fixed sleep, so no race with a rerun that starts late). Fails naming ``what`` when none comes
    within ``timeout_ms`` (generous: a loaded machine)."""
    sockets = _SOCKETS.get(id(pg))
    if not sockets:
        raise AssertionError("call watch_runs(page) before opening the app")
    with sockets[-1].expect_event("framereceived", predicate=_run_finished, timeout=timeout_ms) as finished:
        yield
        try:
            _ = finished.value  # blocks until the message arrives
        except PlaywrightError as err:
            raise AssertionError(f"the app did not finish a script run within {timeout_ms / 1000:.0f} s after "
                                 f"{what}") from err
    pg.wait_for_selector('[data-test-script-state="notRunning"]', state="attached", timeout=timeout_ms)


def open_wound_masks(pg, url: str, user: str, password: str, image_id: str | None = None) -> None:
    """Sign in at ``url`` as ``user``, open the Wound masks page (its outline editor attached) and
    choose ``image_id`` when given."""
    watch_runs(pg)
    pg.goto(url)
    pg.get_by_role("textbox", name="Account name").fill(user)
    pg.get_by_role("textbox", name="Password").fill(password)
    with settled(pg, "signing in"):
        pg.get_by_role("button", name="Sign in").click()
        expect(pg.get_by_role("link", name="Wound masks")).to_be_visible()
    with settled(pg, "opening Wound masks"):
        pg.get_by_role("link", name="Wound masks").click()
        expect(pg.get_by_role("heading", name="Wound masks")).to_be_visible()
        expect(pg.locator(".oe svg image")).to_be_attached()
    if image_id is not None:
        choose_photo(pg, image_id)


def choose_photo(pg, image_id: str) -> None:
    """Pick ``image_id`` in the Wound masks page's photo box, waiting for its heading."""
    heading = pg.get_by_role("heading", name=f"Wounds of {image_id}")
    if not heading.is_visible():  # choosing the photo shown already reruns nothing
        with settled(pg, f"choosing photo {image_id}"):
            for attempt in range(3):  # a late rerun (the editor's first value) redraws the box and closes an open
                idle(pg)  # list; an annotator opens it again, as here; an open list shows its options in ms
                pg.get_by_role("combobox", name="Photo").click()
                try:
                    pg.get_by_role("option", name=image_id, exact=True).click(timeout=5_000 if attempt < 2 else 30_000)
                    break
                except PlaywrightTimeoutError:
                    if attempt == 2:
                        raise
                    pg.keyboard.press("Escape")
            expect(heading).to_be_visible()


def draw(pg, points: list[tuple[float, float]]) -> None:
    """Draw mode: click each point (waiting for its vertex to appear), then the first again to close the outline."""
    tool(pg, "Draw new").click()
    pg.locator(".oe svg").scroll_into_view_if_needed()
    for n, (x, y) in enumerate(points, start=1):
        pg.mouse.click(*to_screen(pg, x, y))
        expect(pg.locator(".oe polyline.draft ~ circle.vertex")).to_have_count(n)
    pg.mouse.click(*to_screen(pg, *points[0]))
    expect(pg.locator(".oe polyline.draft")).to_have_count(0)
