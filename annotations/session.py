"""Page-independent logic behind the app: workspace choice, overview, outlines (accounts and
sign-in: :mod:`annotations.accounts`).

Nothing here imports Streamlit, so every rule the pages apply is testable on its own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from annotations.workspace import ENV_VAR, Workspace, outline_of, resolve_workspace

#: Where a wound's outline came from (wound metadata key ``origin``).
ORIGINS = ("drawn", "suggested", "edited", "import")
#: Actor of app writes whose caller names nobody; pages pass the signed-in annotator.
APP_ACTOR = "app"

#: Overview targets (store meta keys, defaults). The paper's expert answered 513 triplets.
TARGETS = {"target_expert_triplets": 513, "target_per_annotator": 100}


# -- workspace ---------------------------------------------------------------------------------
def workspace_root(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> Path:
    """The app's workspace: ``--workspace PATH`` after ``streamlit run app.py --``, else
    ``$TRIDERM_WORKSPACE``, else ``./workspace``."""
    path: str | None = None
    args = list(argv)
    for n, arg in enumerate(args):
        if arg == "--workspace" and n + 1 < len(args):
            path = args[n + 1]
        elif arg.startswith("--workspace="):
            path = arg.split("=", 1)[1]
    if path is None:
        path = environ.get(ENV_VAR) or None
    return resolve_workspace(path).resolve()


# -- overview -----------------------------------------------------------------------------------
def target(ws: Workspace, key: str) -> int:
    return int(ws.store.get_meta(key, TARGETS[key]))


def overview(ws: Workspace) -> dict[str, Any]:
    """Counts and progress toward the workspace's targets for the home page."""
    counts = ws.store.counts()
    n = counts["images"]
    combos = n * math.comb(max(n - 1, 0), 2)
    sources = ws.store.triplet_sources()
    return {
        **counts,
        "annotators": sorted(s.split(":", 1)[1] for s in sources if s.startswith("expert:")),
        "llm_models": sorted(s.split(":", 1)[1] for s in sources if s.startswith("llm:")),
        "progress": {
            "photos outlined": (counts["images_with_wounds"], n),
            "wounds described": (counts["described_wounds"], counts["wounds"]),
            "expert triplets": (counts["expert_triplets"], target(ws, "target_expert_triplets")),
            "LLM triplets (all combinations)": (counts["llm_triplets"], combos),
        },
    }


# -- outlines from the drawing canvas -------------------------------------------------------------
def _points_of_path(path: list) -> list[tuple[float, float]]:
    """Vertices of a Fabric.js path (M/L/Q/C commands; curves by their end and control points)."""
    pts: list[tuple[float, float]] = []
    for cmd in path:
        nums = [float(v) for v in cmd[1:]]
        pts.extend(zip(nums[0::2], nums[1::2]))
    return pts


def canvas_outlines(json_data: Mapping[str, Any] | None) -> list[list[tuple[float, float]]]:
    """Closed outlines (canvas pixels) of every polygon, freehand path or rectangle drawn."""
    outlines = []
    for obj in (json_data or {}).get("objects", []):
        kind = str(obj.get("type", "")).lower()
        if kind in ("polygon", "polyline"):
            pts = [(float(p["x"]), float(p["y"])) for p in obj.get("points", [])]
        elif kind == "path":
            pts = _points_of_path(obj.get("path") or [])
        elif kind == "rect":
            x, y = float(obj["left"]), float(obj["top"])
            w, h = float(obj["width"]) * obj.get("scaleX", 1), float(obj["height"]) * obj.get("scaleY", 1)
            outlines.append([(x, y), (x + w, y), (x + w, y + h), (x, y + h)])
            continue
        else:
            continue
        if len(pts) < 3:
            continue
        # Points are scene coordinates when drawn; an edited (moved/scaled) object shifts them.
        sw = float(obj.get("strokeWidth", 0) or 0)
        sx, sy = float(obj.get("scaleX", 1) or 1), float(obj.get("scaleY", 1) or 1)
        x0, y0 = min(p[0] for p in pts), min(p[1] for p in pts)
        left = float(obj.get("left", x0 - sw / 2))
        top = float(obj.get("top", y0 - sw / 2))
        if obj.get("originX") == "center":
            left -= (max(p[0] for p in pts) - x0 + sw) * sx / 2
        if obj.get("originY") == "center":
            top -= (max(p[1] for p in pts) - y0 + sw) * sy / 2
        outlines.append([(left + (x - x0 + sw / 2) * sx, top + (y - y0 + sw / 2) * sy) for x, y in pts])
    return outlines


def rasterise(outline: Sequence[tuple[float, float]], shape: tuple[int, int], scale: float = 1.0) -> np.ndarray:
    """Boolean H×W mask of the closed outline, its coordinates multiplied by ``scale``."""
    h, w = shape
    canvas = Image.new("L", (w, h), 0)
    ImageDraw.Draw(canvas).polygon([(x * scale, y * scale) for x, y in outline], fill=1, outline=1)
    return np.asarray(canvas, dtype=bool)


