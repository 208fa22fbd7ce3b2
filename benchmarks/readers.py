"""Mask import speed: a large anti-aliased binary mask with many wounds, read, labelled and imported.

``python -m benchmarks.readers [--width 4000 --height 3000 --wounds 470 --repeats 3]`` prints one JSON
line per stage (best of ``--repeats`` wall-clock seconds): the vectorised labelling alone, the whole
mask reader (PNG decode + threshold + components + area/bbox) and a full ``import_dataset`` of one
photo with its mask into a fresh workspace. The former per-wound geometry loop (one full-image scan
per wound) is timed for comparison with ``--per-wound``.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from annotations.io.readers import DatasetFolder, labels_and_geometry, read_mask, read_photo, wound_geometry
from core import cli


def make_dataset(root: Path, width: int, height: int, wounds: int, seed: int = 0) -> Path:
    """One photo and a binary mask of ``wounds`` separate discs, anti-aliased (blurred edges)."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    mask = np.zeros((height, width), np.uint8)
    side = int(np.ceil(np.sqrt(wounds * width / height)))
    cell_w, cell_h = width // side, height // int(np.ceil(wounds / side))
    yy, xx = np.mgrid[:cell_h, :cell_w]
    for k in range(wounds):
        r = rng.uniform(0.15, 0.35) * min(cell_w, cell_h)
        disc = (yy - cell_h / 2) ** 2 + (xx - cell_w / 2) ** 2 <= r * r
        y0, x0 = (k // side) * cell_h, (k % side) * cell_w
        mask[y0:y0 + cell_h, x0:x0 + cell_w][disc] = 255
    Image.fromarray(mask).filter(ImageFilter.GaussianBlur(1.5)).save(root / "masks" / "big.png")
    photo = (rng.random((height // 8, width // 8, 3)) * 255).astype(np.uint8)
    Image.fromarray(photo).resize((width, height)).save(root / "images" / "big.jpg", quality=90)
    return root


def best(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """The fastest of ``repeats`` timed calls of ``fn`` (seconds) and its last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.readers`` benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.readers", description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4000)
    parser.add_argument("--height", type=int, default=3000)
    parser.add_argument("--wounds", type=int, default=470)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-wound", action="store_true", help="also time the former per-wound loop")
    cli.add_seed(parser)
    args = cli.parse_args(parser, argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_dataset(Path(tmp) / "ds", args.width, args.height, args.wounds, args.seed)
        folder = DatasetFolder(root)
        photo = read_photo(folder, root / "images" / "big.jpg")
        array = np.asarray(Image.open(root / "masks" / "big.png"))
        size = f"{args.width}x{args.height}"
        t, mask = best(lambda: labels_and_geometry(array, "auto", 25), args.repeats)
        print(json.dumps({"stage": "labels_and_geometry", "size": size, "wounds": len(mask.geometry),
                          "dropped": len(mask.dropped), "seconds": round(t, 3)}))
        t, mask = best(lambda: read_mask(folder, root / "masks" / "big.png", photo, "auto", 25), args.repeats)
        print(json.dumps({"stage": "read_mask", "size": size, "wounds": len(mask.geometry), "seconds": round(t, 3)}))

        def full_import() -> dict:
            with tempfile.TemporaryDirectory() as ws_dir:
                ws = Workspace(ws_dir)
                try:
                    return import_dataset(ws, root)
                finally:
                    ws.store.close()

        t, summary = best(full_import, args.repeats)
        print(json.dumps({"stage": "import_dataset", "size": size, "wounds": summary["wounds"],
                          "seconds": round(t, 3)}))
        if args.per_wound:
            labels = mask.labels
            t, _ = best(lambda: [wound_geometry(labels, i) for i in range(1, int(labels.max()) + 1)], 1)
            print(json.dumps({"stage": "per_wound_loop (former)", "size": size, "seconds": round(t, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
