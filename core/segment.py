"""Segment a folder of photos with a wound segmenter: label-map masks in the dataset layout, ready to import.

Each photo of ``--images`` (png/jpg/tif) gets ``OUT/masks/<name>.png``: a label map (0 background,
1..K one label per wound: each connected component of probability ≥ ``--threshold``, holes filled,
components below the minimum wound area dropped), the layout the importer reads next to the
photos' ``images/``, so outlines can be pre-filled before an import and corrected in the editor.
``OUT/segment.json`` records the model, threshold and counts. Every photo is opened before anything
is written: no photos, an unreadable photo or a non-empty output folder is one error and writes nothing.

    python -m core.segment --images DIR --out DIR [--model default|RUN|PATH] [--threshold 0.5]
                           [--workspace W] [--device auto|cpu|cuda]

``--model``: ``default`` (the segmenter shipped with the package), a run id of the workspace's
``segmenter`` runs, or a ``.safetensors`` checkpoint path.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from annotations.readers import IMAGE_SUFFIXES
from annotations.workspace import DEFAULT_MIN_WOUND_AREA, Workspace
from core import cli
from core.runtime import user_errors
from core.segmentation.defaults import RUN_KIND, THRESHOLD

if TYPE_CHECKING:  # the model modules import torch: loaded when a photo is segmented, not for --help
    from core.segmentation.model import Segmenter


def resolve_model(spec: str, workspace: str | None, device: str) -> tuple[Segmenter, Path | None]:
    """``default``, a workspace run id or a checkpoint path → the segmenter (and its file, when not the default)."""
    from core.segmentation.model import Segmenter, SegmenterError, load_default, run_checkpoint

    if spec == "default":
        return load_default(device), None
    if spec.isdigit():
        ws = Workspace(workspace)
        run = next((r for r in ws.store.runs(kind=RUN_KIND) if r["id"] == int(spec)), None)
        if run is None or run["status"] != "done":
            raise SegmenterError(f"{ws.root}: no finished segmenter run {spec} (see the Train page's runs)")
        path = run_checkpoint(ws, run)
        return Segmenter.load(path, device=device, run_id=run["id"], source=f"run {spec}"), path
    path = Path(spec)
    return Segmenter.load(path, device=device), path


def read_photos(folder: Path) -> list[tuple[str, Image.Image]]:
    """Every photo of ``folder`` (name stem, RGB image), sorted; none or an unreadable one is a ValueError."""
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a folder of photos")
    paths = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise ValueError(f"{folder}: no photos ({', '.join(IMAGE_SUFFIXES)})")
    photos = []
    for path in paths:
        try:
            with Image.open(path) as im:
                photos.append((path.stem, im.convert("RGB")))
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: unreadable photo ({e})") from None
    stems = [s for s, _ in photos]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:
        raise ValueError(f"{folder}: two photos share the name {twice[0]!r} (one mask per name)")
    return photos


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
    parser.add_argument("--threshold", type=float, default=THRESHOLD, help=f"wound probability (default {THRESHOLD})")
    cli.add_workspace(parser)
    cli.add_device(parser)
    args = cli.parse_args(parser, argv)
    with user_errors(parser, ValueError):  # SegmenterError is a ValueError
        if not 0 < args.threshold < 1:
            raise ValueError(f"--threshold must lie strictly between 0 and 1 (got {args.threshold})")
        if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
            raise ValueError(f"{args.out}: the output folder is not empty (give a new or empty folder)")
        photos = read_photos(args.images)
        segmenter, path = resolve_model(args.model, args.workspace, args.device)
    from core.segmentation.model import default_path

    masks = args.out / "masks"
    masks.mkdir(parents=True, exist_ok=True)
    wounds = 0
    for stem, image in tqdm(photos, desc="segmenting", unit="photo"):
        labels = label_map(segmenter.probability(image), args.threshold)
        wounds += int(labels.max())
        Image.fromarray(labels).save(masks / f"{stem}.png")
    record = {"model": segmenter.source, "checkpoint": str(path) if path else "default",
              "sha256": hashlib.sha256((path or default_path()).read_bytes()).hexdigest(),
              "threshold": args.threshold, "photos": len(photos), "wounds": wounds, "images": str(args.images)}
    (args.out / "segment.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"{len(photos)} photos segmented by the {segmenter.source} segmenter: {wounds} wounds → {masks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
