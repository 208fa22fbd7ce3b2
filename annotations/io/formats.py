"""Outlines in the formats other tools read: COCO (polygons or RLE) and GeoJSON.

(Reading other tools' exports — COCO, GeoJSON, Label Studio JSON, CVAT XML — is
:mod:`annotations.io.convert`.)

Coordinates are image pixels, x to the right and y down, with pixel (col, row) the unit square
[col, col+1] × [row, row+1] (COCO's convention): a wound's outline is the exact boundary of its
pixels (the union of its row runs, by shapely), so rasterising it back — a pixel is inside when its
centre is, by the one rule of :func:`rasterize_rings` — gives the label map again.

- **COCO** (``annotations.json``): one category per label (a wound's ``label`` metadata, default
  ``wound``; ids 1, 2, … in order of first use); each wound an annotation with ``segmentation`` as
  polygons (outer rings) or as compressed RLE (pycocotools, column-major as COCO defines it; ``iscrowd``
  0), ``area`` in pixels, ``bbox`` [x, y, w, h], and the TriDerm keys ``triderm_image_id``/
  ``triderm_wound_index``. COCO polygons cannot hold holes, so a wound with a hole is RLE in the
  polygon export (``coco``) too; ``coco-rle`` writes every wound as RLE.
- **GeoJSON** (``<image_id>.geojson``, one FeatureCollection per photo, as QuPath imports
  them): each wound a Polygon or MultiPolygon Feature (holes as interior rings) with properties
  ``image_id``, ``wound_index``, ``description``, ``area_px`` and QuPath's ``objectType``/``classification``
  (``name``: the wound's label).
- **Label Studio** (``tasks.json`` and ``label_config.xml``): one task per photo, its image a URL
  (default ``/data/local-files/?d=images/<file>``: Label Studio's local files, see :data:`LS_LOCAL_FILES`)
  and ``triderm_image_id``; its wounds one prediction (pre-annotations) of
  ``polygonlabels`` results (points in percent of ``original_width``/``original_height``), or
  ``brushlabels`` (Label Studio's brush RLE) for a wound with holes or several parts, which one
  polygon cannot hold. Each region's id is ``wound-N`` (its wound index), its label the wound's
  label, its ``meta.text`` the description; ``label_config.xml``
  is a labeling configuration with those labels (``Image`` ``image``, ``PolygonLabels`` ``outline``,
  ``BrushLabels`` ``brush``). ``python -m annotations convert --from labelstudio`` reads Label Studio's
  JSON export of such a project back.

Source ids: :mod:`annotations.io.convert` keeps the id a photo and an outline had in the file it read (image
metadata ``source_image_id``: COCO image id, Label Studio task id, CVAT image id; wound metadata
``source_id``: COCO annotation id, Label Studio region id, GeoJSON feature id), so results can be merged
back. The export writes them where the format has a field: COCO ``id`` (images, annotations) when every
item has a whole-number source id ≥ 0 and none repeats, else fresh ids 1, 2, …; either way each item with a
source id also carries ``attributes: {"source_id": …}`` (Datumaro's COCO reader, which CVAT uses, keeps an annotation's ``attributes``), which
convert prefers; GeoJSON the feature's ``id`` and the property ``source_image_id``; Label Studio (whose
task and region ids are its own) the task's ``data.source_image_id`` and the region's ``meta.source_id``.
A workspace without them exports as before (fresh ids, no ``attributes``).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote
from xml.sax.saxutils import quoteattr

import numpy as np
import shapely
from shapely.geometry import MultiPolygon, Polygon, mapping

from annotations.infra.fileio import write_text
from annotations.infra.workspace import Workspace

#: The default URL prefix of the photos in Label Studio tasks: its local files (``/data/local-files/?d=``),
#: below a document root (``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT``) that is the workspace's folder, whose
#: ``images/`` is the project's local-files storage (Label Studio serves files only below a storage, and
#: refuses a storage that is the document root itself).
LS_LOCAL_FILES = "/data/local-files/?d=images/"
#: The names of the Label Studio tags of :func:`labelstudio_config`: the photo, polygons, brush masks.
LS_IMAGE, LS_POLYGON, LS_BRUSH = "image", "outline", "brush"
LS_MODEL_VERSION = "triderm-export"
#: A wound's label when its metadata gives none (the one COCO category of a workspace without labels).
DEFAULT_LABEL = "wound"


def mask_geometry(mask: np.ndarray) -> Polygon | MultiPolygon:
    """Exact outline of a bool mask's pixels (holes kept), vertices only at corners."""
    m = np.pad(np.asarray(mask, bool), ((0, 0), (1, 1)))
    d = np.diff(m.astype(np.int8), axis=1)
    rows, starts = np.nonzero(d == 1)
    _, ends = np.nonzero(d == -1)
    if not len(rows):
        return Polygon()
    boxes = shapely.box(starts, rows, ends, rows + 1)
    return shapely.simplify(shapely.union_all(boxes), 0)


