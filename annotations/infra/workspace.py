"""A workspace: one folder holding a project's store, photos, label masks, caches and runs."""
from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
from pathlib import Path
from typing import Any, overload

import numpy as np
from PIL import Image

from annotations.infra import journal
from annotations.infra.fileio import atomic_write
from annotations.store.rows import StoreOperationalError
from annotations.store.store import Store

ENV_VAR = "TRIDERM_WORKSPACE"
DEFAULT_WORKSPACE = Path("workspace")
DB_NAME = "triderm.sqlite"
#: Smallest wound, in pixels of the stored photo; a workspace setting (store meta ``min_wound_area``)
#: used by import, the outline editor and outline suggestions alike.
DEFAULT_MIN_WOUND_AREA = 25


def outlines(labels: np.ndarray) -> dict[int, dict[str, Any]]:
    """Every wound of a label map as ``{index: {area, bbox, png}}`` in one pass.

    ``png`` is the base64 PNG of the wound's 1-bit pixels inside its bounding box: a revision
    keeps it so an outline can be restored exactly."""
    from scipy import ndimage  # here, not at import: --help stays fast

    labels = np.asarray(labels)
    found: dict[int, dict[str, Any]] = {}
    for n, box in enumerate(ndimage.find_objects(labels.astype(np.int64, copy=False)), start=1):
        if box is None:
            continue
        crop = labels[box] == n
        buf = io.BytesIO()
        Image.fromarray(crop).save(buf, format="PNG")
        found[n] = {"area": int(crop.sum()),
                    "bbox": [box[1].start, box[0].start, box[1].stop, box[0].stop],
                    "png": base64.b64encode(buf.getvalue()).decode("ascii")}
    return found


def outline_of(labels: np.ndarray, index: int) -> dict[str, Any] | None:
    """The outline value of one wound of a label map (None when it has no pixels)."""
    return outlines(np.asarray(labels) == index).get(1)


def outline_pixels(value: dict[str, Any]) -> np.ndarray:
    """The boolean crop (bounding-box sized) of an outline value from :func:`outlines`."""
    with Image.open(io.BytesIO(base64.b64decode(value["png"]))) as im:
        return np.asarray(im.convert("1"), dtype=bool)


@overload
def outline_hash(value: dict[str, Any]) -> str: ...
@overload
def outline_hash(value: None) -> None: ...
def outline_hash(value: dict[str, Any] | None) -> str | None:
    """A hash of an outline's pixels and place (None for no outline)."""
    if value is None:
        return None
    bits = np.packbits(outline_pixels(value)).tobytes()
    return hashlib.sha256(repr(value["bbox"]).encode() + bits).hexdigest()


def resolve_workspace(path: str | Path | None = None) -> Path:
    """``path`` if given, else ``$TRIDERM_WORKSPACE``, else ``./workspace``."""
    if path:
        return Path(path)
    return Path(os.environ.get(ENV_VAR) or DEFAULT_WORKSPACE)


class Workspace:
    """Folder layout ``triderm.sqlite``, ``images/``, ``masks/``, ``cache/``, ``runs/``.

    Opening it finishes or undoes the file swap of an import, erase-patient or restore that was
    killed midway, and removes its staged files (:mod:`annotations.infra.journal`)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = resolve_workspace(root).resolve()
        journal.recover(self.root, None, kinds=("restore",))  # before the store opens: a restore swaps it
        for folder in (self.root, *(self.root / sub for sub in ("images", "masks", "cache", "runs"))):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # private when made (0700; the store 0600)
        self.store = Store(self.root / DB_NAME)
        if journal.pending(self.root):
            self.recover()

    def recover(self) -> list[str]:
        """Finish or undo the swaps left by killed processes (a live one holds its folder's lock and
        is left alone); returns the folders handled."""
        store = self.store
        done = journal.recover(self.root, lambda key: store.get_meta(key) is not None)
        if done:
            with contextlib.suppress(StoreOperationalError), store.transaction():  # a key left is inert
                for name in done:
                    store.delete_meta(f"swap:{name}")
        return done

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    @property
    def images_dir(self) -> Path:
        """The folder of the imported photos."""
        return self.root / "images"

    @property
    def masks_dir(self) -> Path:
        """The folder of the wound label maps (one PNG per photo)."""
        return self.root / "masks"

    @property
    def cache_dir(self) -> Path:
        """The folder of derived, rebuildable files (features, scheduler leases)."""
        return self.root / "cache"

    @property
    def runs_dir(self) -> Path:
        """The folder of the jobs' run folders."""
        return self.root / "runs"

    @property
    def truth_dir(self) -> Path:
        """Latent truth of a synthetic (phantom) dataset, when imported."""
        return self.root / "truth"

    @property
    def is_synthetic(self) -> bool:
        """Whether the workspace holds SYNTHETIC data (phantoms), set at import."""
        return bool(self.store.get_meta("synthetic", False))

    @property
    def min_wound_area(self) -> int:
        """Smallest wound area in pixels; smaller components are reported and dropped."""
        return int(self.store.get_meta("min_wound_area", DEFAULT_MIN_WOUND_AREA))

    @property
    def dataset_name(self) -> str:
        """The dataset's name (set at import; default the folder's name)."""
        return str(self.store.get_meta("dataset_name", self.root.name))

    def run_dir(self, run_id: int) -> Path:
        """The folder of run ``run_id`` (made when missing)."""
        path = self.runs_dir / str(int(run_id))
        path.mkdir(parents=True, exist_ok=True)
        return path

    def image_path(self, image_id: str) -> Path:
        """The photo's file; KeyError for an unknown id."""
        row = self.store.image(image_id)
        if row is None:
            raise KeyError(f"unknown image {image_id!r}")
        return self.images_dir / row["file"]

    def mask_path(self, image_id: str) -> Path:
        """The photo's label map file (which may not exist yet)."""
        return self.masks_dir / f"{image_id}.png"

    def load_image(self, image_id: str) -> Image.Image:
        """The photo as an RGB image."""
        with Image.open(self.image_path(image_id)) as im:
            return im.convert("RGB")

    def load_mask(self, image_id: str) -> np.ndarray:
        """H×W int32 label map (0 = skin, n = wound n); all zeros when nothing is outlined.

        The store says which wounds exist: pixels of a label with no wound row (a writer killed
        between the mask file and its commit) read as skin, so such a crash leaves no phantom wound."""
        path = self.mask_path(image_id)
        if path.exists():
            with Image.open(path) as im:
                labels = np.asarray(im).astype(np.int32)
            known = [w["wound_index"] for w in self.store.wounds(image_id)]
            labels[~np.isin(labels, [0, *known])] = 0
            return labels
        row = self.store.image(image_id)
        if row is None:
            raise KeyError(f"unknown image {image_id!r}")
        return np.zeros((row["height"], row["width"]), dtype=np.int32)

    def save_mask(self, image_id: str, labels: np.ndarray) -> None:
        """Write the label map atomically (uint8, or uint16 beyond 255 wounds)."""
        labels = np.asarray(labels)
        dtype = np.uint8 if labels.max(initial=0) <= 255 else np.uint16
        with atomic_write(self.mask_path(image_id), "wb", suffix=".png") as fh:
            Image.fromarray(labels.astype(dtype)).save(fh, format="PNG")
