"""Benchmark: FLIP patch dropout — training-step time of a ViT image tower vs no dropout.

FLIP (Li et al., 2023) drops 50–75% of the image patches during contrastive training; the
contrastive benchmark paper (papers/contrastive_benchmark_*.txt §3) quotes a 2–4× lower
compute cost. This times one CLIP training step of the image tower (forward, backward,
AdamW) of the DermLIP architecture (open_clip ViT-B-16, 224 px, 196 patches) with
**randomly initialised weights** — the step cost does not depend on the weights, and the
DermLIP weights need the hub — for each patch-dropout rate, against the no-dropout baseline.

    python -m benchmarks.flip [--batch 16] [--steps 3] [--rates 0 0.5 0.75]
"""
from __future__ import annotations

import argparse
import time

import torch

from core.concepts.dual_encoder import DualEncoder, ImageTower, MiniLMTower
from core.losses.make import CLIPLoss
from core.runtime import pick_device
from core.vision.backbones import load_backbone


def step_seconds(model: DualEncoder, rate: float, batch: int, steps: int, seed: int = 0) -> float:
    """Median wall time of one image-tower CLIP step with patch dropout ``rate`` (one warm-up step)."""
    tower = model.image
    model.set_trainable(-1, 0)
    tower.set_patch_dropout(rate)
    opt = torch.optim.AdamW([*tower.parameters(), *model.image_head.parameters()], lr=1e-5)
    loss_fn = CLIPLoss()
    gen = torch.Generator().manual_seed(seed)
    size = tower.input_size
    x = torch.randn(batch, 3, size, size, generator=gen).to(model.device)
    text = torch.nn.functional.normalize(torch.randn(batch, model.dim, generator=gen), dim=-1).to(model.device)
    model.train()
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        img, _, _ = model.encode_image_from(x, 0)
        loss = loss_fn(img, text, model.logit_scale.exp())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    model.eval()
    return float(torch.tensor(times[1:]).median())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flip", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per rate (after one warm-up)")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.5, 0.75])
    args = parser.parse_args(argv)
    if any(not 0 <= r < 1 for r in args.rates):
        parser.error("--rates must lie in [0, 1)")
    if args.batch < 2 or args.steps < 1:
        parser.error("--batch must be ≥ 2 and --steps ≥ 1")
    device = pick_device()
    torch.manual_seed(0)
    backbone = load_backbone("dermlip", device=device, pretrained=False)
    model = DualEncoder(ImageTower(backbone), MiniLMTower()).to(device)
    rates = [0.0, *[r for r in args.rates if r != 0.0]]
    gh, gw = backbone.grid()
    print(f"FLIP step time: {backbone.name} (ViT-B-16, random weights), {backbone.input_size} px, "
          f"batch {args.batch}, {device}, {torch.get_num_threads()} threads, median of {args.steps} steps")
    print(f"{'patch dropout':>13} {'patches kept':>12} {'s/step':>8} {'speed-up vs 0':>14}")
    base = None
    for rate in rates:
        s = step_seconds(model, rate, args.batch, args.steps)
        base = base or s
        kept = max(1, int(gh * gw * (1 - rate)))
        print(f"{rate:>13.2f} {kept:>12d} {s:>8.2f} {base / s:>13.2f}×")
    print("paper (contrastive benchmark §3, after FLIP): masking 50–75% of patches cuts compute 2–4×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