def polygons(geometry: Polygon | MultiPolygon) -> list[Polygon]:
    """The non-empty polygons of a (multi)polygon."""
    return list(geometry.geoms) if isinstance(geometry, MultiPolygon) else [geometry] if not geometry.is_empty else []


def coco_polygons(geometry: Polygon | MultiPolygon) -> list[list[float]]:
    """COCO ``segmentation`` polygons: each outer ring flattened to [x1, y1, x2, y2, …] (closing point dropped)."""
    return [[float(c) for xy in p.exterior.coords[:-1] for c in xy] for p in polygons(geometry)]


#: Crossings (or pixels) handled at once by :func:`rasterize_rings`: its working memory is about 40 bytes
#: for each of them.
RASTER_CHUNK = 1 << 20


def rasterize(geometry: Polygon | MultiPolygon, shape: tuple[int, int]) -> np.ndarray:
    """Bool mask of the pixels inside ``geometry`` by the one rasterisation rule (:func:`rasterize_rings`)."""
    out = np.zeros(shape, bool)
    window, top, left = rasterize_window(geometry, shape)
    out[top:top + window.shape[0], left:left + window.shape[1]] = window
    return out


def rasterize_window(geometry: Polygon | MultiPolygon, shape: tuple[int, int]) -> tuple[np.ndarray, int, int]:
    """:func:`rasterize` within the geometry's bounding box (clipped to ``shape``): the box's mask and
    its top row and left column (the rings of every part, holes included, filled even–odd)."""
    rings = [np.asarray(r.coords, float) for p in polygons(geometry) for r in (p.exterior, *p.interiors)]
    return rasterize_rings(rings, shape)


def rasterize_rings(rings: list[np.ndarray], shape: tuple[int, int]) -> tuple[np.ndarray, int, int]:
    """The pixels inside closed rings (n×2 arrays of x, y; even–odd rule), within their bounding box
    clipped to ``shape``: the box's mask, its top row and its left column.

    The one rasterisation rule of TriDerm (convert, the outline editor, anything drawn from a polygon):
    pixel (col, row) is inside when its centre (col + ½, row + ½) is inside the outline; a centre lying
    exactly on an edge is inside when the outline's inside lies to its right, or, on a horizontal edge,
    below it (the "top-left" rule: as if the centre were nudged infinitesimally right and, far less,
    down). So outlines sharing an edge tile the photo without a gap or an overlap, an outline along
    pixel corners (our exports) gives exactly its pixels, and a polygon with whole-number vertices
    keeps its area. Scanline: each edge crosses the rows whose centre height lies in
    [its lower y, its upper y), and a row is filled from each crossing to the next (centres in [a, b))."""
    edges = [np.stack([r[:-1], r[1:]], 1) if len(r) and (r[0] == r[-1]).all()
             else np.stack([r, np.roll(r, -1, 0)], 1) for r in rings if len(r) >= 3]
    if not edges:
        return np.zeros((0, 0), bool), 0, 0
    seg = np.concatenate(edges)  # (n, 2 ends, x y)
    y0, y1 = seg[:, 0, 1], seg[:, 1, 1]
    keep = y0 != y1  # horizontal edges cross no row
    (x0, y0), (x1, y1) = seg[keep, 0].T, seg[keep, 1].T
    lo, hi = np.minimum(y0, y1), np.maximum(y0, y1)
    first = np.ceil(lo - 0.5).astype(np.int64)  # rows r with lo <= r + 0.5 < hi
    end = np.ceil(hi - 0.5).astype(np.int64)
    xs_all = seg[:, :, 0]
    top, bottom = max(0, int(first.min(initial=0))), min(shape[0], int(end.max(initial=0)))
    left = max(0, int(np.ceil(xs_all.min() - 0.5)))
    right = min(shape[1], int(np.ceil(xs_all.max() - 0.5)))
    if bottom <= top or right <= left or not len(first):
        return np.zeros((0, 0), bool), 0, 0
    width = right - left
    out = np.zeros((bottom - top, width), bool)
    height = bottom - top
    # bands of rows holding about RASTER_CHUNK crossings and pixels each (a row's crossings: the edges over it)
    starts = np.bincount(np.clip(first - top, 0, height), minlength=height + 1)
    ends = np.bincount(np.clip(end - top, 0, height), minlength=height + 1)
    load = np.cumsum(np.cumsum(starts - ends)[:height] + width)
    cuts = np.searchsorted(load, np.arange(RASTER_CHUNK, int(load[-1]), RASTER_CHUNK), side="right")
    bounds = np.unique(np.concatenate([[0], cuts, [height]])) + top
    slope = (x1 - x0) / (y1 - y0)
    for band, band_end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        near = (first < band_end) & (end > band)
        a, b = np.maximum(first[near], band), np.minimum(end[near], band_end)
        span = b - a
        k = np.repeat(np.arange(len(span)), span)
        rows = a[k] + np.arange(len(k)) - np.repeat(np.cumsum(span) - span, span)
        ex0, ey0, eslope = x0[near][k], y0[near][k], slope[near][k]
        xs = ex0 + (rows + 0.5 - ey0) * eslope
        order = np.lexsort((xs, rows))
        rows, xs = rows[order], xs[order]
        # crossings pair up within each row (closed rings); centres c + 0.5 in [a, b)
        c0 = np.clip(np.ceil(xs[0::2] - 0.5).astype(np.int64) - left, 0, width)
        c1 = np.clip(np.ceil(xs[1::2] - 0.5).astype(np.int64) - left, 0, width)
        diff = np.zeros((band_end - band, width + 1), np.int32)
        r = rows[0::2] - band
        np.add.at(diff, (r, c0), 1)
        np.add.at(diff, (r, c1), -1)
        out[band - top:band_end - top] = np.cumsum(diff, axis=1)[:, :width] > 0
    return out, top, left


