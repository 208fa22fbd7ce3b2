"""Ablation tables (TriDerm paper Table 2) on any workspace, resumable.

``python -m core.ablate [--workspace WS] [--quick] [--seeds 3]`` measures balanced
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

Every cell × seed is cached as JSON under ``runs/ablation/cells/`` keyed by a hash of
its configuration and a fingerprint of the data it uses, so an interrupted ablation
resumes where it stopped and shared cells (dim 4 = budget 100 % = the default oracle;
attention = VICReg) are computed once.
"""
from __future__ import annotations

import argparse

from annotations.workspace import Workspace, resolve_workspace
from core.experiments.ablation import AblationInputError, format_table, run_ablation, titles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.ablate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", default=None, help="workspace folder (default: $TRIDERM_WORKSPACE or ./workspace)")
    parser.add_argument("--quick", action="store_true", help="short vision training (10 epochs) for a fast pass")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per cell (≥ 1; the paper's protocol uses ≥ 3)")
    parser.add_argument("--tables", nargs="+", choices=("text", "vision"), default=["text", "vision"])
    parser.add_argument("--source", default=None, help="LLM triplet source for the dim/budget rows "
                        "(default: the llm:<model> source with most triplets)")
    parser.add_argument("--vision-epochs", type=int, default=None, help="training epochs per vision cell")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be ≥ 1, got {args.seeds}")
    if args.vision_epochs is not None and args.vision_epochs < 1:
        parser.error(f"--vision-epochs must be ≥ 1, got {args.vision_epochs}")
    root = resolve_workspace(args.workspace)
    if not (root / "triderm.sqlite").exists():
        parser.error(f"no workspace at {root} (no triderm.sqlite); import a dataset first")
    ws = Workspace(root)
    try:
        out = run_ablation(ws, args.seeds, args.quick, tuple(args.tables), args.source, args.vision_epochs)
    except AblationInputError as exc:
        parser.error(str(exc))
    t = titles(ws, args.seeds, args.quick)
    for table in ("text", "vision"):
        if any(s["table"] == table for s in out["summary"]):
            print("\n" + format_table(out["summary"], table, t[table]))
    for note in out["notes"]:
        print(note)
    print(f"\ncells computed {out['computed']}, reused {out['reused']}; written: {', '.join(out['paths'].values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

