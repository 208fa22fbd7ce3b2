"""Benchmark: FLIP patch dropout — training-step time of a ViT image tower vs no dropout.

FLIP (Li et al., 2023) drops 50–75% of the image patches during contrastive training; the
contrastive benchmark paper (papers/contrastive_benchmark_*.txt §3) quotes a 2–4× lower
compute cost. This times one CLIP training step of the image tower (forward, backward,
AdamW) of the DermLIP architecture (open_clip ViT-B-16, 224 px, 196 patches) with
**randomly initialised weights** — the step cost does not depend on the weights, and the
DermLIP weights need the hub — for each patch-dropout rate, against the no-dropout baseline.

    python -m benchmarks.flip [--batch-size 16] [--steps 3] [--rates 0 0.5 0.75] [--seed 0] [--quick]

Inputs are random tensors (``synthetic``); writes ``results/flip.json`` (:mod:`benchmarks.results`).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from benchmarks.results import RESULTS_DIR, command_line, render_tables, write_result
from core import cli
from core.concepts.dual_encoder import DualEncoder, ImageTower, MiniLMTower
from core.losses.make import CLIPLoss
from core.runtime import pick_device
from core.vision.backbones import load_backbone

# The paper's figures (contrastive benchmark §3, quoting FLIP), shown beside the measurement.
PAPER_MASKING = (0.5, 0.75)
PAPER_SPEEDUP = (2, 4)


def step_seconds(model: DualEncoder, rate: float, batch: int, steps: int, seed: int = 0) -> tuple[float, float]:
    """Median (wall, CPU) seconds of one image-tower CLIP step with patch dropout ``rate`` (one warm-up step).

    CPU time sums this process's threads: on a shared machine it tracks the compute a step needs
    more closely than wall time, which grows with other jobs' load."""
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
    times, cpu = [], []
    for _ in range(steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        img, _, _ = model.encode_image_from(x, 0)
        loss = loss_fn(img, text, model.logit_scale.exp())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    model.eval()
    return float(torch.tensor(times[1:]).median()), float(torch.tensor(cpu[1:]).median())


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.flip`` benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flip", description=__doc__.splitlines()[0])
    cli.add_device(parser)
    cli.deprecated(parser, "--batch", cli.add_batch_size(parser, 16))
    parser.add_argument("--steps", type=int, default=3, help="timed steps per rate (after one warm-up)")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.5, 0.75],
                        help="patch-dropout rates; 0 (the baseline) is always measured first")
    cli.add_seed(parser, help="seed of the random weights and inputs")
    parser.add_argument("--quick", action="store_true", help="smoke setting: batch 2, 1 step, rates 0 and 0.5")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of the result file flip.json")
    args = cli.parse_args(parser, argv)
    batch, steps, rates = (2, 1, [0.0, 0.5]) if args.quick else (args.batch_size, args.steps, args.rates)
    if any(not 0 <= r < 1 for r in rates):
        parser.error("--rates must lie in [0, 1)")
    if batch < 2 or steps < 1:
        parser.error("--batch-size must be ≥ 2 and --steps ≥ 1")
    t0 = time.perf_counter()
    device = pick_device()
    torch.manual_seed(args.seed)
    backbone = load_backbone("dermlip", device=device, pretrained=False)
    model = DualEncoder(ImageTower(backbone), MiniLMTower()).to(device)
    rates = [0.0, *sorted({r for r in rates if r != 0.0})]
    gh, gw = backbone.grid()
    rows: list[list[float]] = []
    for rate in rates:
        load = os.getloadavg()[0]
        wall, cpu = step_seconds(model, rate, batch, steps, seed=args.seed)
        base = rows[0] if rows else [None, None, wall, None, cpu]
        rows.append([rate, max(1, int(gh * gw * (1 - rate))), wall, base[2] / wall, cpu, base[4] / cpu, load])
        print(f"  patch dropout {rate:.2f}: {wall:.2f} s/step wall, {cpu:.2f} s CPU", flush=True)
    tables = [{"caption": f"One CLIP training step of the image tower: {backbone.name} (ViT-B-16, random weights), "
                          f"{backbone.input_size} px, batch {batch}, {device}, {torch.get_num_threads()} threads, "
                          f"median of {steps} step(s)",
               "columns": ["patch dropout", "patches kept", "wall s/step", "wall speed-up", "CPU s/step", "CPU speed-up",
                           "load avg before"],
               "rows": rows}]
    lo, hi = PAPER_SPEEDUP
    notes = [f"Paper (contrastive benchmark §3, after FLIP): masking {PAPER_MASKING[0]:.0%}–{PAPER_MASKING[1]:.0%} of "
             f"patches cuts compute {lo:g}–{hi:g}×; measured here: "
             + ", ".join(f"{r[5]:.2f}× CPU time ({r[3]:.2f}× wall) at {r[0]:.0%}" for r in rows[1:])
             + ". The machine is shared: wall time grows with the load average (in the table), CPU time less so."]
    print(render_tables(tables))
    print(notes[0])
    title = "FLIP patch dropout: image-tower step time" + (" [quick]" if args.quick else "")
    path = write_result("flip", title, command_line("benchmarks.flip", argv), [args.seed], tables, notes=notes,
                        synthetic=True, seconds=time.perf_counter() - t0, results_dir=args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