def rle_encode(mask: np.ndarray) -> dict[str, Any]:
    """COCO compressed RLE ``{"size": [h, w], "counts": str}`` of a bool mask (pycocotools)."""
    from pycocotools import mask as mask_utils

    rle = mask_utils.encode(np.asfortranarray(np.asarray(mask, np.uint8)))
    return {"size": [int(s) for s in rle["size"]], "counts": rle["counts"].decode("ascii")}


def _wounds(ws: Workspace) -> list[tuple[dict, list[tuple[dict, np.ndarray]]]]:
    """(image row, [(wound row, its bool mask)]) for every photo, wounds in index order."""
    by_image: dict[str, list[dict]] = {}
    for w in ws.store.wounds():
        by_image.setdefault(w["image_id"], []).append(w)
    out = []
    for img in ws.store.images():
        labels = ws.load_mask(img["image_id"]) if img["image_id"] in by_image else None
        pairs = [(w, labels == w["wound_index"]) for w in by_image.get(img["image_id"], [])]
        out.append((img, [(w, m) for w, m in pairs if m.any()]))
    return out


def wound_label(wound: dict) -> str:
    """A wound's label: its ``label`` metadata (kept by convert and import), else :data:`DEFAULT_LABEL`."""
    label = (wound.get("metadata") or {}).get("label")
    return str(label) if label not in (None, "") else DEFAULT_LABEL


def source_id(row: dict, key: str = "source_id") -> int | str | None:
    """The id a photo (``source_image_id``) or wound (``source_id``) had in the file it was converted
    from (its metadata), or None."""
    value = (row.get("metadata") or {}).get(key)
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) and value != "" else None


def _coco_ids(kept: list[int | str | None]) -> list[int]:
    """COCO ids for items whose source ids are ``kept``: those ids when every item has one, each a whole
    number ≥ 0 (Label Studio's COCO export starts at 0) and none twice; else 1, 2, 3 and so on."""
    whole = [k for k in kept if isinstance(k, int) and k >= 0]
    if kept and len(whole) == len(kept) and len(set(whole)) == len(whole):
        return whole
    return list(range(1, len(kept) + 1))


def _with_source(item: dict[str, Any], kept: int | str | None) -> dict[str, Any]:
    return {**item, "attributes": {"source_id": kept}} if kept is not None else item