def add_wound(ws: Workspace, image_id: str, region: np.ndarray, wound_index: int | None = None,
              description: str = "", metadata: dict | None = None, *, actor: str = APP_ACTOR,
              origin: str = "drawn") -> int:
    """Write a drawn region into the photo's label mask and the store; returns the wound index.

    A new wound (``wound_index`` None) takes the next free index and only claims skin pixels,
    never another wound's; redrawing an existing wound replaces its outline. ``origin`` (one of
    :data:`ORIGINS`) is kept in the wound's metadata and the change in the revisions, under
    ``actor``. The mask and the row change in one store transaction, so concurrent editors and a
    re-import never lose each other's outlines. Raises ValueError when the region is empty or
    lies entirely on other wounds.
    """
    if origin not in ORIGINS:
        raise ValueError(f"origin must be one of {', '.join(ORIGINS)}, got {origin!r}")
    with ws.store.transaction():
        labels = ws.load_mask(image_id).copy()
        if region.shape != labels.shape:
            raise ValueError(f"outline is {region.shape}, photo {image_id} is {labels.shape}")
        existing = {w["wound_index"]: w for w in ws.store.wounds(image_id)}
        # Pixels of a label with no row are skin: a crash between a mask write and its commit.
        labels[~np.isin(labels, [0, *existing])] = 0
        if wound_index is None:
            wound_index = max([*existing, int(labels.max(initial=0))], default=0) + 1
        else:
            labels[labels == wound_index] = 0
        claim = region & (labels == 0)
        if not claim.any():
            raise ValueError("The outline is empty or lies entirely on wounds already outlined.")
        labels[claim] = wound_index
        outline = outline_of(labels, wound_index)
        old = existing.get(wound_index, {})
        meta = dict(metadata if metadata is not None else old.get("metadata") or {})
        meta["origin"] = origin
        ws.save_mask(image_id, labels)
        ws.store.upsert_wound(image_id, wound_index, outline["area"], outline["bbox"],
                              description if description else old.get("description", ""), meta,
                              actor=actor, outline=outline)
    return wound_index


def update_wound_text(ws: Workspace, image_id: str, wound_index: int, description: str, metadata: dict, *,
                      actor: str = APP_ACTOR, origin: str | None = None) -> None:
    """Save a wound's description and metadata, keeping its outline (and its ``origin`` unless
    a new one is given)."""
    if origin is not None and origin not in ORIGINS:
        raise ValueError(f"origin must be one of {', '.join(ORIGINS)}, got {origin!r}")
    with ws.store.transaction():
        wound = ws.store.wound(image_id, wound_index)
        if wound is None:
            raise KeyError(f"photo {image_id} has no wound {wound_index}")
        clean = {k: v for k, v in metadata.items() if v not in (None, "")}
        kept = origin or wound["metadata"].get("origin")
        if kept:
            clean["origin"] = kept
        ws.store.upsert_wound(image_id, wound_index, wound["area"], wound["bbox"], description.strip(), clean,
                              actor=actor)


def delete_wound(ws: Workspace, image_id: str, wound_index: int, *, actor: str = APP_ACTOR) -> None:
    """Remove a wound from the label mask and the store (other wounds keep their numbers); its
    outline, description and metadata stay in the revisions for a restore."""
    with ws.store.transaction():
        labels = ws.load_mask(image_id).copy()
        labels[labels == wound_index] = 0
        ws.save_mask(image_id, labels)
        ws.store.delete_wound(image_id, wound_index, actor=actor)


PALETTE = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
           (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40)]


def overlay(image: Image.Image, labels: np.ndarray, alpha: float = 0.4) -> Image.Image:
    """The photo with every wound tinted and outlined in its colour and numbered at its centre."""
    base = np.asarray(image.convert("RGB"), dtype=np.float32)
    out = base.copy()
    indices = [int(i) for i in np.unique(labels) if i > 0]
    for i in indices:
        colour = np.array(PALETTE[(i - 1) % len(PALETTE)], dtype=np.float32)
        m = labels == i
        out[m] = (1 - alpha) * base[m] + alpha * colour
        edge = m & ~(np.roll(m, 1, 0) & np.roll(m, -1, 0) & np.roll(m, 1, 1) & np.roll(m, -1, 1))
        out[edge] = colour
    result = Image.fromarray(out.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(result)
    size = max(12, min(result.size) // 18)
    for i in indices:
        ys, xs = np.nonzero(labels == i)
        cx, cy = float(xs.mean()), float(ys.mean())
        r = size * 0.75
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(255, 255, 255), outline=PALETTE[(i - 1) % len(PALETTE)],
                     width=max(2, size // 8))
        draw.text((cx, cy), str(i), fill=(0, 0, 0), anchor="mm", font_size=size)
    return result
