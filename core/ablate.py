"""Ablation tables (TriDerm paper Table 2) on any workspace, resumable.

``python -m core.ablate [--workspace WS] [--quick] [--n-seeds 3]`` measures balanced
agreement with the expert's triplets (mean ± sd over seeds) for

- Table 2a, text (SOE on LLM triplets, :class:`core.text.soe.SOE`): embedding dimension 2–6;
  triplet budget 0.1 / 1 / 10 / 100 % of the oracle's triplets (a seeded random subset);
  every LLM oracle in the store (each distinct ``llm:<model>`` triplet source);
- Table 2b, vision (TriDerm-V training, :func:`core.vision.triderm.train`): mean vs
  attention pooling; VICReg vs contrastive vs triplet loss, the latter two also at the
  settings the paper found best for them (contrastive: batch 128, lr 1e-3; triplet: batch 8).

SOE cells embed every photo of the workspace; with a small budget, photos that occur in no
sampled triplet keep their random initial position, so they count against agreement just
as an uninformed embedding would.

Every cell × seed is cached as JSON under ``runs/ablation/cells/`` keyed by its resolved
configuration (every default filled in), the seed, the device, the backbone (layer and
weights), a hash of the data content and a hash of the source of the code that computes it,
so an interrupted ablation resumes where it stopped, shared cells (dim 4 = budget 100 % =
the default oracle; attention = VICReg) are computed once, and a changed default, input or
computing module is never served from a stale cell.

``--results DIR`` also writes the tables as the result file ``DIR/ablation.json``
(:mod:`benchmarks.results`, run from the repository root), with one-sided paired t-tests
over seeds.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from annotations.infra.workspace import Workspace, resolve_workspace
from core import cli
from core.experiments.ablation import (
    BUDGETS,
    DEFAULT_DIM,
    SOE_DIMS,
    AblationInputError,
    format_table,
    run_ablation,
    titles,
)


def write_results(ws: Workspace, out: dict[str, Any], seeds: int, quick: bool, argv: list[str] | None,
                  seconds: float, results_dir: Path) -> Path:
    """The ablation tables as ``results_dir/ablation.json``: balanced and micro agreement (%) as mean ± sd
    [95 % CI] over seeds beside the paper's figure, and paired claims for the paper's orderings."""
    from core.eval.result_files import command_line, write_result
    from core.eval.protocol import paired_claim
    from core.eval.stats import mean_sd_ci, multiple_tests_note

    summary, t = out["summary"], titles(ws, seeds, quick)
    ceiling = []
    if ws.truth_dir.is_dir():  # a phantom: its latent truth scored the same way is the planted ceiling
        from core.eval.metrics import evaluate
        from core.phantoms import load_truth

        truth = load_truth(ws.truth_dir)
        agree = evaluate(truth.image_ids, truth.distance_matrix(), ws.store.expert_triplets())
        ceiling = [["latent truth (the planted ceiling)", 100 * agree["balanced"], 100 * agree["micro"], None, None]]
    tables, claims = [], []
    for table in ("text", "vision"):
        rows = [s for s in summary if s["table"] == table]
        if not rows:
            continue
        tables.append({"caption": t[table], "columns": ["setting", "balanced %", "micro %", "paper balanced %",
                                                        "training triplets"],
                       "rows": [[s["label"], mean_sd_ci(100 * v for v in s["balanced_values"]),
                                 {"mean": 100 * s["micro_mean"], "sd": 100 * s["micro_sd"] if seeds > 1 else None},
                                 s["paper"], s["n_train_triplets"]] for s in rows] + ceiling})
    by_label = {s["label"]: s["balanced_values"] for s in summary}
    if seeds >= 2:
        pairs = [(f"dim {DEFAULT_DIM}", f"dim {d}") for d in SOE_DIMS if d != DEFAULT_DIM]
        full = max(BUDGETS)
        pairs += [(f"budget {100 * full:g}%", f"budget {100 * b:g}%") for b in BUDGETS if b != full]
        pairs += [("pooling attention", "pooling mean"), ("loss vicreg", "loss triplet"),
                  ("loss triplet", "loss contrastive")]
        claims = [paired_claim(f"{a} beats {b} (balanced agreement)", by_label[a], by_label[b])
                  for a, b in pairs if a in by_label and b in by_label]
    notes = [*out["notes"], f"{out['computed']} cells computed, {out['reused']} reused from the cell cache."]
    if claims:
        notes.append(multiple_tests_note(claims))
    return write_result("ablation", "Ablations (TriDerm Table 2)" + (" [quick]" if quick else ""),
                        command_line("core.ablate", argv), list(range(seeds)), tables, claims, notes,
                        synthetic=ws.is_synthetic, seconds=seconds, results_dir=results_dir)



def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.ablate`` job; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m core.ablate", description=__doc__.split("\n\n")[0])
    cli.add_workspace(parser)
    cli.add_device(parser)
    parser.add_argument("--quick", action="store_true", help="short vision training (10 epochs) for a fast pass")
    cli.deprecated(parser, "--seeds", cli.add_n_seeds(parser, 3, help="seeds 0 … N−1 per cell (default 3; the paper's "
                                                                     "protocol uses ≥ 3)"))
    parser.add_argument("--tables", nargs="+", choices=("text", "vision"), default=["text", "vision"])
    parser.add_argument("--source", default=None, help="LLM triplet source for the dim/budget rows "
                        "(default: the llm:<model> source with most triplets)")
    parser.add_argument("--vision-epochs", type=int, default=None, help="training epochs per vision cell")
    parser.add_argument("--results", type=Path, default=None,
                        help="also write the result file ablation.json to this folder (e.g. results)")
    args = cli.parse_args(parser, argv)
    if args.vision_epochs is not None and args.vision_epochs < 1:
        parser.error(f"--vision-epochs must be ≥ 1, got {args.vision_epochs}")
    if args.source is not None and "text" not in args.tables:
        parser.error("--source picks the oracle of Table 2a: add text to --tables or drop --source")
    if (args.vision_epochs is not None or args.quick) and "vision" not in args.tables:
        parser.error("--quick and --vision-epochs shorten Table 2b: add vision to --tables or drop them")
    root = resolve_workspace(args.workspace)
    if not (root / "triderm.sqlite").exists():
        parser.error(f"no workspace at {root} (no triderm.sqlite); import a dataset first")
    ws = Workspace(root)
    t0 = time.perf_counter()
    try:
        out = run_ablation(ws, args.n_seeds, args.quick, tuple(args.tables), args.source, args.vision_epochs)
    except AblationInputError as exc:
        parser.error(str(exc))
    t = titles(ws, args.n_seeds, args.quick)
    for table in ("text", "vision"):
        if any(s["table"] == table for s in out["summary"]):
            print("\n" + format_table(out["summary"], table, t[table]))
    for note in out["notes"]:
        print(note)
    if args.results is not None:
        if not out["summary"]:
            parser.error("nothing measured, so no result file: the workspace has no llm:<model> triplets for "
                         "Table 2a (run `python -m core.llm_triplets` first) and --tables excludes vision")
        print(f"result file: {write_results(ws, out, args.n_seeds, args.quick, argv, time.perf_counter() - t0, args.results)}")
    print(f"\ncells computed {out['computed']}, reused {out['reused']}; written: {', '.join(out['paths'].values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