def coco_document(ws: Workspace, rle: bool = False) -> dict[str, Any]:
    """The workspace's outlines as one COCO instance-segmentation document (see the module's docstring:
    categories from the wounds' labels, source ids kept, a wound with holes as RLE)."""
    photos = _wounds(ws)
    image_ids = _coco_ids([source_id(img, "source_image_id") for img, _ in photos])
    pairs = [(img, w, mask, coco_image) for (img, wounds), coco_image in zip(photos, image_ids) for w, mask in wounds]
    ann_ids = _coco_ids([source_id(w) for _, w, _, _ in pairs])
    categories: dict[str, int] = {}
    for _, w, _, _ in pairs:
        categories.setdefault(wound_label(w), len(categories) + 1)
    images = [_with_source({"id": n, "file_name": img["file"], "width": img["width"], "height": img["height"],
                            "triderm_image_id": img["image_id"]}, source_id(img, "source_image_id"))
              for (img, _), n in zip(photos, image_ids)]
    annotations = []
    for (img, w, mask, coco_image), n in zip(pairs, ann_ids):
        ys, xs = np.nonzero(mask)
        x0, y0 = int(xs.min()), int(ys.min())
        geometry = None if rle else mask_geometry(mask)
        holes = geometry is not None and any(p.interiors for p in polygons(geometry))
        seg = rle_encode(mask) if geometry is None or holes else coco_polygons(geometry)
        annotations.append(_with_source(
            {"id": n, "image_id": coco_image, "category_id": categories[wound_label(w)], "segmentation": seg,
             "area": int(mask.sum()), "bbox": [x0, y0, int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0], "iscrowd": 0,
             "triderm_image_id": img["image_id"], "triderm_wound_index": w["wound_index"],
             "description": w["description"]}, source_id(w)))
    info = {"description": f"TriDerm Studio outlines of {ws.dataset_name}"
            + (" (SYNTHETIC phantom data)" if ws.is_synthetic else ""),
            "date_created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    return {"info": info, "images": images, "annotations": annotations,
            "categories": [{"id": k, "name": name, "supercategory": DEFAULT_LABEL}
                           for name, k in (categories or {DEFAULT_LABEL: 1}).items()]}


def geojson_documents(ws: Workspace) -> dict[str, dict[str, Any]]:
    """image_id → a GeoJSON FeatureCollection of its outlined wounds (photos without wounds left out)."""
    out = {}
    for img, wounds in _wounds(ws):
        if not wounds:
            continue
        features = []
        for w, mask in wounds:
            props = {"image_id": img["image_id"], "wound_index": w["wound_index"], "description": w["description"],
                     "area_px": int(mask.sum()), "objectType": "annotation", "classification": {"name": wound_label(w)}}
            if source_id(img, "source_image_id") is not None:
                props["source_image_id"] = source_id(img, "source_image_id")
            kept = source_id(w)
            features.append({"type": "Feature", **({"id": kept} if kept is not None else {}),
                             "geometry": mapping(mask_geometry(mask)), "properties": props})
        out[img["image_id"]] = {"type": "FeatureCollection", "features": features}
    return out


def labelstudio_config(labels: Sequence[str]) -> str:
    """A Label Studio labeling configuration for TriDerm's tasks: the photo, polygons and brush masks,
    each with ``labels``."""
    choices = "".join(f"<Label value={quoteattr(label)}/>" for label in labels)
    return (f'<View>\n  <Image name="{LS_IMAGE}" value="$image" zoom="true"/>\n'
            f'  <PolygonLabels name="{LS_POLYGON}" toName="{LS_IMAGE}">{choices}</PolygonLabels>\n'
            f'  <BrushLabels name="{LS_BRUSH}" toName="{LS_IMAGE}">{choices}</BrushLabels>\n</View>\n')


#: Label Studio's run-length sizes in bits (its SDK's ``encode_rle``): runs of up to 8, 16, 256 and 65,536 words.
BRUSH_RLE_SIZES = (3, 4, 8, 16)


