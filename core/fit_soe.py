"""Fit a Soft Ordinal Embedding to a triplet source and record it as a ``text-soe`` run.

TriDerm-T (paper §2.2, §3.2): SOE on the LLM's triplet answers gives the text embedding;
``python -m core.fit_soe --source llm:<model> --dim 4`` fits it, saves the embedding
(``runs/<id>/embeddings.npz``) and prints its agreement with the expert's triplets.
Photos that appear in no triplet of the source carry no information and are left out
(the evaluation counts expert triplets naming them as missing).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from annotations.infra.workspace import Workspace, resolve_workspace
from core import cli
from core.eval.metrics import METRICS


def agreement_table(summary: dict[str, Any]) -> str:
    """A small text table of the agreement with the expert's triplets."""
    e = summary["expert_agreement"]
    head = f"{'metric':<10} {'value':>8}"
    lines = [f"SOE on {summary['source']} (run {summary['run_id']}"
             + (", SYNTHETIC data)" if summary["synthetic"] else ")"), head, "-" * len(head)]
    for m in METRICS:
        v = e.get(m)
        shown = f"{v:.3f}" if v is not None and not math.isnan(v) else "n/a"
        lines.append(f"{m:<10} {shown:>8}")
    lines.append(f"expert triplets scored: {e.get('n', 0)} over {e.get('n_anchors', 0)} anchors "
                 f"(skipped {e.get('n_skipped', 0)}, photos without text triplets {e.get('n_missing', 0)})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.fit_soe`` job; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m core.fit_soe",
                                     description="Fit SOE to a triplet source (e.g. llm:<model>) and record a text-soe run.")
    cli.add_workspace(parser)
    cli.add_device(parser)
    parser.add_argument("--source", default=None,
                        help="triplet source, e.g. llm:gpt-oss:120b (default: the llm:* source with most triplets)")
    parser.add_argument("--dim", type=int, default=4, help="embedding dimension (paper: 4)")
    parser.add_argument("--paper-protocol", action="store_true",
                        help="the paper's settings (δ=0, batch 2048, 50 epochs) instead of the measured default")
    parser.add_argument("--margin", type=float, default=None)
    cli.add_epochs(parser, None, help="training epochs (default: SOE's)")
    cli.add_lr(parser, None, help="learning rate (default: SOE's)")
    cli.add_seed(parser)
    args = cli.parse_args(parser, argv)
    if args.dim < 1:
        parser.error("--dim must be ≥ 1")
    from core.text.fit import fit_source  # torch and scikit-learn: after the arguments (a fast --help)
    from core.text.soe import SOE

    ws = Workspace(resolve_workspace(args.workspace))
    source = args.source
    if source is None:
        llm = {s: n for s, n in ws.store.triplet_sources().items() if s.startswith("llm:")}
        if not llm:
            parser.error(f"no llm:* triplets in {ws.root}; run `python -m core.llm_triplets` first or pass --source")
        source = max(llm, key=lambda s: llm[s])
    overrides = {k: v for k, v in (("margin", args.margin), ("epochs", args.epochs), ("lr", args.lr)) if v is not None}
    base = SOE.paper_protocol() if args.paper_protocol else SOE()
    soe = base.set_params(n_components=args.dim, random_state=args.seed, **overrides)
    try:
        summary = fit_source(ws, source, soe)
    except ValueError as exc:
        parser.error(str(exc))
    print(agreement_table(summary), file=sys.stderr)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

