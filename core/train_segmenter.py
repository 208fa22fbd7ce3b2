"""Train the wound segmenter (EfficientNet-Lite0, stride-32 stages fine-tuned, + FPN decoder) on wound masks.

By default a workspace's outlined photos, plus every ``--data`` dataset folder's photos that have a
mask, fine-tune the default segmenter's decoder head (:data:`core.segmentation.defaults.FINE_TUNE`; ``--tune all``
trains the whole decoder and the encoder's tuned stages too; an epoch
shows each training photo once, as itself, a flip or a random rotated/scaled/colour-jittered view);
whole patients / file-name series making up ``--val-fraction`` of the photos are held out and their
mean per-photo Dice is the run's ``dice``. The run (kind ``segmenter``) records the loss per epoch
and the checkpoint ``runs/<id>/segmenter.safetensors``, which the outline editor's suggestions and
click-to-outline use. ``--pretrain`` makes the default instead: it trains from ImageNet on the
``--data`` folders only (no workspace photos), records the run in the workspace, and installs the
weights as the package's default (``core/segmentation/default/``, model card beside them).

    python -m core.train_segmenter [--workspace W] [--data DIR ...] [--epochs 40] [--batch-size 8]
                                   [--lr 1e-3] [--seed 0] [--val-fraction 0.2] [--device auto|cpu|cuda]
    python -m core.train_segmenter --pretrain --data ../shared/data/fuseg-dev [--epochs 10] --val-fraction 0
"""
from __future__ import annotations

import argparse
import shutil

from core import cli
from core.runtime import open_workspace, user_errors
from core.segmentation.defaults import SegmenterConfig


def build_parser() -> argparse.ArgumentParser:
    """The job's options: workspace, ``--data``, one per :class:`~core.segmentation.defaults.SegmenterConfig`
    field, device."""
    parser = argparse.ArgumentParser(prog="python -m core.train_segmenter", description=__doc__.splitlines()[0])
    cli.add_workspace(parser)
    parser.add_argument("--data", action="append", default=[], metavar="DIR",
                        help="a dataset folder with images/ and masks/ to train on as well (repeatable)")
    cli.add_config_options(parser, {"": {"default": SegmenterConfig()}})
    cli.add_device(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.train_segmenter`` job; returns the exit status."""
    parser = build_parser()
    args = cli.parse_args(parser, argv)
    config = cli.config_from_args(parser, args, SegmenterConfig())
    import torch  # after the arguments: a fast --help

    from core.segmentation.model import default_path
    from core.segmentation.training import train_segmenter
    from core.vision.backbones import BackboneUnavailable

    ws = open_workspace(args.workspace, parser)
    with user_errors(parser, ValueError, FileNotFoundError, BackboneUnavailable):
        run_id = train_segmenter(ws, args.data, config, device=torch.device(args.device))
    run = ws.store.run(run_id)
    assert run is not None, run_id  # just recorded
    dice, before = run["metrics"].get("dice"), run["metrics"].get("dice_start")
    checkpoint = ws.root / run["artifacts"]["checkpoint"]
    print(f"run {run_id}: segmenter trained on {run['metrics']['n_train']} photos, final loss "
          f"{run['metrics']['loss'][-1]:.4f}; held-out Dice "
          + (f"{dice:.3f} on {run['metrics']['n_val']} photos" if dice is not None else "not measured (no hold-out)")
          + ("" if before is None else f" (the segmenter it started from: {before:.3f} on the same photos)")
          + f" → {checkpoint}")
    if before is not None and dice is not None and dice < before:
        print("warning: the fine-tune outlines this workspace's held-out photos worse than the segmenter it started "
              "from; on few photos a fine-tune can over-fit them (MODEL_CARD.md, failure modes). Suggestions now come "
              "from this run: check them, outline more photos and retrain.")
    if config.pretrain:
        shutil.copyfile(checkpoint, default_path())
        print(f"installed as the default segmenter: {default_path()} (update MODEL_CARD.md beside it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
