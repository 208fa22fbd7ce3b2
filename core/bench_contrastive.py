"""Contrastive-objective benchmark: CLIP variants under identical settings, same metrics.

``python -m core.bench_contrastive [--quick]`` trains every variant of the contrastive
benchmark (papers/contrastive_benchmark_*.txt §2–3, Table 5; METHODS.md §5) on the
workspace's wound crops + descriptions — same patient-grouped split, batch, learning
rates, epochs and seeds — and evaluates them the same way:

- image→text and text→image Recall@1/5/10 on the held-out wounds;
- zero-shot concept AUROC (fused global/local prompt scores, mean over concepts; phantom
  truth labels when present, else the description tagger);
- linear-probe accuracy of the image embedding on a target column (held-out), next to the
  majority-class accuracy (``probe_majority``, the chance level of the probe);
- triplet agreement (balanced) of the photo embedding (mean of its wounds) vs the expert.

Variants (towers: ``all`` = fully trainable, ``0`` = frozen, ``L`` = top L blocks):
``clip`` (baseline, both towers trainable), ``siglip``, ``image_frozen``, ``text_frozen``,
``image_partial``, ``text_partial``, ``clip_unimodal`` (λ·L_clip + (1−λ)·NT-Xent on two
augmented views), ``clip_masked`` (unimodal term against a patch-masked view) and ``flip``
(FLIP: ``--patch-dropout`` of the patch tokens of a fully trainable ViT image tower dropped
in every training step; skipped with the reason on CNN backbones such as the offline default).

Outputs under ``runs/bench_contrastive/``: ``table.md``, ``table.csv``, ``results.json``
(mean ± sd over seeds, and each variant's seed-paired difference from ``clip`` with a paired
t-test), ``chart.json``/``chart.html`` (plotly bars) and ``cells/`` — one JSON per finished
(variant, seed) cell, reused on the next run when its settings match.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from annotations import runs
from core import cli
from core.concepts.defaults import OFFLINE_DEFAULT
from core.experiments.defaults import VARIANTS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.bench_contrastive", description=__doc__.split("\n\n")[0])
    cli.add_workspace(p)
    cli.add_device(p)
    p.add_argument("--quick", action="store_true", help="1 seed, 2 epochs, 96 px crops")
    p.add_argument("--model", default=OFFLINE_DEFAULT)
    cli.deprecated(p, "--seeds", cli.add_n_seeds(p, None, help="number of seeds 0 … N−1 (default 5; quick 1)"))
    cli.add_epochs(p, None, help="epochs (default 8; quick 2)")
    cli.deprecated(p, "--size", cli.add_crop_size(p, None, help="crop side in px (default 160; quick 96)"))
    cli.deprecated(p, "--batch", cli.add_batch_size(p, 32))
    cli.add_lr(p, 1e-3, help="learning rate of the projection heads (default 1e-3)")
    p.add_argument("--tower-lr", type=float, default=1e-4, help="unlocked tower blocks")
    p.add_argument("--partial-image", type=int, default=2, help="image_partial: top L image blocks unlocked")
    p.add_argument("--partial-text", type=int, default=3, help="text_partial: top L text layers unlocked")
    cli.deprecated(p, "--lam", cli.add_lambda(p, 0.5, help="λ of λ·L_clip + (1−λ)·L_uni (default 0.5)"))
    p.add_argument("--patch-dropout", type=float, default=0.5, help="flip: fraction of ViT patches dropped")
    p.add_argument("--holdout", type=float, default=0.3)
    p.add_argument("--target", default="fitzpatrick", help="metadata column for the linear probe")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    p.add_argument("--fresh", action="store_true", help="ignore cached cells")
    return p


SETTINGS = ("model", "epochs", "crop_size", "batch_size", "lr", "tower_lr", "partial_image", "partial_text", "lam",
            "patch_dropout", "holdout", "target")


def _settle(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """Fill the ``--quick``-dependent defaults and check the options; the variants to run."""
    defaults = {"n_seeds": (1, 5), "epochs": (2, 8), "crop_size": (96, 160)}  # (quick, full)
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        parser.error(f"unknown variant(s) {bad or args.variants!r}; choose from {VARIANTS}")
    for flag, ok in (("--epochs must be ≥ 1", args.epochs >= 1),
                     ("--batch-size must be ≥ 2", args.batch_size >= 2), ("--crop-size must be ≥ 32 px", args.crop_size >= 32),
                     ("--holdout must be in (0, 1)", 0 < args.holdout < 1), ("--lambda must be in [0, 1]", 0 <= args.lam <= 1),
                     ("--patch-dropout must be in [0, 1)", 0 <= args.patch_dropout < 1),
                     ("--partial-image and --partial-text must be ≥ 1", min(args.partial_image, args.partial_text) >= 1)):
        if not ok:
            parser.error(flag)
    return variants


def _inputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Any, Any, list[str | None], Any]:
    """(workspace, wound pairs, probe targets, image–text model); bad input exits through ``parser``."""
    from core.concepts.dual_encoder import VLMUnavailable, load_vlm
    from core.concepts.training import NotEnoughData, load_pairs, target_values
    from core.runtime import open_workspace, user_errors

    ws = open_workspace(args.workspace)
    with user_errors(parser, NotEnoughData):
        pairs = load_pairs(ws, size=args.crop_size)
    targets = target_values(pairs, args.target)
    if all(t is None for t in targets):
        columns = sorted({k for m in pairs.metadata for k in m})
        parser.error(f"--target {args.target!r}: no wound, photo or patient has a value in that metadata column; "
                     f"columns: {', '.join(columns) or 'none'}")
    try:
        model = load_vlm(args.model)
    except (VLMUnavailable, ValueError) as e:
        parser.exit(2, f"error: {e}\n")
    for flag, value, tower in (("--partial-image", args.partial_image, model.image),
                               ("--partial-text", args.partial_text, model.text)):
        if value > tower.n_levels:
            parser.error(f"{flag} {value}: {args.model} has {tower.n_levels} blocks in that tower")
    return ws, pairs, targets, model


def main(argv: list[str] | None = None) -> int:
    """Train and evaluate every variant over the seeds (cached cells reused), print each cell and the
    table; the run record is marked stopped or failed when the benchmark does not finish."""
    parser = _parser()
    args = cli.parse_args(parser, argv)
    variants = _settle(parser, args)
    # torch, scikit-learn and the models: after the arguments (a fast --help)
    from core.concepts.training import NotEnoughData
    from core.experiments.contrastive import OUT_DIR, ContrastiveBench

    ws, pairs, targets, model = _inputs(parser, args)
    settings = {k: getattr(args, k) for k in SETTINGS}
    out = ws.runs_dir / OUT_DIR
    (out / "cells").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        with runs.recording(ws, runs.BENCH_CONTRASTIVE, {**settings, "n_seeds": args.n_seeds, "variants": variants,
                                                         "quick": args.quick, "synthetic": ws.is_synthetic},
                            seed=0) as rec:
            bench = ContrastiveBench(ws, model, pairs, targets, settings, out, rec, fresh=args.fresh)
            for cell in bench.run(variants, args.n_seeds, args):
                print(f"[cached] {cell.variant} seed {cell.seed}" if cell.cached else
                      f"{cell.variant} seed {cell.seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in cell.metrics.items()))
            table = bench.finish(args.n_seeds, time.perf_counter() - t0)
    except NotEnoughData as e:
        parser.error(str(e))
    print(table.read_text())
    print(f"total {time.perf_counter() - t0:.0f} s; outputs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

