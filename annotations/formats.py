"""Outlines in the formats other tools read: COCO (polygons or RLE) and GeoJSON.

(Reading other tools' exports — COCO, GeoJSON, Label Studio JSON, CVAT XML — is
:mod:`annotations.convert`.)

Coordinates are image pixels, x to the right and y down, with pixel (col, row) the unit square
[col, col+1] × [row, row+1] (COCO's convention): a wound's outline is the exact boundary of its
pixels (the union of its row runs, by shapely), so rasterising it back — a pixel is inside when its
centre is — gives the label map again.

- **COCO** (``annotations.json``): one ``wound`` category; each wound an annotation with
  ``segmentation`` as polygons (outer rings; COCO polygons cannot hold holes — use RLE for wounds
  with holes) or as compressed RLE (pycocotools, column-major as COCO defines it), ``area`` in
  pixels, ``bbox`` [x, y, w, h], and the TriDerm keys ``triderm_image_id``/``triderm_wound_index``.
- **GeoJSON** (``<image_id>.geojson``, one FeatureCollection per photo, as QuPath imports
  them): each wound a Polygon or MultiPolygon Feature (holes as interior rings) with properties
  ``image_id``, ``wound_index``, ``description``, ``area_px`` and QuPath's ``objectType``/``classification``.

Label Studio reads neither file directly: it imports its own JSON tasks, which its converter makes
from the COCO file (``label-studio-converter import coco -i annotations.json -o tasks.json``).
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import shapely
from shapely.geometry import MultiPolygon, Polygon, mapping

from annotations.fileio import write_text
from annotations.workspace import Workspace

FORMATS = ("coco", "coco-rle", "geojson")
CATEGORY = {"id": 1, "name": "wound", "supercategory": "wound"}


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


#: Pixels tested at once by :func:`rasterize` (its working memory is about 40 bytes a pixel of this).
RASTER_CHUNK = 1 << 20


def rasterize(geometry: Polygon | MultiPolygon, shape: tuple[int, int]) -> np.ndarray:
    """Bool mask of the pixels whose centre lies inside ``geometry``."""
    out = np.zeros(shape, bool)
    window, top, left = rasterize_window(geometry, shape)
    out[top:top + window.shape[0], left:left + window.shape[1]] = window
    return out


def rasterize_window(geometry: Polygon | MultiPolygon, shape: tuple[int, int]) -> tuple[np.ndarray, int, int]:
    """:func:`rasterize` within the geometry's bounding box (clipped to ``shape``): the box's mask and
    its top row and left column. Tested in strips of rows, so the work and the memory are those of
    the box, whatever the photo's size."""
    if geometry.is_empty:
        return np.zeros((0, 0), bool), 0, 0
    x0, y0, x1, y1 = (int(np.floor(v)) for v in geometry.bounds)
    x0, y0, x1, y1 = max(0, x0), max(0, y0), min(shape[1], x1 + 1), min(shape[0], y1 + 1)
    if x1 <= x0 or y1 <= y0:
        return np.zeros((0, 0), bool), 0, 0
    out = np.zeros((y1 - y0, x1 - x0), bool)
    shapely.prepare(geometry)
    xs = np.arange(x0, x1) + 0.5
    step = max(1, RASTER_CHUNK // (x1 - x0))
    for top in range(y0, y1, step):
        bottom = min(y1, top + step)
        yy = np.repeat(np.arange(top, bottom) + 0.5, x1 - x0)
        out[top - y0:bottom - y0] = shapely.contains_xy(geometry, np.tile(xs, bottom - top), yy).reshape(-1, x1 - x0)
    return out, y0, x0


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


def coco_document(ws: Workspace, rle: bool = False) -> dict[str, Any]:
    """The workspace's outlines as one COCO instance-segmentation document."""
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for n, (img, wounds) in enumerate(_wounds(ws), start=1):
        images.append({"id": n, "file_name": img["file"], "width": img["width"], "height": img["height"],
                       "triderm_image_id": img["image_id"]})
        for w, mask in wounds:
            ys, xs = np.nonzero(mask)
            x0, y0 = int(xs.min()), int(ys.min())
            seg = rle_encode(mask) if rle else coco_polygons(mask_geometry(mask))
            annotations.append({"id": len(annotations) + 1, "image_id": n, "category_id": CATEGORY["id"],
                                "segmentation": seg, "area": int(mask.sum()),
                                "bbox": [x0, y0, int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0], "iscrowd": 0,
                                "triderm_image_id": img["image_id"], "triderm_wound_index": w["wound_index"],
                                "description": w["description"]})
    info = {"description": f"TriDerm Studio outlines of {ws.dataset_name}"
            + (" (SYNTHETIC phantom data)" if ws.is_synthetic else ""),
            "date_created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    return {"info": info, "images": images, "annotations": annotations, "categories": [CATEGORY]}


def geojson_documents(ws: Workspace) -> dict[str, dict[str, Any]]:
    """image_id → a GeoJSON FeatureCollection of its outlined wounds (photos without wounds left out)."""
    out = {}
    for img, wounds in _wounds(ws):
        if not wounds:
            continue
        features = [{"type": "Feature", "geometry": mapping(mask_geometry(mask)),
                     "properties": {"image_id": img["image_id"], "wound_index": w["wound_index"],
                                    "description": w["description"], "area_px": int(mask.sum()),
                                    "objectType": "annotation", "classification": {"name": "wound"}}}
                    for w, mask in wounds]
        out[img["image_id"]] = {"type": "FeatureCollection", "features": features}
    return out


def export_outlines(ws: Workspace, out: str | Path, fmt: str) -> dict[str, Any]:
    """Write the outlines to folder ``out``: ``annotations.json`` (coco, coco-rle) or ``<image_id>.geojson``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown outline format {fmt!r}; choose one of {FORMATS}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "geojson":
        docs = geojson_documents(ws)
        for image_id, doc in docs.items():
            write_text(out / f"{image_id}.geojson", json.dumps(doc) + "\n")
        return {"format": fmt, "images": len(docs), "wounds": sum(len(d["features"]) for d in docs.values()),
                "out": str(out)}
    doc = coco_document(ws, rle=fmt == "coco-rle")
    write_text(out / "annotations.json", json.dumps(doc) + "\n")
    return {"format": fmt, "images": len(doc["images"]), "wounds": len(doc["annotations"]),
            "out": str(out / "annotations.json")}
