"""Segment a folder of photos with a wound segmenter: label-map masks in the dataset layout, ready to import.

Each photo of ``--images`` (png/jpg/tif) gets ``OUT/masks/<name>.png``: a label map (0 background,
1..K one label per wound: each connected component of probability ≥ ``--threshold``, holes filled,
components below the minimum wound area dropped), the layout the importer reads next to the
photos' ``images/``, so outlines can be pre-filled before an import and corrected in the editor.
``OUT/segment.json`` records the model, threshold and counts. Photos are read exactly as import reads them
(:func:`annotations.io.readers.load_photo`: EXIF orientation applied, 16-bit scaled to 8-bit, at most
:data:`~annotations.io.readers.MAX_PIXELS` pixels), so each mask has the upright photo's size and import takes it.
They are read one at a time (memory bounded by one photo, whatever the folder's size): no photos, two photos
of one name, a non-empty output folder, or a photo that cannot be read or is too large (a decompression
bomb) is one error naming the file, and leaves nothing behind (masks are written to ``OUT/.masks-partial``
and moved to ``OUT/masks`` once every photo is done).

    python -m core.segment --images DIR --out DIR [--model default|RUN|PATH] [--threshold T (default: the model's own)]
                           [--workspace W] [--device auto|cpu|cuda]

``--model``: ``default`` (the segmenter shipped with the package), a run id of the workspace's
``segmenter`` runs, or a ``.safetensors`` checkpoint path.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from annotations.infra.workspace import DEFAULT_MIN_WOUND_AREA, Workspace
from annotations.io.readers import IMAGE_SUFFIXES, load_photo
from annotations.store import runs
from core import cli
from core.runtime import user_errors
from core.segmentation.defaults import RUN_KIND

if TYPE_CHECKING:  # the model modules import torch: loaded when a photo is segmented, not for --help
    from core.segmentation.model import Segmenter


def resolve_model(spec: str, workspace: str | None, device: str) -> tuple[Segmenter, Path | None]:
    """``default``, a workspace run id or a checkpoint path → the segmenter (and its file, when not the default)."""
    from core.segmentation.model import Segmenter, SegmenterError, load_default, run_checkpoint

    if spec == "default":
        return load_default(device), None
    if spec.isdigit():
        ws = Workspace(workspace)
        try:
            run = runs.finished(ws, int(spec), RUN_KIND)
        except ValueError as e:
            raise SegmenterError(str(e)) from None
        path = run_checkpoint(ws, run)
        return Segmenter.load(path, device=device, run_id=run["id"], source=f"run {spec}"), path
    path = Path(spec)
    return Segmenter.load(path, device=device), path


def photo_paths(folder: Path) -> list[Path]:
    """The photo files of ``folder`` (png/jpg/tif), sorted; none, or two of one name, is a ValueError.
    Nothing is decoded here: :func:`~annotations.io.readers.load_photo` reads each when it is segmented."""
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder of photos")
    paths = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise ValueError(f"{folder}: no photos ({', '.join(IMAGE_SUFFIXES)})")
    stems = [p.stem for p in paths]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:
        raise ValueError(f"{folder}: two photos share the name {twice[0]!r} (one mask per name)")
    return paths


def segment_photos(segmenter: Segmenter, paths: list[Path], masks: Path, threshold: float) -> int:
    """Segment the photos one at a time (each read as import reads it) into ``masks/<name>.png``; the
    number of wounds. A photo that cannot be read is a DatasetError naming it."""
    wounds = 0
    for path in tqdm(paths, desc="segmenting", unit="photo"):
        labels = label_map(segmenter.probability(load_photo(path)), threshold)
        wounds += int(labels.max())
        Image.fromarray(labels).save(masks / f"{path.stem}.png")
    return wounds


def label_map(prob: np.ndarray, threshold: float, min_area: int = DEFAULT_MIN_WOUND_AREA) -> np.ndarray:
    """One label per wound component (largest first) of the thresholded probability map."""
    from core.segmentation.interactive import wound_components

    comps = wound_components(prob, min_area, threshold=threshold)
    labels = np.zeros(prob.shape, np.uint8 if len(comps) < 256 else np.uint16)
    for k, comp in enumerate(comps, start=1):
        labels[comp] = k
    return labels


def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.segment`` job; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m core.segment", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, required=True, help="folder of photos to segment")
    parser.add_argument("--out", type=Path, required=True, help="new or empty folder: masks/<name>.png go here")
    parser.add_argument("--model", default="default",
                        help="default (shipped), a segmenter run id of --workspace, or a .safetensors path")
    parser.add_argument("--threshold", type=float, default=None,
                        help="wound probability (default: the model's own, chosen when it was trained)")
    cli.add_workspace(parser)
    cli.add_device(parser)
    args = cli.parse_args(parser, argv)
    with user_errors(parser, ValueError):  # SegmenterError is a ValueError
        if args.threshold is not None and not 0 < args.threshold < 1:
            raise ValueError(f"--threshold must lie strictly between 0 and 1 (got {args.threshold})")
        if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
            raise ValueError(f"{args.out}: the output folder is not empty (give a new or empty folder)")
        photos = photo_paths(args.images)
        segmenter, path = resolve_model(args.model, args.workspace, args.device)
    threshold = segmenter.threshold if args.threshold is None else args.threshold
    from core.segmentation.model import default_path

    made = not args.out.exists()
    partial = args.out / ".masks-partial"
    partial.mkdir(parents=True)
    try:
        with user_errors(parser, ValueError):  # an unreadable or too large photo (DatasetError)
            wounds = segment_photos(segmenter, photos, partial, threshold)
        partial.rename(args.out / "masks")
    finally:
        if partial.exists():  # a photo failed (or the run was interrupted): leave nothing behind
            shutil.rmtree(partial)
            if made:
                args.out.rmdir()
    masks = args.out / "masks"
    record = {"model": segmenter.source, "checkpoint": str(path) if path else "default",
              "sha256": hashlib.sha256((path or default_path()).read_bytes()).hexdigest(),
              "threshold": threshold, "photos": len(photos), "wounds": wounds, "images": str(args.images)}
    (args.out / "segment.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"{len(photos)} photos segmented by the {segmenter.source} segmenter: {wounds} wounds → {masks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
