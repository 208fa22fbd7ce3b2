"""Benchmark: TriDerm-V ablation (paper Table 2b) — balanced agreement mean ± sd over seeds.

Rows: the frozen backbone with mean pooling of the wound tokens (deterministic, no seed),
then every pooling (mean, attention) × loss (VICReg, InfoNCE contrastive, triplet) trained
with the paper's settings (50 epochs, batch 32, lr 1e-2, wd 1e-5, cosine, dim 512) on the
same cached views, one run per training seed. Scored on the workspace's expert triplets.

    python -m benchmarks.vision_ablation [--workspace W] [--seeds 0 1 2] [--epochs 50] [--quick]

Writes ``results/vision_ablation.json`` (:mod:`benchmarks.results`) with one-sided paired t-tests
over training seeds for the paper's orderings.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from annotations.infra.workspace import Workspace
from benchmarks.results import (
    RESULTS_DIR,
    command_line,
    mean_sd_ci,
    multiple_tests_note,
    paired_claim,
    render_tables,
    write_result,
)
from core import cli
from core.eval.metrics import evaluate
from core.phantoms import load_truth
from core.runtime import ensure_images
from core.vision.backbones import OFFLINE_DEFAULT, load_backbone
from core.vision.baseline import embed_baseline
from core.vision.triderm import run_agreement, train

POOLINGS = ("mean", "attention")
LOSSES = ("vicreg", "contrastive", "triplet")


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.vision_ablation`` benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vision_ablation", description=__doc__.splitlines()[0])
    cli.add_workspace(parser, help="workspace to use (default: fresh phantom demo in a temp dir)")
    cli.add_device(parser)
    parser.add_argument("--backbone", default=OFFLINE_DEFAULT)
    cli.add_seeds(parser)
    cli.add_epochs(parser, 50)
    parser.add_argument("--views", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="smoke setting: seeds 0 1, 2 epochs, 2 views")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR,
                        help="folder of the result file vision_ablation.json")
    args = cli.parse_args(parser, argv)
    seeds, epochs, views = ([0, 1], 2, 2) if args.quick else (args.seeds, args.epochs, args.views)
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        parser.error(f"give at least two distinct --seeds for sd, CI and paired tests, got {seeds}")
    if epochs < 1 or views < 1:
        parser.error(f"--epochs and --views must be ≥ 1, got {epochs} and {views}")
    tmp = None if args.workspace else tempfile.mkdtemp(prefix="triderm-ablation-")
    ws = Workspace(args.workspace or os.path.join(tmp, "ws"))
    t0 = time.perf_counter()
    try:
        ensure_images(ws, progress=False)
        backbone = load_backbone(args.backbone)
        base = 100 * run_agreement(ws, embed_baseline(ws, backbone, progress=False))["balanced"]
        results: dict[tuple[str, str], list[float]] = {}
        for pooling in POOLINGS:
            for loss in LOSSES:
                results[pooling, loss] = [
                    100 * run_agreement(ws, train(ws, progress=False, backbone=backbone, pooling=pooling, loss=loss,
                                                  epochs=epochs, views=views, seed=seed))["balanced"]
                    for seed in seeds]
                print(f"  {pooling} pooling, {loss}: " + ", ".join(f"{v:.1f}" for v in results[pooling, loss]),
                      flush=True)
        expert = ws.store.expert_triplets()
        synthetic = ws.is_synthetic
        ceiling = None
        if ws.truth_dir.is_dir():
            truth = load_truth(ws.truth_dir)
            ceiling = 100 * evaluate(truth.image_ids, truth.distance_matrix(), expert)["balanced"]
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = [[f"frozen {backbone.name}", "mean of wound tokens", "—", base]]
    rows += [["trained", pooling, loss, mean_sd_ci(vals)] for (pooling, loss), vals in results.items()]
    if ceiling is not None:
        rows.append(["latent truth (the planted ceiling)", "—", "—", ceiling])
    tables = [{"caption": f"Balanced agreement (%) with {len(expert)} expert triplets; {epochs} epochs, {views} "
                          f"cached views, {len(seeds)} training seeds (the frozen baseline has no seed)",
               "columns": ["backbone", "pooling", "loss", "balanced %"], "rows": rows}]
    claims = [paired_claim("attention pooling beats mean pooling (VICReg)", results["attention", "vicreg"],
                           results["mean", "vicreg"]),
              paired_claim("VICReg beats the triplet loss (attention pooling)", results["attention", "vicreg"],
                           results["attention", "triplet"]),
              paired_claim("the triplet loss beats InfoNCE (attention pooling)", results["attention", "triplet"],
                           results["attention", "contrastive"])]
    best = max(results, key=lambda k: float(np.mean(results[k])))
    notes = [f"Best trained cell: {best[0]} pooling, {best[1]} ({np.mean(results[best]):.1f}); frozen baseline "
             f"{base:.1f}. Paired tests match training seeds.", multiple_tests_note(claims)]
    print(render_tables(tables))
    print("\n".join(notes))
    title = "TriDerm-V ablation (Table 2b): pooling × loss" + (" [quick]" if args.quick else "")
    path = write_result("vision_ablation", title, command_line("benchmarks.vision_ablation", argv), seeds, tables,
                        claims, notes, synthetic=synthetic, seconds=time.perf_counter() - t0,
                        results_dir=args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
