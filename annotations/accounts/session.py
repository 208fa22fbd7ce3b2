"""Page-independent logic behind the app: workspace choice, overview, outlines (accounts and
sign-in: :mod:`annotations.accounts`).

Nothing here imports Streamlit, so every rule the pages apply is testable on its own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from annotations.infra.workspace import ENV_VAR, Workspace, outline_of, outline_pixels, resolve_workspace
from annotations.io.formats import rasterize_rings
from annotations.store.history import restore_revision

#: Where a wound's outline came from (wound metadata key ``origin``).
ORIGINS = ("drawn", "suggested", "edited", "import")
#: Actor of app writes whose caller names nobody; pages pass the signed-in annotator.
APP_ACTOR = "app"

#: Personal defaults (store meta keys, defaults): the Triplets page's "my target" until an annotator sets one.
TARGETS = {"target_per_annotator": 100}
#: The study's goal of expert triplets (store meta key): each workspace sets its own, none by default.
STUDY_TARGET = "target_expert_triplets"


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
    """The workspace's goal ``key`` (see ``TARGETS``; stored in the workspace's settings)."""
    return int(ws.store.get_meta(key, TARGETS[key]))


def study_target(ws: Workspace) -> int | None:
    """The workspace's goal of expert triplets, or None when none is set."""
    value = ws.store.get_meta(STUDY_TARGET)
    return None if value is None else int(value)


def set_study_target(ws: Workspace, value: int | None) -> None:
    """Set the workspace's goal of expert triplets (None or 0: no goal); a negative goal is refused."""
    if value is not None and value < 0:
        raise ValueError(f"the study target must be a number of triplets ≥ 0, got {value}")
    ws.store.set_meta(STUDY_TARGET, value or None)


def overview(ws: Workspace) -> dict[str, Any]:
    """Counts and progress toward the workspace's targets for the home page (a goal of None: not set)."""
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
            "expert triplets": (counts["expert_triplets"], study_target(ws)),
            "LLM triplets (all combinations)": (counts["llm_triplets"], combos),
        },
    }


# -- outlines -----------------------------------------------------------------------------------------
def rasterise(outline: Sequence[tuple[float, float]], shape: tuple[int, int], scale: float = 1.0) -> np.ndarray:
    """Boolean H×W mask of the closed outline, its coordinates multiplied by ``scale``."""
    h, w = shape
    canvas = Image.new("L", (w, h), 0)
    ImageDraw.Draw(canvas).polygon([(x * scale, y * scale) for x, y in outline], fill=1, outline=1)
    return np.asarray(canvas, dtype=bool)


# -- outlines as polygons (derived for editing; the label map stays the stored truth) ----------------
# Polygon coordinates are continuous image coordinates: pixel (col, row) covers [col, col+1) × [row, row+1),
# so its centre is (col + 0.5, row + 0.5). The outline editor draws the photo over [0, W] × [0, H].
Point = tuple[float, float]


def mask_polygons(mask: np.ndarray, tolerance: float | None = None) -> list[list[Point]]:
    """Outer outlines of a boolean mask along its pixels' edges, one per connected part, simplified
    (Douglas–Peucker, ``tolerance`` px; default 1 px per 400 px of the longer side, at least 0.75 px).
    :func:`rasterise_outlines` of the result gives the mask back up to the simplification."""
    import cv2
    from shapely import unary_union
    from shapely.geometry import LineString, Polygon
    from shapely.geometry import Point as ShapelyPoint

    if tolerance is None:
        tolerance = max(0.75, max(mask.shape) / 400)
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    outlines = []
    for contour in contours:
        centres = contour.reshape(-1, 2).astype(float) + 0.5
        # the boundary pixels' centres and a half-pixel band around them: the pixels' outer edges
        if len(centres) == 1:
            band = ShapelyPoint(centres[0]).buffer(0.5, cap_style="square")
        else:
            band = LineString(np.vstack([centres, centres[:1]])).buffer(0.5, cap_style="square", join_style="mitre")
        inside = Polygon(centres).buffer(0) if len(centres) >= 3 else band
        exact = unary_union([inside, band])
        shape = exact.simplify(tolerance)
        if shape.area < 0.9 * exact.area:  # a part a few pixels across: simplifying would erase it
            shape = exact
        for part in getattr(shape, "geoms", [shape]):
            ring = list(part.exterior.coords)[:-1]
            if len(ring) >= 3:
                outlines.append([(round(x, 2), round(y, 2)) for x, y in ring])
    return outlines


def label_polygons(labels: np.ndarray) -> dict[int, list[list[Point]]]:
    """Editable outlines of every wound of a label map: {wound index: [polygon, ...]}."""
    return {int(i): mask_polygons(labels == i) for i in np.unique(labels) if i > 0}


