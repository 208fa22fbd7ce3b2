"""Benchmark: TriDerm-V ablation (paper Table 2b) — balanced agreement mean ± sd over seeds.

Rows: the frozen backbone with mean pooling of the wound tokens (deterministic, no seed),
then every pooling (mean, attention) × loss (VICReg, InfoNCE contrastive, triplet) trained
with the paper's settings (50 epochs, batch 32, lr 1e-2, wd 1e-5, cosine, dim 512) on the
same cached views, one run per training seed. Scored on the workspace's expert triplets.

    python -m benchmarks.vision_ablation [--workspace W] [--seeds 0 1 2] [--epochs 50]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

from annotations.workspace import Workspace
from core.runtime import ensure_images
from core.vision.backbones import OFFLINE_DEFAULT, load_backbone
from core.vision.baseline import embed_baseline
from core.vision.triderm import run_agreement, train

POOLINGS = ("mean", "attention")
LOSSES = ("vicreg", "contrastive", "triplet")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vision_ablation", description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", default=None, help="workspace to use (default: fresh phantom demo in a temp dir)")
    parser.add_argument("--backbone", default=OFFLINE_DEFAULT)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--views", type=int, default=16)
    args = parser.parse_args(argv)
    if len(args.seeds) < 2:
        parser.error("give at least two --seeds for a standard deviation")
    tmp = None if args.workspace else tempfile.mkdtemp(prefix="triderm-ablation-")
    ws = Workspace(args.workspace or os.path.join(tmp, "ws"))
    t0 = time.perf_counter()
    try:
        ensure_images(ws, progress=False)
        backbone = load_backbone(args.backbone)
        results: dict[str, list[float]] = {}
        base = run_agreement(ws, embed_baseline(ws, backbone, progress=False))["balanced"]
        results[f"frozen {backbone.name}, mean pooling"] = [base]
        for pooling in POOLINGS:
            for loss in LOSSES:
                label = f"trained {pooling} pooling, {loss}"
                results[label] = [
                    run_agreement(ws, train(ws, progress=False, backbone=backbone, pooling=pooling, loss=loss,
                                            epochs=args.epochs, views=args.views, seed=seed))["balanced"]
                    for seed in args.seeds]
                print(f"  {label}: " + ", ".join(f"{100 * v:.1f}" for v in results[label]), flush=True)
        n_triplets = len(ws.store.expert_triplets())
        synthetic = ws.is_synthetic
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    width = max(map(len, results))
    print(f"\nTriDerm-V ablation — balanced agreement (%) with {n_triplets} expert triplets, seeds {args.seeds}, "
          f"{args.epochs} epochs{' [SYNTHETIC phantom data]' if synthetic else ''}")
    print(f"{'':{width}}  {'mean':>6} {'sd':>5}")
    for label, vals in results.items():
        sd = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        print(f"{label:{width}}  {100 * np.mean(vals):6.1f} {100 * sd:5.1f}")
    trained = {k: np.mean(v) for k, v in results.items() if k.startswith("trained")}
    best = max(trained, key=trained.get)
    print(f"best: {best} ({100 * trained[best]:.1f}); frozen baseline {100 * base:.1f}; "
          f"{time.perf_counter() - t0:.0f} s total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
