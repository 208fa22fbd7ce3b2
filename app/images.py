"""Pictures of the workspace's photos: thumbnails, letterboxed frames, outlines drawn on them, wound crops and
zooms, each cached by content hash."""

from __future__ import annotations

import base64
import hashlib
import io

import numpy as np
import streamlit as st
from PIL import Image, ImageOps

from annotations.accounts import session
from annotations.infra.workspace import Workspace
from app.auth import workspace


def _digest(ws: Workspace, image_id: str) -> str:
    """Content hash of a photo (the store's sha256, updated by every import) plus its mask file's, so
    cached pictures follow a re-import or a new outline rather than the file path."""
    row = ws.store.image(image_id) or {}
    mask = ws.masks_dir / f"{image_id}.png"
    mask_hash = hashlib.sha1(mask.read_bytes()).hexdigest() if mask.exists() else ""
    return f"{row.get('sha256', '')}:{mask_hash}"


@st.cache_data(show_spinner=False, max_entries=512)
def _thumbnail(path: str, size: int, digest: str) -> bytes:
    with Image.open(path) as im:
        im = im.convert("RGB")
        im.thumbnail((size, size))
        buf = io.BytesIO()
        im.save(buf, format="PNG")
    return buf.getvalue()


def photo(ws: Workspace, image_id: str, size: int = 320) -> bytes:
    """PNG bytes of a photo shrunk to ``size`` px on its longer side (cached by content hash)."""
    return _thumbnail(str(ws.image_path(image_id)), size, _digest(ws, image_id))


def _frame(im: Image.Image, width: int, height: int, fmt: str = "PNG") -> bytes:
    im = ImageOps.contain(im.convert("RGB"), (width, height))  # enlarges small photos too
    frame = Image.new("RGB", (width, height), (242, 245, 247))
    frame.paste(im, ((width - im.width) // 2, (height - im.height) // 2))
    buf = io.BytesIO()
    frame.save(buf, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return buf.getvalue()


@st.cache_data(show_spinner=False, max_entries=512)
def _letterboxed(path: str, width: int, height: int, digest: str) -> bytes:
    with Image.open(path) as im:
        return _frame(im, width, height)


def letterboxed(ws: Workspace, image_id: str, width: int = 720, height: int = 540) -> bytes:
    """The photo fitted into a fixed width×height frame (neutral margins), so that photos of
    different shapes shown side by side line up (cached by content hash)."""
    return _letterboxed(str(ws.image_path(image_id)), width, height, _digest(ws, image_id))


@st.cache_data(show_spinner=False, max_entries=256)
def _outlined(root: str, image_id: str, width: int, height: int, digest: str) -> bytes:
    ws = workspace()
    return _frame(outline_overlay(ws.load_image(image_id), ws.load_mask(image_id)), width, height)


def outline_overlay(image: Image.Image, labels: np.ndarray, border: bool = True) -> Image.Image:
    """The photo with each wound's contour drawn in its colour (a 3-px line; the wound stays visible);
    without ``border`` no line runs along the picture's edge (a crop that cuts a wound)."""
    from scipy import ndimage

    out = np.asarray(image.convert("RGB")).copy()
    width = max(2, round(max(out.shape[:2]) / 300))
    for i in (int(v) for v in np.unique(labels) if v > 0):
        region = labels == i
        edge = region & ~ndimage.binary_erosion(region, iterations=width, border_value=0 if border else 1)
        out[edge] = session.PALETTE[(i - 1) % len(session.PALETTE)]
    return Image.fromarray(out)


def outlined(ws: Workspace, image_id: str, width: int = 720, height: int = 540) -> bytes:
    """:func:`letterboxed` with each outlined wound's contour drawn on the photo."""
    return _outlined(str(ws.root), image_id, width, height, _digest(ws, image_id))


@st.cache_resource(show_spinner=False, max_entries=8)
def _decoded(root: str, image_id: str, digest: str) -> tuple[Image.Image, np.ndarray]:
    """The photo and its label map, decoded once for the crops and zooms cut from them (never modified)."""
    ws = workspace()
    return ws.load_image(image_id), ws.load_mask(image_id)


def _part(image: Image.Image, labels: np.ndarray, box: tuple[int, int, int, int], width: int, height: int,
          outline: bool) -> bytes:
    """JPEG of the part ``box`` of a photo enlarged (or shrunk) into a width×height frame, the wounds'
    contours drawn at the frame's scale (a line of a few screen pixels however far it is enlarged)."""
    part = ImageOps.contain(image.crop(box), (width, height), Image.Resampling.BICUBIC)
    if outline:
        cut = Image.fromarray(np.ascontiguousarray(labels[box[1]:box[3], box[0]:box[2]], dtype=np.int32))
        part = outline_overlay(part, np.asarray(cut.resize(part.size, Image.Resampling.NEAREST)), border=False)
    return _frame(part, width, height, "JPEG")


@st.cache_data(show_spinner=False, max_entries=512)
def _wound_view(root: str, image_id: str, width: int, height: int, crop: bool, outline: bool,
                digest: str) -> tuple[bytes, int]:
    image, labels = _decoded(root, image_id, digest)
    box = session.wound_crop_box(labels, width / height) if crop else None
    count = len(workspace().store.wounds(image_id))
    if box is not None:
        return _part(image, labels, box, width, height, outline), count
    return _frame(outline_overlay(image, labels) if outline else image, width, height, "JPEG"), count


def wound_view(ws: Workspace, image_id: str, width: int, height: int, crop: bool = True,
               outline: bool = True) -> tuple[bytes, int]:
    """(JPEG bytes, number of wounds) of a photo letterboxed into width×height: cropped around its
    outlined wounds (``crop``; the whole photo when none is outlined) and enlarged, so a small wound
    fills about half the picture, their contours drawn (``outline``). Cached by content hash; JPEG
    keeps the bytes sent per question small."""
    return _wound_view(str(ws.root), image_id, width, height, crop, outline, _digest(ws, image_id))


@st.cache_data(show_spinner=False, max_entries=256)
def _zoom_view(root: str, image_id: str, magnification: float, centre: tuple[float, float] | None, width: int,
               height: int, outline: bool, digest: str) -> tuple[bytes, tuple[int, int, int, int]]:
    image, labels = _decoded(root, image_id, digest)
    box = session.zoom_box(image.size, session.wounds_box(labels), magnification, width / height, centre)
    return _part(image, labels, box, width, height, outline), box


def zoom_view(ws: Workspace, image_id: str, magnification: float, centre: tuple[float, float] | None = None,
              width: int = 1280, height: int = 960, outline: bool = True) -> tuple[bytes, tuple[int, int, int, int]]:
    """(JPEG bytes, box shown) of a zoom into a photo (:func:`annotations.accounts.session.zoom_box`: its wounds'
    box at ``magnification`` 1, 2× / 4× closer, the whole photo at 0; around ``centre``, default the
    wounds), enlarged into a width×height frame, contours drawn (``outline``). Cut server-side from the
    photo decoded once; cached by content hash."""
    return _zoom_view(str(ws.root), image_id, magnification, centre, width, height, outline, _digest(ws, image_id))


def data_uri(png: bytes) -> str:
    """A PNG as a ``data:`` URI."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