def outline_problem(outline: Sequence[Point]) -> str | None:
    """Why an outline cannot be a wound (fewer than 3 vertices, self-intersecting), or None."""
    from shapely.geometry import Polygon
    from shapely.validation import explain_validity, make_valid

    if len(outline) < 3:
        return f"An outline needs at least 3 vertices; this one has {len(outline)}."
    poly = Polygon(outline)
    if make_valid(poly).area == 0:
        return "The outline encloses no area."
    if not poly.is_valid:
        return f"The outline crosses itself ({explain_validity(poly)}); move the vertices so that no edges cross."
    return None


def fill_outline(outline: Sequence[Point], shape: tuple[int, int]) -> np.ndarray:
    """Boolean H×W mask of the closed outline (image coordinates, see :func:`mask_polygons`) by the one
    rasterisation rule, :func:`annotations.io.formats.rasterize_rings` (pixel centre inside, even–odd; a
    centre on an edge by the top-left rule), so a vertex a fraction of a pixel off changes nothing."""
    mask = np.zeros(shape, dtype=bool)
    window, top, left = rasterize_rings([np.asarray(outline, dtype=float)], shape)
    mask[top:top + window.shape[0], left:left + window.shape[1]] = window
    return mask


def rasterise_outlines(outlines: Sequence[Sequence[Point]], shape: tuple[int, int]) -> np.ndarray:
    """Boolean H×W union of closed outlines in image coordinates (see :func:`fill_outline`).
    Raises ValueError, naming the outline, when one has < 3 vertices or crosses itself."""
    region = np.zeros(shape, dtype=bool)
    for n, outline in enumerate(outlines, start=1):
        problem = outline_problem(outline)
        if problem:
            raise ValueError(f"Outline {n}: {problem}" if len(outlines) > 1 else problem)
        region |= fill_outline(outline, shape)
    return region


@dataclass
class OutlinePlan:
    """A region about to be saved as wound ``wound_index`` (None: a new wound) of ``image_id``, with
    the pixels it shares with each other wound; overlaps must be resolved before it is written."""

    image_id: str
    wound_index: int | None
    region: np.ndarray
    origin: str
    overlaps: dict[int, int] = field(default_factory=dict)


def plan_outline(ws: Workspace, image_id: str, region: np.ndarray, wound_index: int | None = None,
                 origin: str = "drawn") -> OutlinePlan:
    """Check a region against the workspace's minimum wound area and find the wounds it overlaps.
    Raises ValueError (nothing written) when it is too small."""
    labels = ws.load_mask(image_id)
    if region.shape != labels.shape:
        raise ValueError(f"outline is {region.shape}, photo {image_id} is {labels.shape}")
    area, minimum = int(region.sum()), ws.min_wound_area
    if area < minimum:
        raise ValueError(f"The outline covers {area} px, less than this workspace's minimum wound area of "
                         f"{minimum} px. Nothing was saved.")
    others = labels[region & (labels > 0) & (labels != (wound_index or 0))]
    overlaps = {int(i): int(n) for i, n in zip(*np.unique(others, return_counts=True))}
    return OutlinePlan(image_id, wound_index, region, origin, overlaps)


def overlap_mask(ws: Workspace, plan: OutlinePlan) -> np.ndarray:
    """Pixels the planned region shares with other wounds."""
    labels = ws.load_mask(plan.image_id)
    return plan.region & (labels > 0) & (labels != (plan.wound_index or 0))


def wound_origin(wound: Mapping[str, Any]) -> str | None:
    """How a stored wound's outline was made (one of :data:`ORIGINS`), when recorded."""
    return (wound.get("metadata") or {}).get("origin")


def edit_origin(previous: str | None) -> str:
    """Origin of an outline after the clinician changed it: a hand-drawn one stays drawn, any other
    (a model's suggestion, an imported outline) becomes edited."""
    return "drawn" if previous in (None, "drawn") else "edited"


