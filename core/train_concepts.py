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
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any

from annotations.store import runs
from core import cli
from core.concepts.defaults import TRAINING_OPTIONS, ConceptsConfig

if TYPE_CHECKING:
    from core.concepts.training import TrainConfig


# ----------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.train_concepts", description=__doc__.split("\n\n")[0])
    cli.add_workspace(p)
    cli.add_device(p)
    cli.add_config_options(p, {"": {"default": ConceptsConfig()}})
    cli.deprecated(p, "--batch", p._option_string_actions["--batch-size"])
    cli.deprecated(p, "--size", p._option_string_actions["--crop-size"])
    return p


def config_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ConceptsConfig:
    """The run's config: the defaults with the options given; a training option given with ``--untrained`` (it
    trains nothing) or a bad value exits through ``parser.error`` naming the option."""
    names = [f.name for f in fields(ConceptsConfig)]
    unread = [cli.flag(n) for n in cli.given_options(args, names) if n in TRAINING_OPTIONS]
    if args.untrained and unread:
        parser.error(f"{', '.join(unread)}: not read with --untrained, which evaluates the untrained heads without "
                     f"training; leave {'it' if len(unread) == 1 else 'them'} out")
    return cli.config_from_args(parser, args, ConceptsConfig())


class UsageError(ValueError):
    """A flag combination that cannot give any result (reported as a parser error, exit 2)."""


def _train_config(config: ConceptsConfig) -> TrainConfig:
    from core.concepts.training import TrainConfig

    cfg = TrainConfig(objective=config.objective, epochs=config.epochs, batch=config.batch_size, lr=config.lr,
                      tower_lr=config.tower_lr,
                      image_unlock=config.unlock if config.unlock_image is None else config.unlock_image,
                      text_unlock=config.unlock if config.unlock_text is None else config.unlock_text, seed=config.seed)
    try:
        cfg.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return cfg


def run_config(config: ConceptsConfig, workspace: str | None) -> dict[str, Any]:
    """The settings the run record's config starts with: ``config``'s fields, the workspace as given and the
    device and precision the process computes in."""
    from core.runtime import pick_device, precision_name

    device = pick_device()
    return {"workspace": workspace, "device": device.type, "precision": precision_name(device), **asdict(config)}


def run(config: ConceptsConfig, workspace: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Train + evaluate + store a ``concepts`` run on ``workspace`` (the default one when ``None``); returns the
    run's metrics (with its ``run_id``)."""
    # torch and the models: here, not at import (a fast --help)
    from core.concepts.dual_encoder import load_vlm
    from core.concepts.run import ConceptData, train_and_evaluate
    from core.concepts.training import Trainer, build_text_inputs
    from core.concepts.vocabulary import load_vocab
    from core.runtime import open_workspace

    ws = open_workspace(workspace)
    try:
        concepts = load_vocab(groups=[g.strip() for g in config.groups.split(",") if g.strip()])
    except ValueError as e:
        raise UsageError(f"--groups {config.groups!r}: {e}") from None
    data = ConceptData.load(ws, concepts, config.crop_size, config.holdout, config.seed)
    if not data.labelled():
        raise UsageError(f"--groups {config.groups!r}: none of its concepts has labels in this workspace "
                         f"({data.source}: {', '.join(data.names)}), so there is no AUROC to report; use --groups wound")
    cfg = _train_config(config)
    record = {**run_config(config, workspace), "modality": "concept", "n_wounds": len(data.pairs),
              "n_heldout": int(data.held.sum()), "synthetic": ws.is_synthetic}
    with runs.recording(ws, runs.CONCEPTS, record, seed=config.seed,
                        name=f"{config.objective}{' (untrained)' if config.untrained else ''}") as rec:
        t0 = time.perf_counter()
        model = load_vlm(config.model, seed=config.seed)
        try:
            trainer = Trainer(model, data.pairs, build_text_inputs(data.pairs, data.tagger), cfg)
        except ValueError as e:
            raise UsageError(f"--objective {config.objective} --model {config.model}: {e}") from None
        metrics = train_and_evaluate(ws, rec, data, trainer, config.beta, config.target, train=not config.untrained,
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
    config = config_of(parser, args)
    from core.concepts.dual_encoder import VLMUnavailable
    from core.concepts.training import NotEnoughData

    try:
        metrics = run(config, args.workspace)
    except VLMUnavailable as e:
        parser.exit(2, f"error: {e}\n")
    except (UsageError, NotEnoughData) as e:
        parser.error(str(e))
    print(report(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())

