"""``python -m core.phantoms``: write a SYNTHETIC phantom dataset folder."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from PIL import Image

from core.phantoms.dataset import build, montage
from core.phantoms.visits import build_visits


# --------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.phantoms`` command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m core.phantoms",
        description="Build the SYNTHETIC wound-phantom demo dataset (dataset-folder layout with latent truth/).")
    parser.add_argument("--out", required=True, type=Path, help="dataset folder to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--photos", "--images", type=int, default=53, help="photos to render (any size; written one at a time)")
    parser.add_argument("--patients", type=int, default=21)
    parser.add_argument("--wounds", type=int, default=120)
    parser.add_argument("--triplets", type=int, default=513)
    parser.add_argument("--montage", type=Path, default=None, help="also write a 12-phantom montage PNG here")
    parser.add_argument("--visits", type=int, default=None,
                        help="instead: every patient's wounds at this many visits (healing, closing, new; a "
                             "calibration marker under varying camera distance and tilt; truth in cm²)")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a folder")
    if args.out.is_dir() and any(args.out.iterdir()):
        meta = args.out / "dataset.json"
        try:
            synthetic = json.loads(meta.read_text(encoding="utf-8")).get("synthetic") is True
        except (OSError, ValueError):
            synthetic = False
        if not synthetic:
            parser.error(f"--out {args.out} is a non-empty folder that is not a phantom dataset; refusing to overwrite")
    if args.visits is not None:
        try:
            print(json.dumps(build_visits(args.out, args.visits, args.patients, args.seed,
                                          progress=sys.stderr.isatty()), indent=1))
        except ValueError as exc:
            parser.error(str(exc))
        return 0
    try:
        summary = build(args.out, args.seed, args.photos, args.patients, args.wounds, args.triplets,
                        progress=sys.stderr.isatty())
    except ValueError as exc:
        parser.error(str(exc))
    if args.montage is not None:
        args.montage.parent.mkdir(parents=True, exist_ok=True)
        sheet = montage(args.out).quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.FLOYDSTEINBERG)
        sheet.save(args.montage, format="PNG", optimize=True)  # a 256-colour palette keeps the docs file small
        summary["montage"] = str(args.montage)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