def apply_outline(ws: Workspace, plan: OutlinePlan, keeps: Mapping[int, bool], actor: str = APP_ACTOR) -> int:
    """Write a planned outline; ``keeps[j]`` says whether the planned wound keeps the pixels it shares
    with wound j (True: they are taken from j; False: they stay with j). Every overlap must have a
    decision, no wound may end below the minimum area; otherwise ValueError and nothing is written.
    Returns the saved wound's index."""
    missing = sorted(set(plan.overlaps) - set(keeps))
    if missing:
        raise ValueError(f"Decide which wound keeps the overlap with wound(s) {', '.join(map(str, missing))}.")
    labels = ws.load_mask(plan.image_id)
    region = plan.region.copy()
    shrunk: dict[int, np.ndarray] = {}
    for other in plan.overlaps:
        if keeps[other]:
            shrunk[other] = (labels == other) & ~region
        else:
            region &= labels != other
    minimum = ws.min_wound_area
    for other, rest in shrunk.items():
        if rest.sum() < minimum:
            raise ValueError(f"Wound {other} would be left with {int(rest.sum())} px, less than the minimum "
                             f"wound area of {minimum} px. Delete wound {other} or keep its pixels with it.")
    if region.sum() < minimum:
        raise ValueError(f"Without the overlap the outline covers {int(region.sum())} px, less than the minimum "
                         f"wound area of {minimum} px. Nothing was saved.")
    origins = {w["wound_index"]: wound_origin(w) for w in ws.store.wounds(plan.image_id)}
    for other, rest in shrunk.items():
        add_wound(ws, plan.image_id, rest, wound_index=other, actor=actor, origin=edit_origin(origins.get(other)))
    return add_wound(ws, plan.image_id, region, wound_index=plan.wound_index, actor=actor, origin=plan.origin)


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
        assert outline is not None  # the claim above is not empty
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


def delete_wound(ws: Workspace, image_id: str, wound_index: int, *, actor: str = APP_ACTOR) -> int | None:
    """Remove a wound from the label mask and the store (other wounds keep their numbers); its
    outline pixels, description and metadata stay in its ``delete`` revision, whose id is returned
    (None when the wound did not exist) for :func:`undo_delete`."""
    with ws.store.transaction():
        labels = ws.load_mask(image_id).copy()
        outline = outline_of(labels, wound_index)
        labels[labels == wound_index] = 0
        ws.save_mask(image_id, labels)
        return ws.store.delete_wound(image_id, wound_index, actor=actor, outline=outline)


def undo_delete(ws: Workspace, revision_id: int, *, actor: str = APP_ACTOR) -> int:
    """Put back the wound that :func:`delete_wound` removed in revision ``revision_id``: its exact outline,
    description and metadata under its number (recorded as a ``restore``); returns the number. Raises
    ValueError, and changes nothing, when the revision is not a wound's deletion, the number is taken again
    or another wound now covers some of its pixels."""
    rev = ws.store.revision(revision_id)
    if rev is None or (rev["entity"], rev["field"], rev["action"]) != ("wounds", "row", "delete"):
        raise ValueError(f"revision #{revision_id} is not a wound's deletion: nothing to undo")
    image_id, index = rev["key"]["image_id"], int(rev["key"]["wound_index"])
    outline = rev["old"]["outline"]
    with ws.store.transaction():
        if ws.store.wound(image_id, index) is not None:
            raise ValueError(f"Not restored: wound {index} of {image_id} exists again (its number is taken).")
        if "png" not in outline:
            raise ValueError(f"Not restored: the deletion of wound {index} of {image_id} kept no outline pixels.")
        x0, y0, x1, y1 = outline["bbox"]
        taken = ws.load_mask(image_id)[y0:y1, x0:x1][outline_pixels(outline)]
        others = sorted({int(i) for i in taken if i > 0})
        if others:
            raise ValueError(f"Not restored: wound {index} of {image_id} now overlaps wound(s) "
                             f"{', '.join(map(str, others))}; restore it from the history after moving them.")
        restore_revision(ws, revision_id, actor)
    return index


#: The outline worklist's filters (pages/1_Wound_masks.py), in the order the page offers them.
WORKLIST_FILTERS = ("All photos", "Not outlined", "Suggestions waiting", "Not marked done", "Mine")


def worklist_ids(rows: Sequence[Mapping[str, Any]], shown: str, waiting: set[str] | frozenset[str] = frozenset()
                 ) -> list[str]:
    """The photo ids of :meth:`annotations.store.store.Store.worklist` rows that filter ``shown`` keeps (one of
    :data:`WORKLIST_FILTERS`); ``waiting``: photos with suggestions not yet accepted or rejected."""
    keep = {"All photos": lambda r: True, "Not outlined": lambda r: not r["wounds"],
            "Suggestions waiting": lambda r: r["image_id"] in waiting,
            "Not marked done": lambda r: r["done_by"] is None, "Mine": lambda r: r["mine"]}.get(shown)
    if keep is None:
        raise ValueError(f"worklist filter must be one of {', '.join(WORKLIST_FILTERS)}, got {shown!r}")
    return [r["image_id"] for r in rows if keep(r)]


