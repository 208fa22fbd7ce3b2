"""Where the default fine-tune fit spends its time, against its arithmetic (issue 52 §1).

Builds (or reuses) the SYNTHETIC phantom demo workspace, takes its cached stage-6 features as
:func:`core.vision.finetune.train_finetuned` does, and on ONE torch thread, in CPU seconds (so the
figures hold on a shared machine) prints:

- the FLOPs of one fit step over every photo (:func:`core.vision.token_tail.step_flops`, what a run
  record holds: the token-restricted tail's convolutions, forward, weight gradient, and input gradient
  except the first's), beside the dense tail's forward;
- the CPU seconds of ``LastStageTuner.fit`` per step and the FLOP/s it reaches;
- the machine's dense GEMM rate at the tail's own matrix shapes (the floor's rate);
- the share of feature-grid cells that hold a wound token (only those reach the pooled embedding,
  since every layer after the depthwise convolution acts per cell) and the share the depthwise
  convolution reads: the cells :func:`core.vision.token_tail.token_pooled` computes.

    python scripts/profile_finetune.py [--workspace W] [--steps 10]

``py-spy record -f flamegraph -o fit.svg -- python scripts/profile_finetune.py`` draws the flame graph
of docs/profiles/finetune_fit.svg.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from annotations.infra.workspace import Workspace
from benchmarks.train_triderm import gemm_rate
from core.eval.protocol import oriented_expert
from core.runtime import ensure_images
from core.vision.backbones import load_backbone
from core.vision.features import FeatureCache, workspace_wounds
from core.vision.finetune import FineTuneConfig, LastStageTuner
from core.vision.recipe import OFFLINE_DEFAULT
from core.vision.token_tail import step_flops


def main(argv: list[str] | None = None) -> int:
    """Print the profile's figures; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python scripts/profile_finetune.py", description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", help="workspace (default: the phantom demo in a temporary folder)")
    parser.add_argument("--steps", type=int, default=10, help="fit steps timed (default 10)")
    parser.add_argument("--views", type=int, default=4, help="augmented views per photo (the demo's 4)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="triderm-profile-") as tmp:
        ws = Workspace(args.workspace or Path(tmp) / "ws")
        ensure_images(ws, progress=False)
        image_ids, _ = workspace_wounds(ws)
        stage6 = load_backbone(OFFLINE_DEFAULT, device="cpu", layer="stage6")
        t0 = time.process_time()
        photos = FeatureCache(ws, stage6, seed=0).build(image_ids, args.views, progress=False)
        cache_s = time.process_time() - t0
        tuner = LastStageTuner(stage6, [photos[i] for i in image_ids], FineTuneConfig(steps=args.steps))
        triplets = oriented_expert(ws, image_ids)
        n = len(image_ids)
        per_step = step_flops(tuner.start, tuner.view_w[:, 0])
        forward = sum(2 * m.weight.numel() * tuner.eval_x.shape[-2] * tuner.eval_x.shape[-1]
                      for m in tuner.start.modules() if isinstance(m, torch.nn.Conv2d))
        t0 = time.process_time()
        tuner.fit(triplets, np.arange(n))
        step_s = (time.process_time() - t0) / args.steps
    cells = tuner.view_w.shape[-2] * tuner.view_w.shape[-1]
    tokens = (tuner.view_w > 0).float()
    dilated = torch.zeros(1, 1, 5, 5)
    dilated[0, 0, ::2, ::2] = 1  # the last stage's 3×3 depthwise kernel at dilation 2
    read = (F.conv2d(F.pad(tokens.flatten(0, 1)[:, None], (2, 2, 2, 2)), dilated) > 0).float().mean().item()
    token_share = tokens.mean().item()
    block = tuner.start[0][0]
    per_cell = {name: 2 * m.weight[:, :, 0, 0].numel() for name, m in
                (("expand", block.conv_pw), ("project", block.conv_pwl), ("head", tuner.start[1]))}
    sparse = cells * (per_cell["expand"] * read + (per_cell["project"] + per_cell["head"]) * token_share)
    rate = gemm_rate(int(tokens[:, 0].sum()), [(192, 1152), (1152, 320), (320, 1280)])
    rows = [
        ("photos per step (every photo, one view each)", f"{n}"),
        ("forward FLOPs per photo (convolutions)", f"{forward / 1e6:.0f} M"),
        ("fit step FLOPs (token-restricted: forward, weight and input gradients)", f"{per_step / 1e9:.1f} G"),
        ("fit step, CPU s (1 thread)", f"{step_s:.2f}"),
        ("fit step reaches", f"{per_step / step_s / 1e9:.1f} GFLOP/s"),
        ("dense GEMM at the tail's shapes over the token cells (1 thread)", f"{rate / 1e9:.1f} GFLOP/s"),
        ("fit / floor", f"{step_s / (per_step / rate):.1f}×"),
        ("cells holding a wound token", f"{token_share:.1%}"),
        ("cells the depthwise convolution reads", f"{read:.1%}"),
        ("forward FLOPs per photo on those cells only", f"{sparse / 1e6:.0f} M ({forward / sparse:.1f}× fewer)"),
        (f"cache build, {args.views} views + inference view per photo, CPU s (1 thread)", f"{cache_s:.1f}"),
    ]
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
