"""Embed photos: the frozen vision baseline of a workspace, or new photos with a trained run.

Without ``--model``: the frozen baseline (TriDerm §3.3) — each photo resized to the backbone's
input size, a wound's embedding the mean of its tokens (:mod:`core.vision.features`), a
photo's the mean of its wounds; recorded as a ``vision-baseline`` run.

With ``--model MODEL`` — a TriDerm-V, fine-tune or frozen run id of the workspace, a model folder written by
``python -m core.export_model`` or an ``hf-hub:<org>/<repo>`` name (from the local cache when the
hub is offline) — the workspace's photos with wounds are embedded in that model's space (each the
mean of its wounds through the head or the tuned last stage, normalised like the model's study) and recorded as a
``vision-model`` run. With ``--images DIR`` as well, photos outside the workspace (``DIR`` or
``DIR/images``, masks from ``DIR/masks/<name>.png`` when present, else the whole photo is the
wound) are placed among the study's photos (the run's own embedding for a run id, else the
workspace's ``vision-model`` run of that model, made when there is none): their nearest study
photos are printed, and ``--out FILE.csv`` writes every distance.

    python -m core.embed [--backbone efficientnet-lite0] [--layer full] [--workspace W]
    python -m core.embed --model RUN|FOLDER|hf-hub:ORG/REPO [--images DIR] [--neighbours 5] [--out distances.csv]
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

import numpy as np

from annotations.store import runs
from annotations.io.csvsafe import neutralise
from annotations.io.readers import load_photo, photo_sha256
from core import cli
from core.eval.distances import pairwise_euclidean
from annotations.infra.workspace import Workspace
from core.runtime import load_embeddings, open_workspace, save_embeddings, user_errors
from core.vision.recipe import OFFLINE_DEFAULT

if TYPE_CHECKING:  # torch: loaded once the arguments are read (a fast --help)
    from core.vision.inference import Model


MODEL_RUN = runs.VISION_MODEL


def embed_workspace(ws: Workspace, model: Model, ref: str, progress: bool = True) -> int:
    """Embed the workspace's photos with wounds in ``model``'s space; record a ``vision-model`` run."""
    ids = sorted({w["image_id"] for w in ws.store.wounds()})
    with runs.recording(ws, MODEL_RUN, {"modality": "vision", "model": ref, "backbone": model.backbone.name,
                                        "layer": model.backbone.layer, "normalize": model.normalize,
                                        "synthetic": ws.is_synthetic}) as rec:
        sha = {r["image_id"]: r["sha256"] for r in ws.store.images()}
        emb = np.stack([model.embed(ws.load_image(i), ws.load_mask(i), sha[i])
                        for i in tqdm(ids, desc="embed", unit="photo", disable=not progress)])
        save_embeddings(ws, rec.id, ids, image_emb=emb)
        rec.metrics = {"n_images": len(ids)}
    return rec.id


def study_run(ws: Workspace, model: Model, ref: str) -> int:
    """The run whose embedding new photos are placed among: the model's own run, else the latest
    finished ``vision-model`` run of ``ref`` in the workspace (made now when there is none)."""
    if model.run_id is not None:
        return model.run_id
    done = [r for r in ws.store.runs(kind=MODEL_RUN) if r["status"] == "done" and r["config"].get("model") == ref]
    return int(done[0]["id"]) if done else embed_workspace(ws, model, ref)


def place_new_photos(ws: Workspace, model: Model, args: argparse.Namespace) -> list[str]:
    """Embed the photos of ``--images`` with ``model`` and find their nearest study photos (the
    distances to every study photo written to ``--out`` as CSV); the lines to print."""
    from core.vision.inference import photo_files, read_labels

    files = photo_files(args.images)
    photos = [(load_photo(photo), read_labels(mask), photo_sha256(photo)) for _, photo, mask in files]
    run_id = study_run(ws, model, args.model)
    study = load_embeddings(ws, run_id)
    names = [name for name, _, _ in files]
    emb = np.stack([model.embed(photo, labels, sha) for photo, labels, sha in photos])
    D = pairwise_euclidean(emb, study["image_emb"])
    k = min(args.neighbours, D.shape[1])
    lines = [f"{len(names)} new photo(s) in the space of {args.model} (run {run_id}, {model.backbone.name}); "
             f"nearest of {D.shape[1]} study photos:"]
    for name, row in zip(names, D):
        near = ", ".join(f"{study['image_ids'][j]} ({row[j]:.3f})" for j in np.argsort(row)[:k])
        lines.append(f"  {name}: {near}")
    if args.out is not None:
        with open(args.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(map(neutralise, ["photo", *study["image_ids"]]))
            w.writerows([neutralise(name), *(f"{d:.6f}" for d in row)] for name, row in zip(names, D))
        lines.append(f"distances → {args.out}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.embed`` job; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m core.embed", description=__doc__.splitlines()[0])
    cli.add_workspace(parser)
    cli.add_device(parser)
    parser.add_argument("--backbone", default=OFFLINE_DEFAULT, help=f"backbone name (default {OFFLINE_DEFAULT})")
    parser.add_argument("--layer", default=None, help="backbone layer (default: the backbone's registry default)")
    parser.add_argument("--model", default=None, metavar="RUN|FOLDER|hf-hub:ORG/REPO",
                        help="a TriDerm-V, fine-tune or frozen run id, an exported model folder or an hf-hub: name: "
                             "embed the workspace's photos (and --images) in its space")
    parser.add_argument("--images", type=Path, default=None, metavar="DIR", help="new photos to embed (with --model)")
    parser.add_argument("--neighbours", type=int, default=5, help="nearest study photos printed per new photo")
    parser.add_argument("--out", type=Path, default=None, help="CSV of distances from each new photo to the study's")
    args = cli.parse_args(parser, argv)
    if args.images is not None and args.model is None:
        parser.error("--images needs --model: new photos are embedded with a trained model")
    if args.neighbours < 1:
        parser.error(f"--neighbours must be ≥ 1, got {args.neighbours}")
    from core.vision.backbones import BackboneUnavailable, load_backbone
    from core.vision.baseline import embed_baseline
    from core.vision.inference import open_model

    if args.model is not None:
        ws = open_workspace(args.workspace, parser, require_wounds=args.images is None)
        with user_errors(parser, ValueError, BackboneUnavailable, FileNotFoundError):
            model = open_model(ws, args.model)
            if args.images is not None:
                print("\n".join(place_new_photos(ws, model, args)))
                return 0
        run_id = embed_workspace(ws, model, args.model)
        print(f"run {run_id}: the workspace's photos in the space of {args.model} ({model.backbone.name}) "
              f"→ {ws.run_dir(run_id)}")
        return 0
    ws = open_workspace(args.workspace, parser, require_wounds=True)
    with user_errors(parser, BackboneUnavailable, ValueError, FileNotFoundError):
        backbone = load_backbone(args.backbone, layer=args.layer)
    run_id = embed_baseline(ws, backbone)
    print(f"run {run_id}: frozen {backbone.name} mean-pool baseline → {ws.run_dir(run_id)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