def step(order: Sequence[str], current: str, within: Sequence[str], forward: bool = True,
         wrap: bool = False) -> str | None:
    """The photo of ``within`` after (``forward``) or before ``current`` in ``order`` (``current`` need not be
    in ``within``); with ``wrap`` the search goes round the end. None when there is none but ``current``."""
    place = {image_id: n for n, image_id in enumerate(order)}
    here = place.get(current, -1 if forward else len(order))
    ranked = sorted((place[i] for i in within if i in place and i != current), reverse=not forward)
    ahead = [n for n in ranked if (n > here if forward else n < here)]
    if ahead or not wrap:
        return order[ahead[0]] if ahead else None
    return order[ranked[0]] if ranked else None


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


Box = tuple[int, int, int, int]
#: Zoom choices of a photo: the wounds' box fitted to the view (×1), magnified 2× and 4× from there, and the
#: whole photo (0).
ZOOM_LEVELS = {"Wounds": 1.0, "2×": 2.0, "4×": 4.0, "Whole photo": 0.0}


def wounds_box(labels: np.ndarray) -> Box | None:
    """(left, top, right, bottom) of every outlined pixel of ``labels`` (right / bottom exclusive); None when
    nothing is outlined."""
    ys, xs = np.nonzero(labels > 0)
    if not len(xs):
        return None
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def _window(size: tuple[int, int], centre: tuple[float, float], bw: float, aspect: float) -> Box:
    """A ``bw``-wide window of ``aspect`` around ``centre``, moved inside the photo of ``size`` (width,
    height); cut to the photo along a side where it is larger than the photo."""
    w, h = size
    bh = bw / aspect
    left = min(max(0.0, centre[0] - bw / 2), w - bw) if bw <= w else 0.0
    top = min(max(0.0, centre[1] - bh / 2), h - bh) if bh <= h else 0.0
    return round(left), round(top), round(min(w, left + bw)), round(min(h, top + bh))


def fit_width(box: Box, aspect: float, margin: float, min_side: int) -> float:
    """The width of the ``aspect`` window holding ``box`` with ``margin`` × its extent on each side, and at
    least ``min_side`` pixels wide and high (a speck of a wound is not blown up past its pixels)."""
    grow = 1 + 2 * margin
    return max((box[2] - box[0]) * grow, (box[3] - box[1]) * grow * aspect, min_side, min_side * aspect)


def wound_crop_box(labels: np.ndarray, aspect: float = 4 / 3, margin: float = 0.5,
                   min_side: int = 32) -> Box | None:
    """(left, top, right, bottom) of a crop of the ``aspect`` (width / height) around every wound of
    ``labels``, with ``margin`` × the wounds' extent on each side (so a small wound fills about half the
    crop, however small the photo shows it: the page enlarges the crop), at least ``min_side`` pixels each
    way and inside the photo (moved inward at an edge, never shrunk); the whole photo when the wounds do
    not fit such a crop; None when nothing is outlined."""
    box = wounds_box(labels)
    if box is None:
        return None
    h, w = labels.shape
    bw = min(fit_width(box, aspect, margin, min_side), w, h * aspect)
    if bw < box[2] - box[0] or bw / aspect < box[3] - box[1]:
        return 0, 0, w, h
    return _window((w, h), ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2), bw, aspect)


def zoom_box(size: tuple[int, int], wounds: Box | None, magnification: float, aspect: float = 4 / 3,
             centre: tuple[float, float] | None = None, margin: float = 0.25, min_side: int = 24) -> Box:
    """The part of a photo of ``size`` (width, height) a zoom shows: at ``magnification`` 1 the ``wounds``'
    box with ``margin`` × its extent on each side at ``aspect`` (the whole photo when nothing is outlined),
    ``magnification`` times smaller for 2× / 4× (never under ``min_side`` pixels), around ``centre`` (default:
    the wounds' centre) and moved inside the photo; 0 shows the whole photo."""
    w, h = size
    if magnification < 0:
        raise ValueError(f"zoom magnification must be ≥ 0, got {magnification}")
    if magnification == 0:
        return 0, 0, w, h
    whole = max(w, h * aspect)  # the window that shows the whole photo
    base = whole if wounds is None else min(fit_width(wounds, aspect, margin, 0), whole)
    bw = max(base / magnification, min(min_side, w, h) * aspect)
    if centre is None:
        centre = (w / 2, h / 2) if wounds is None else ((wounds[0] + wounds[2]) / 2, (wounds[1] + wounds[3]) / 2)
    return _window(size, centre, bw, aspect)


def panned(box: Box, dx: int, dy: int) -> tuple[float, float]:
    """The centre of ``box`` moved by ``dx`` / ``dy`` half windows (right / down positive): a pan step."""
    return (box[0] + box[2]) / 2 + dx * (box[2] - box[0]) / 2, (box[1] + box[3]) / 2 + dy * (box[3] - box[1]) / 2
