"""The outline editor: a Streamlit ``components.v2`` component (inline JS + CSS, no build step).

``editor.js`` documents the interactions. Python sends the photo and the outlines (polygons in
photo coordinates, derived from the label map by :func:`annotations.accounts.session.label_polygons`); the
editor sends back one action per click of Save / Accept / Reject or a "click to outline" point.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import streamlit as st
from PIL import Image

HERE = Path(__file__).parent
_component = st.components.v2.component(
    "triderm.outline_editor",
    html="",
    css=(HERE / "editor.css").read_text(),
    js=(HERE / "editor.js").read_text(),
)

#: Longest side of the photo sent to the browser; coordinates stay those of the stored photo.
MAX_SIDE = 2048
#: JPEG quality of the photo sent to the browser (what the editor shows; outlines come from the stored mask).
JPEG_QUALITY = 85


def image_uri(image: Image.Image) -> str:
    """The photo as a JPEG data URI (quality :data:`JPEG_QUALITY`, reduced to :data:`MAX_SIDE` px when larger): a
    tenth of a PNG's bytes and far quicker to encode, so the next photo reaches the editor sooner."""
    image = image.convert("RGB")
    if max(image.size) > MAX_SIDE:
        image = image.copy()
        image.thumbnail((MAX_SIDE, MAX_SIDE))
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def outline_editor(*, image: str, image_key: str, size: tuple[int, int], shapes: list[dict[str, Any]],
                   version: str, overlap: list | None = None, clicks: list[dict] | None = None,
                   stage_height: int = 620, click_off: str | None = None, key: str) -> dict | None:
    """Mount the editor; returns this rerun's action (a dict with ``type``) or None.

    ``shapes``: ``{key, kind: "wound"|"candidate", index | id, label, colour, polys}``; ``version``
    changes whenever the stored outlines or suggestions change, which discards unsaved edits; ``click_off``:
    click-to-outline is unavailable, its tool disabled with this text as its help.
    """
    width, height = size
    result = _component(
        key=key,
        data={"image": image, "image_key": image_key, "width": width, "height_px": height, "shapes": shapes,
              "version": version, "overlap": overlap or [], "clicks": clicks or [], "stage_height": stage_height,
              "click_off": click_off},
        on_action_change=lambda: None,
        height="content",
    )
    return result.action