def encode_brush_rle(mask: np.ndarray) -> list[int]:
    """A bool mask (H×W) as Label Studio's brush RLE of H×W RGBA words (wound pixels 255 in all four
    channels, others 0; what its brush and its SDK's ``mask2rle`` write): the stream
    :func:`annotations.io.convert.decode_brush_rle` reads, every chunk a repeated word (row-major runs of the mask × 4)."""
    flat = np.asarray(mask, bool).ravel()
    if not flat.size:
        raise ValueError("an empty mask has no brush RLE")
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    starts = np.concatenate([[0], edges])
    lengths = np.diff(np.concatenate([starts, [flat.size]])) * 4
    bits = [f"{flat.size * 4:032b}", f"{7:05b}", *(f"{s - 1:04b}" for s in BRUSH_RLE_SIZES)]
    for start, length in zip(starts.tolist(), lengths.tolist()):
        word = f"{255 if flat[start] else 0:08b}"
        while length:
            run = min(length, 1 << BRUSH_RLE_SIZES[-1])
            size = next(k for k, s in enumerate(BRUSH_RLE_SIZES) if run <= 1 << s)
            bits.append(f"1{size:02b}{run - 1:0{BRUSH_RLE_SIZES[size]}b}{word}")
            length -= run
    stream = "".join(bits)
    stream += "0" * (-len(stream) % 8)
    return list(int(stream, 2).to_bytes(len(stream) // 8, "big"))


def labelstudio_region(mask: np.ndarray, label: str, polygon: str | None = LS_POLYGON, brush: str | None = LS_BRUSH,
                       to_name: str = LS_IMAGE) -> dict[str, Any]:
    """One wound (bool H×W) as a Label Studio result: a ``polygonlabels`` polygon (its exact pixel
    outline, in percent) from the tag ``polygon`` when that outline is one ring, else a ``brushlabels``
    brush RLE from the tag ``brush``; a wound no given tag can hold is a ValueError."""
    h, w = mask.shape
    geometry = mask_geometry(mask)
    head = {"to_name": to_name, "original_width": int(w), "original_height": int(h), "image_rotation": 0}
    if polygon is not None and isinstance(geometry, Polygon) and not geometry.interiors:
        points = [[x * 100 / w, y * 100 / h] for x, y in geometry.exterior.coords[:-1]]
        return {**head, "from_name": polygon, "type": "polygonlabels",
                "value": {"points": points, "closed": True, "polygonlabels": [label]}}
    if brush is None:
        raise ValueError("a wound with holes or several parts needs a BrushLabels tag (one polygon cannot hold it)")
    return {**head, "from_name": brush, "type": "brushlabels",
            "value": {"format": "rle", "rle": encode_brush_rle(mask), "brushlabels": [label]}}


def labelstudio_tasks(ws: Workspace, image_prefix: str = LS_LOCAL_FILES) -> tuple[list[dict[str, Any]], list[str]]:
    """The workspace as Label Studio tasks (one a photo, its wounds one prediction; see the module's
    docstring) and the labels they use. A photo's URL is ``image_prefix`` + its URL-quoted file name."""
    tasks: list[dict[str, Any]] = []
    labels: dict[str, None] = {}
    for img, wounds in _wounds(ws):
        results = []
        for w, mask in wounds:
            label = wound_label(w)
            labels[label] = None
            region = {"id": f"wound-{w['wound_index']}", **labelstudio_region(mask, label)}
            meta = {**({"text": [w["description"]]} if w["description"] else {}),
                    **({"source_id": source_id(w)} if source_id(w) is not None else {})}
            results.append({**region, "meta": meta} if meta else region)
        task: dict[str, Any] = {"data": {"image": image_prefix + quote(img["file"]),
                                         "triderm_image_id": img["image_id"]}}
        if source_id(img, "source_image_id") is not None:
            task["data"]["source_image_id"] = source_id(img, "source_image_id")
        if results:
            task["predictions"] = [{"model_version": LS_MODEL_VERSION, "result": results}]
        tasks.append(task)
    return tasks, list(labels) or [DEFAULT_LABEL]


def write_labelstudio(ws: Workspace, out: Path, image_prefix: str = LS_LOCAL_FILES) -> dict[str, Any]:
    """Write ``tasks.json`` and ``label_config.xml`` (photos at ``image_prefix`` + file name) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tasks, labels = labelstudio_tasks(ws, image_prefix)
    write_text(out / "tasks.json", json.dumps(tasks) + "\n")
    write_text(out / "label_config.xml", labelstudio_config(labels))
    return {"format": "labelstudio", "images": len(tasks), "wounds": sum(len(p["result"]) for t in tasks
                                                                       for p in t.get("predictions", [])),
            "out": str(out / "tasks.json"), "label_config": str(out / "label_config.xml")}


def write_geojson(ws: Workspace, out: Path) -> dict[str, Any]:
    """Write one ``<image_id>.geojson`` per photo into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    docs = geojson_documents(ws)
    for image_id, doc in docs.items():
        write_text(out / f"{image_id}.geojson", json.dumps(doc) + "\n")
    return {"format": "geojson", "images": len(docs), "wounds": sum(len(d["features"]) for d in docs.values()),
            "out": str(out)}


def write_coco(ws: Workspace, out: Path, rle: bool = False) -> dict[str, Any]:
    """Write ``annotations.json`` (COCO; every wound as RLE with ``rle``) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    doc = coco_document(ws, rle=rle)
    write_text(out / "annotations.json", json.dumps(doc) + "\n")
    return {"format": "coco-rle" if rle else "coco", "images": len(doc["images"]), "wounds": len(doc["annotations"]),
            "out": str(out / "annotations.json")}
