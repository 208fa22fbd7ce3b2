"""Frozen vision baseline: mean of each wound's backbone tokens (TriDerm §3.3 baselines).

The photo is resized to the backbone's own input size (no augmentation); a wound's
embedding is the mean of its tokens (:mod:`core.vision.features`), an image's embedding the mean
of its wounds. Recorded as a ``vision-baseline`` run.

    python -m core.embed --backbone efficientnet-lite0 [--workspace W]
"""
from __future__ import annotations

import argparse

from core.runtime import open_workspace, user_errors
from core.vision.backbones import OFFLINE_DEFAULT, BackboneUnavailable, load_backbone
from core.vision.baseline import embed_baseline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.embed", description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", default=None, help="workspace folder (default $TRIDERM_WORKSPACE or ./workspace)")
    parser.add_argument("--backbone", default=OFFLINE_DEFAULT, help=f"backbone name (default {OFFLINE_DEFAULT})")
    args = parser.parse_args(argv)
    ws = open_workspace(args.workspace, parser, require_wounds=True)
    with user_errors(parser, BackboneUnavailable, ValueError, FileNotFoundError):
        backbone = load_backbone(args.backbone)
    run_id = embed_baseline(ws, backbone)
    print(f"run {run_id}: frozen {backbone.name} mean-pool baseline → {ws.run_dir(run_id)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

