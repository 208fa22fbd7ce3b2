"""Embed photos: the frozen vision baseline of a workspace, or new photos with a trained run.

Without ``--model``: the frozen baseline (TriDerm §3.3) — each photo resized to the backbone's
input size, a wound's embedding the mean of its tokens (:mod:`core.vision.features`), a
photo's the mean of its wounds; recorded as a ``vision-baseline`` run.

With ``--model RUN --images DIR``: photos the TriDerm-V run ``RUN`` has not seen (``DIR`` or
``DIR/images``, masks from ``DIR/masks/<name>.png`` when present, else the whole photo is the
wound) are embedded in that run's space and placed among the study's photos: their nearest
study photos are printed, and ``--out FILE.csv`` writes every distance.

    python -m core.embed [--backbone efficientnet-lite0] [--layer full] [--workspace W]
    python -m core.embed --model RUN --images DIR [--neighbours 5] [--out distances.csv]
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from annotations.readers import load_photo
from core import cli
from core.eval.distances import pairwise_euclidean
from core.runtime import load_embeddings, open_workspace, user_errors
from core.vision.backbones import OFFLINE_DEFAULT, BackboneUnavailable, load_backbone
from core.vision.baseline import embed_baseline
from core.vision.inference import TrainedHead, photo_files, read_labels


def place_new_photos(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    ws = open_workspace(args.workspace, parser)
    with user_errors(parser, ValueError, BackboneUnavailable, FileNotFoundError):
        files = photo_files(args.images)
        model = TrainedHead.load(ws, args.model)
        photos = [(load_photo(photo), read_labels(mask)) for _, photo, mask in files]
    study = load_embeddings(ws, args.model)
    names = [name for name, _, _ in files]
    emb = np.stack([model.embed(photo, labels) for photo, labels in photos])
    D = pairwise_euclidean(emb, study["image_emb"])
    k = min(args.neighbours, D.shape[1])
    print(f"{len(names)} new photo(s) in the space of run {args.model} ({model.backbone.name}); "
          f"nearest of {D.shape[1]} study photos:")
    for name, row in zip(names, D):
        near = ", ".join(f"{study['image_ids'][j]} ({row[j]:.3f})" for j in np.argsort(row)[:k])
        print(f"  {name}: {near}")
    if args.out is not None:
        with open(args.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["photo", *study["image_ids"]])
            w.writerows([name, *(f"{d:.6f}" for d in row)] for name, row in zip(names, D))
        print(f"distances → {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.embed", description=__doc__.splitlines()[0])
    cli.add_workspace(parser)
    cli.add_device(parser)
    parser.add_argument("--backbone", default=OFFLINE_DEFAULT, help=f"backbone name (default {OFFLINE_DEFAULT})")
    parser.add_argument("--layer", default=None, help="backbone layer (default: the backbone's registry default)")
    parser.add_argument("--model", type=int, default=None, metavar="RUN",
                        help="a TriDerm-V run whose space new photos are embedded in (with --images)")
    parser.add_argument("--images", type=Path, default=None, metavar="DIR", help="new photos to embed (with --model)")
    parser.add_argument("--neighbours", type=int, default=5, help="nearest study photos printed per new photo")
    parser.add_argument("--out", type=Path, default=None, help="CSV of distances from each new photo to the study's")
    args = cli.parse_args(parser, argv)
    if (args.model is None) != (args.images is None):
        parser.error("--model and --images go together: embed new photos with a trained run")
    if args.neighbours < 1:
        parser.error(f"--neighbours must be ≥ 1, got {args.neighbours}")
    if args.model is not None:
        return place_new_photos(parser, args)
    ws = open_workspace(args.workspace, parser, require_wounds=True)
    with user_errors(parser, BackboneUnavailable, ValueError, FileNotFoundError):
        backbone = load_backbone(args.backbone, layer=args.layer)
    run_id = embed_baseline(ws, backbone)
    print(f"run {run_id}: frozen {backbone.name} mean-pool baseline → {ws.run_dir(run_id)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
