"""Benchmark: TriDerm-V training with the feature cache vs the naive ``--no-cache`` path.

Prints, on one workspace (default: a fresh copy of the phantom demo in a temp folder):
- cache build alone: K augmented views + the inference view per photo through the frozen
  backbone, written to ``cache/`` (wall and CPU seconds);
- cached training for E epochs vs ``--no-cache`` training for the same E epochs (augment +
  backbone every step), wall seconds of the training loops and their ratio (target ≥ 10×).

    python -m benchmarks.train_triderm [--workspace W] [--epochs 2] [--views 16]

The machine may be shared: timings are wall clock under whatever load there is (CPU
seconds are printed too).
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch

from annotations.workspace import Workspace
from core import cli
from core.runtime import ensure_images
from core.vision.backbones import OFFLINE_DEFAULT, load_backbone
from core.vision.features import FeatureCache, workspace_wounds
from core.vision.triderm import train


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_triderm", description=__doc__.splitlines()[0])
    cli.add_workspace(parser, help="workspace to use (default: fresh phantom demo in a temp dir)")
    cli.add_device(parser)
    parser.add_argument("--backbone", default=OFFLINE_DEFAULT)
    cli.add_epochs(parser, 2)
    cli.add_seed(parser)
    parser.add_argument("--views", type=int, default=16)
    args = cli.parse_args(parser, argv)
    tmp = None if args.workspace else tempfile.mkdtemp(prefix="triderm-bench-")
    ws = Workspace(args.workspace or os.path.join(tmp, "ws"))
    try:
        ensure_images(ws, progress=False)
        backbone = load_backbone(args.backbone)
        image_ids, keys = workspace_wounds(ws)
        cache = FeatureCache(ws, backbone)
        shutil.rmtree(cache.root, ignore_errors=True)
        w0, c0 = _clock()
        cache.build(image_ids, args.views, progress=False)
        w1, c1 = _clock()
        common = dict(backbone=backbone, epochs=args.epochs, views=args.views, seed=args.seed)
        cached = ws.store.run(train(ws, progress=False, **common))["metrics"]["timing"]["train_s"]
        naive = ws.store.run(train(ws, progress=False, no_cache=True, **common))["metrics"]["timing"]["train_s"]
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"TriDerm-V training benchmark — {len(image_ids)} photos, {len(keys)} wounds, {backbone.name}, "
          f"{args.views} views, {args.epochs} epochs, {torch.get_num_threads()} torch threads"
          f"{' [SYNTHETIC phantom data]' if ws.is_synthetic else ''}")
    print(f"cache build alone        : {w1 - w0:8.1f} s wall ({c1 - c0:.1f} s CPU), "
          f"{(args.views + 1) * len(image_ids) / (w1 - w0):.1f} views/s on {backbone.device}")
    print(f"training, cached features: {cached:8.2f} s wall")
    print(f"training, --no-cache     : {naive:8.2f} s wall (augment + backbone every step; baseline)")
    print(f"speed-up cached vs naive : {naive / cached:8.1f}×")
    print(f"cache build + cached training vs naive: {naive / (w1 - w0 + cached):.2f}× "
          f"(the build is paid once and reused by every later run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
