"""Every export format, in one registry: ``python -m annotations export --format`` and the tests use it.

:data:`EXPORTS` maps a format's name to its writer ``(ws, out, force, image_prefix) → summary``; :func:`export`
writes one. ``dataset`` is a dataset folder that imports back losslessly (:mod:`annotations.io.dataset`),
``followup`` the tidy follow-up CSVs (:mod:`annotations.followup`), and ``coco``, ``coco-rle``, ``geojson`` and
``labelstudio`` the outlines only, for other annotation tools (:mod:`annotations.io.formats`).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from annotations.followup import followup
from annotations.infra.workspace import Workspace
from annotations.io.dataset import export_dataset
from annotations.io.formats import LS_LOCAL_FILES, write_coco, write_geojson, write_labelstudio
from annotations.io.readers import DatasetError

Writer = Callable[[Workspace, Path, bool, str], dict[str, Any]]


def _fresh(out: Path, force: bool) -> None:
    """An outline export goes into a new or empty folder unless ``force``."""
    if out.is_dir() and any(out.iterdir()) and not force:
        raise DatasetError(f"{out}: not empty; export into a new folder or give --force")


def _dataset(ws: Workspace, out: Path, force: bool, image_prefix: str) -> dict[str, Any]:
    return export_dataset(ws, out, force=force)


def _followup(ws: Workspace, out: Path, force: bool, image_prefix: str) -> dict[str, Any]:
    return followup.export_followup(ws, out, force=force)


def _coco(ws: Workspace, out: Path, force: bool, image_prefix: str) -> dict[str, Any]:
    _fresh(out, force)
    return write_coco(ws, out)


def _coco_rle(ws: Workspace, out: Path, force: bool, image_prefix: str) -> dict[str, Any]:
    _fresh(out, force)
    return write_coco(ws, out, rle=True)


def _geojson(ws: Workspace, out: Path, force: bool, image_prefix: str) -> dict[str, Any]:
    _fresh(out, force)
    return write_geojson(ws, out)


def _labelstudio(ws: Workspace, out: Path, force: bool, image_prefix: str) -> dict[str, Any]:
    _fresh(out, force)
    return write_labelstudio(ws, out, image_prefix)


#: Export formats (``export --format``), the default first: name → writer.
EXPORTS: dict[str, Writer] = {"dataset": _dataset, "followup": _followup, "coco": _coco, "coco-rle": _coco_rle,
                              "geojson": _geojson, "labelstudio": _labelstudio}


def export(ws: Workspace, out: str | Path, fmt: str = "dataset", *, force: bool = False,
           image_prefix: str = LS_LOCAL_FILES) -> dict[str, Any]:
    """Write ``ws`` to folder ``out`` in format ``fmt`` (one of :data:`EXPORTS`); ``force`` replaces the
    files of a non-empty folder, ``image_prefix`` is labelstudio's photo URL prefix. Returns the summary."""
    if fmt not in EXPORTS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORTS)}")
    return EXPORTS[fmt](ws, Path(out), force, image_prefix)
