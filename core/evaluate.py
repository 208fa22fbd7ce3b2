"""Agreement report: every embedding run in a workspace against the expert's triplets.

``python -m core.evaluate [--workspace WS] [--vision RUN] [--text RUN]`` builds the
TriDerm paper's Table 1 (§3.3) for a workspace: each finished run that has image
embeddings or an image-distance matrix × balanced agreement, micro agreement,
macro-F1 and Cohen's κ with 95 % bootstrap CIs over anchors, grouped by modality.
It first computes the two fusions (uncertainty-aware, similarity-based; see
:mod:`core.eval.fusion`) of the latest — or named — vision and text runs and records them
as ``fusion`` runs (an identical existing fusion run is reused). The report is
written as Markdown, CSV and JSON under ``runs/report/`` and printed.
"""
from __future__ import annotations

import argparse

from annotations.infra.workspace import Workspace, resolve_workspace
from core import cli
from core.eval.fusion import DEFAULT_ALPHA
from core.eval.report import run_report, text_table


def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.evaluate`` job; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m core.evaluate", description=__doc__.split("\n\n")[0])
    cli.add_workspace(parser)
    parser.add_argument("--vision", type=int, default=None,
                        help="vision run id to fuse (default: the newest vision-finetune run, else vision-triderm, "
                             "else any vision run)")
    parser.add_argument("--text", type=int, default=None,
                        help="text run id to fuse (default: the newest text-soe run, else any text run)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="vision prior of the uncertainty fusion")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the CIs")
    cli.add_seed(parser, help="bootstrap seed")
    parser.add_argument("--include-ablation", action="store_true",
                        help="also list the runs trained by `python -m core.ablate`")
    args = cli.parse_args(parser, argv)
    if not 0 < args.alpha < 1:
        parser.error(f"--alpha must be in (0, 1), got {args.alpha}")
    if args.n_boot < 10:
        parser.error(f"--n-boot must be at least 10, got {args.n_boot}")
    root = resolve_workspace(args.workspace)
    if not (root / "triderm.sqlite").exists():
        parser.error(f"no workspace at {root} (no triderm.sqlite); import a dataset or train first")
    ws = Workspace(root)
    try:
        result = run_report(ws, args.vision, args.text, args.alpha, args.n_boot, args.seed,
                            args.include_ablation)
    except ValueError as exc:
        parser.error(str(exc))
    print(text_table(ws, result["rows"]))
    print("\nwritten: " + ", ".join(result["paths"].values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

