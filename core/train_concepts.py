"""Train the image–text model on wound crops + descriptions: CLIP, SigLIP, MAKE or ConceptCLIP.

``python -m core.train_concepts --objective make|conceptclip|clip|siglip`` fits the
projection heads (and the top ``--unlock-image``/``--unlock-text`` tower blocks) on a
patient-grouped training split, evaluates on the held-out wounds and stores a ``concepts``
run: embeddings.npz (wound and photo embeddings, per-wound concept scores global/local/
fused, patch heatmaps, crop boxes, split) and metrics (loss curve, held-out concept AUROC).

Frozen tower levels are computed once and cached (LiT); only the unlocked top blocks run
at every step. Concept labels for AUROC: the phantom truth (``truth/concepts.csv``) when the
workspace has it, else the description tagger on the held-out wounds.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from annotations import runs
from core import cli
from core.concepts.defaults import OBJECTIVES, OFFLINE_DEFAULT

if TYPE_CHECKING:
    from core.concepts.training import TrainConfig


# ----------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.train_concepts", description=__doc__.split("\n\n")[0])
    cli.add_workspace(p)
    cli.add_device(p)
    p.add_argument("--objective", choices=OBJECTIVES, default="make")
    p.add_argument("--model", default=OFFLINE_DEFAULT, help=f"image–text model ({OFFLINE_DEFAULT} offline, dermlip online)")
    cli.add_epochs(p, 30)
    cli.deprecated(p, "--batch", cli.add_batch_size(p, 32))
    cli.add_lr(p, 1e-3, help="learning rate of the projection heads (default 1e-3)")
    p.add_argument("--tower-lr", type=float, default=1e-4)
    p.add_argument("--unlock", type=int, default=0, help="unlock the top N blocks of both towers (−1 = all)")
    p.add_argument("--unlock-image", type=int, default=None, help="override --unlock for the image tower")
    p.add_argument("--unlock-text", type=int, default=None, help="override --unlock for the text tower")
    cli.deprecated(p, "--size", cli.add_crop_size(p, 160))
    p.add_argument("--holdout", type=float, default=0.3, help="held-out fraction (patient-grouped)")
    p.add_argument("--groups", default="wound", help="concept vocabulary groups, comma-separated")
    p.add_argument("--target", default="body_region", help="metadata column for the concept bottleneck")
    p.add_argument("--beta", type=float, default=0.5, help="local/global fusion weight")
    cli.add_seed(p)
    p.add_argument("--untrained", action="store_true", help="evaluate the untrained heads (epochs ignored)")
    return p


class UsageError(ValueError):
    """A flag combination that cannot give any result (reported as a parser error, exit 2)."""


def _train_config(args: argparse.Namespace) -> TrainConfig:
    from core.concepts.training import TrainConfig

    cfg = TrainConfig(objective=args.objective, epochs=args.epochs, batch=args.batch_size, lr=args.lr,
                      tower_lr=args.tower_lr,
                      image_unlock=args.unlock if args.unlock_image is None else args.unlock_image,
                      text_unlock=args.unlock if args.unlock_text is None else args.unlock_text, seed=args.seed)
    try:
        cfg.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return cfg


def run(args: argparse.Namespace, progress: bool = True) -> dict[str, Any]:
    """Train + evaluate + store; returns the run's metrics (with its ``run_id``)."""
    # torch and the models: here, not at import (a fast --help)
    from core.concepts.dual_encoder import load_vlm
    from core.concepts.run import ConceptData, train_and_evaluate
    from core.concepts.training import Trainer, build_text_inputs
    from core.concepts.vocabulary import load_vocab
    from core.runtime import open_workspace

    ws = open_workspace(args.workspace)
    try:
        concepts = load_vocab(groups=[g.strip() for g in args.groups.split(",") if g.strip()])
    except ValueError as e:
        raise UsageError(f"--groups {args.groups!r}: {e}") from None
    data = ConceptData.load(ws, concepts, args.crop_size, args.holdout, args.seed)
    if not data.labelled():
        raise UsageError(f"--groups {args.groups!r}: none of its concepts has labels in this workspace "
                         f"({data.source}: {', '.join(data.names)}), so there is no AUROC to report; use --groups wound")
    cfg = _train_config(args)
    config = {**vars(args), "modality": "concept", "n_wounds": len(data.pairs), "n_heldout": int(data.held.sum()),
              "synthetic": ws.is_synthetic}
    with runs.recording(ws, runs.CONCEPTS, config, seed=args.seed,
                        name=f"{args.objective}{' (untrained)' if args.untrained else ''}") as rec:
        t0 = time.perf_counter()
        model = load_vlm(args.model, seed=args.seed)
        try:
            trainer = Trainer(model, data.pairs, build_text_inputs(data.pairs, data.tagger), cfg)
        except ValueError as e:
            raise UsageError(f"--objective {args.objective} --model {args.model}: {e}") from None
        metrics = train_and_evaluate(ws, rec, data, trainer, args.beta, args.target, train=not args.untrained,
                                     progress=progress, started=t0)
    metrics = {**metrics, "run_id": rec.id}
    return metrics


def report(metrics: dict[str, Any]) -> str:
    """The run's held-out concept AUROC per concept and its concept bottleneck, as text."""
    lines = [f"run {metrics['run_id']}  concept AUROC on held-out wounds ({metrics['auroc_source']})"]
    fused = metrics["auroc_fused"]
    lines += [f"  {name:24s} global {metrics['auroc_global'].get(name, float('nan')):.3f}  "
              f"local {metrics['auroc_local'].get(name, float('nan')):.3f}  fused {fused[name]:.3f}" for name in fused]
    if "bottleneck" in metrics:
        b = metrics["bottleneck"]
        lines.append(f"concept bottleneck → {b['target']} (held-out accuracy {b['heldout_accuracy']})")
        lines += [f"  {cls:16s} " + ", ".join(f"{n} ({w:+.2f})" for n, w in top) for cls, top in b["top3"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Train and evaluate the image–text model from the command line and print its report."""
    parser = _parser()
    args = cli.parse_args(parser, argv)
    if not 0 < args.holdout < 1:
        parser.error("--holdout must be in (0, 1)")
    if not 0 <= args.beta <= 1:
        parser.error("--beta must be in [0, 1]")
    from core.concepts.dual_encoder import VLMUnavailable
    from core.concepts.training import NotEnoughData

    try:
        metrics = run(args)
    except VLMUnavailable as e:
        parser.exit(2, f"error: {e}\n")
    except (UsageError, NotEnoughData) as e:
        parser.error(str(e))
    print(report(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())

