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
from dataclasses import fields
from typing import Any

from annotations.store import runs
from core import cli
from core.experiments.defaults import VARIANT_OPTIONS, ContrastiveConfig


#: each config field's option (``lam``: ``--lambda``)
FLAGS = {f.name: cli.option_flag(f) for f in fields(ContrastiveConfig)}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.bench_contrastive", description=__doc__.split("\n\n")[0],
                                epilog="An option only some variants read is an error when --variants runs none of "
                                       "them: " + "; ".join(f"{FLAGS[k]}: {', '.join(v)}"
                                                            for k, v in VARIANT_OPTIONS.items()))
    cli.add_workspace(p)
    cli.add_device(p)
    cli.add_config_options(p, {"": {"default": ContrastiveConfig()}})
    for old, new in (("--seeds", "--n-seeds"), ("--size", "--crop-size"), ("--batch", "--batch-size"),
                     ("--lam", "--lambda")):
        cli.deprecated(p, old, p._option_string_actions[new])
    return p


def config_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ContrastiveConfig:
    """The benchmark's config, its ``--quick``-dependent defaults filled in; an option that no variant of
    ``--variants`` reads, or a bad value, exits through ``parser.error`` naming the option."""
    cfg = cli.config_from_args(parser, args, ContrastiveConfig()).settled()
    for name in cli.given_options(args, list(VARIANT_OPTIONS)):
        if not set(VARIANT_OPTIONS[name]) & set(cfg.names):
            parser.error(f"{FLAGS[name]}: read only by the {', '.join(VARIANT_OPTIONS[name])} variant(s), which "
                         f"--variants {cfg.variants} does not run; leave it out")
    return cfg


def run_config(cfg: ContrastiveConfig) -> dict[str, Any]:
    """The settings the run record's config starts with: every cell's settings, the seeds, variants and modes."""
    return {**cfg.settings(), "n_seeds": cfg.n_seeds, "variants": cfg.names, "quick": cfg.quick, "fresh": cfg.fresh}


def _inputs(parser: argparse.ArgumentParser, cfg: ContrastiveConfig, workspace: str | None
            ) -> tuple[Any, Any, list[str | None], Any]:
    """(workspace, wound pairs, probe targets, image–text model); bad input exits through ``parser``."""
    from core.concepts.dual_encoder import VLMUnavailable, load_vlm
    from core.concepts.training import NotEnoughData, load_pairs, target_values
    from core.runtime import open_workspace, user_errors

    assert cfg.crop_size is not None, "a settled config"
    ws = open_workspace(workspace)
    with user_errors(parser, NotEnoughData):
        pairs = load_pairs(ws, size=cfg.crop_size)
    targets = target_values(pairs, cfg.target)
    if all(t is None for t in targets):
        columns = sorted({k for m in pairs.metadata for k in m})
        parser.error(f"--target {cfg.target!r}: no wound, photo or patient has a value in that metadata column; "
                     f"columns: {', '.join(columns) or 'none'}")
    try:
        model = load_vlm(cfg.model)
    except (VLMUnavailable, ValueError) as e:
        parser.exit(2, f"error: {e}\n")
    for flag, value, tower in (("--partial-image", cfg.partial_image, model.image),
                               ("--partial-text", cfg.partial_text, model.text)):
        if value > tower.n_levels:
            parser.error(f"{flag} {value}: {cfg.model} has {tower.n_levels} blocks in that tower")
    return ws, pairs, targets, model


def main(argv: list[str] | None = None) -> int:
    """Train and evaluate every variant over the seeds (cached cells reused), print each cell and the
    table; the run record is marked stopped or failed when the benchmark does not finish."""
    parser = _parser()
    args = cli.parse_args(parser, argv)
    cfg = config_of(parser, args)
    assert cfg.n_seeds is not None, "settled"
    # torch, scikit-learn and the models: after the arguments (a fast --help)
    from core.concepts.training import NotEnoughData
    from core.experiments.contrastive import OUT_DIR, ContrastiveBench

    ws, pairs, targets, model = _inputs(parser, cfg, args.workspace)
    out = ws.runs_dir / OUT_DIR
    (out / "cells").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        with runs.recording(ws, runs.BENCH_CONTRASTIVE, {**run_config(cfg), "synthetic": ws.is_synthetic},
                            seed=0) as rec:
            bench = ContrastiveBench(ws, model, pairs, targets, cfg, out, rec)
            for cell in bench.run():
                print(f"[cached] {cell.variant} seed {cell.seed}" if cell.cached else
                      f"{cell.variant} seed {cell.seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in cell.metrics.items()))
            table = bench.finish(time.perf_counter() - t0)
    except NotEnoughData as e:
        parser.error(str(e))
    print(table.read_text())
    print(f"total {time.perf_counter() - t0:.0f} s; outputs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

