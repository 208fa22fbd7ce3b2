"""The GPU rows: each CUDA workload beside the same workload on the same machine's CPU, in one run.

    python -m benchmarks.gpu [--medetec DIR] [--views 16] [--epochs 3] [--devices cuda,cpu] [--quick]

Rows (SYNTHETIC phantom demo workspace unless a row names real photos):
- TriDerm-V views/s: augmented views through the frozen backbone (the feature cache TriDerm-V
  trains on), CUDA bf16 (the default) and fp32 (``TRIDERM_CUDA_PRECISION=fp32``), CPU fp32;
- feature extraction photos/s: ``python -m core.extract_features``, one process and under
  ``torchrun --nproc_per_node 1`` (the process group a multi-GPU run uses; its backend is in the row);
- SOE at registry scale: 10,000,000 planted triplets over 10,000 objects (benchmarks.soe --scale);
- the segmenter: one training epoch on the Medetec photos' cached features, and one 512-px photo's
  inference with 4 test-time flips;
- the concept models (``--objective clip|make|conceptclip``) and SLIMP: the median seconds of an
  E-epoch run's epochs after the first (its run record's ``epoch_seconds``).
The speed-up is against the CPU row of the same workload on the same machine (all its cores).
Without CUDA, ``--devices cpu`` runs the CPU rows alone (to check the benchmark itself).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

from annotations.infra.workspace import Workspace
from benchmarks.results import REPO, RESULTS_DIR, command_line, render_tables, repo_env, write_result
from core import cli
from core.runtime import PRECISION_ENV, ensure_images, use_device
from core.vision.backbones import OFFLINE_DEFAULT, load_backbone
from core.vision.features import FeatureCache, workspace_wounds

CONCEPT_OBJECTIVES = ("clip", "make", "conceptclip")
Row = list[Any]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of ``fn()`` with CUDA work finished on both sides."""
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def job(module: str, ws: Path, device: str, *args: str, torchrun: bool = False) -> dict[str, Any]:
    """Run ``python -m module`` on ``ws`` and return its newest run record."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m"] if torchrun
                else [sys.executable, "-m"])
    proc = subprocess.run([*launcher, module, "--workspace", str(ws), "--device", device, *args], cwd=REPO,
                          capture_output=True, text=True, env=repo_env())
    if proc.returncode:
        raise RuntimeError(f"{module} {' '.join(args)} on {device} failed: {proc.stderr.strip()[-1500:]}")
    return Workspace(ws).store.runs()[0]


def triderm_views(ws: Workspace, device: str, precision: str, views: int) -> float:
    """Views/s of the TriDerm-V feature cache build (augment + frozen backbone) on ``device``."""
    with mock.patch.dict(os.environ, {PRECISION_ENV: precision}):  # the caller's setting comes back after
        backbone = load_backbone(OFFLINE_DEFAULT, device=device)
        image_ids, _ = workspace_wounds(ws)
        cache = FeatureCache(ws, backbone)
        cache.build(image_ids[:2], 1, progress=False)  # warm-up (kernels, cudnn autotune)
        shutil.rmtree(cache.root, ignore_errors=True)
        seconds = timed(lambda: cache.build(image_ids, views, progress=False))
        shutil.rmtree(cache.root, ignore_errors=True)
        return (views + 1) * len(image_ids) / seconds


def extraction(ws: Path, device: str, views: int, torchrun: bool) -> tuple[float, str | None]:
    """(photos/s, process-group backend) of ``core.extract_features`` on a cleared cache."""
    run = job("core.extract_features", ws, device, "--views", str(views), torchrun=torchrun)
    shutil.rmtree(run["config"]["cache"], ignore_errors=True)
    return run["metrics"]["computed"] / run["metrics"]["seconds"], run["config"].get("backend")


def soe_seconds(device: str, seed: int, quick: bool) -> tuple[float, float]:
    """(wall seconds, held-out %) of the registry-scale SOE fit (benchmarks.soe --scale) on ``device``."""
    from benchmarks.soe import SCALE_DIM, SCALE_EPOCHS, SCALE_HELD, SCALE_N, SCALE_TAU, SCALE_TRAIN, planted_triplets
    from core.text.soe import SOE, triplet_margins

    n, m, epochs = (1000, 100_000, 20) if quick else (SCALE_N, SCALE_TRAIN, SCALE_EPOCHS)
    _, triplets = planted_triplets(n, SCALE_DIM, m + SCALE_HELD, SCALE_TAU, seed)
    train, held = triplets[:m], triplets[m:]
    use_device(device)
    try:
        fit: list[SOE] = []
        seconds = timed(lambda: fit.append(SOE(n_components=SCALE_DIM, epochs=epochs, n_objects=n,
                                               random_state=seed).fit(train)))
    finally:
        use_device(None)
    return seconds, 100 * float((triplet_margins(fit[0].embedding_, held) > 0).mean())


def segmenter_rows(medetec: Path, device: str, epochs: int, quick: bool) -> tuple[float, float, int]:
    """(seconds per training epoch on the Medetec photos' cached features, seconds per 512-px inference, photos)."""
    from benchmarks.segmentation import inference_seconds
    from core.segmentation.model import Segmenter, encoder, load_default, new_net
    from core.segmentation.training import cache_features, fit_network, folder_samples

    samples = folder_samples(medetec)[: 6 if quick else None]
    enc = encoder(device)
    cache = cache_features(samples, enc, augmented=2, progress=False)
    start = new_net(enc)
    stamps: list[float] = []

    def on_epoch(epoch: int, losses: list[float]) -> None:
        _sync()
        stamps.append(time.perf_counter())

    t0 = time.perf_counter()
    fit_network(cache, range(len(samples)), start, epochs=epochs, device=device, progress=False, on_epoch=on_epoch)
    per_epoch = float(np.median(np.diff([t0, *stamps])[1:]))
    default = load_default(device)
    seg = Segmenter(default.net, default.encoder, default.input_size, tta=4)
    return per_epoch, inference_seconds(seg, torch.get_num_threads()), len(samples)


def epoch_seconds(ws: Path, device: str, epochs: int, module: str, *args: str) -> float:
    """Median seconds of a training CLI's epochs after the first (warm-up), from its run record."""
    return float(np.median(job(module, ws, device, *args, "--epochs", str(epochs))["metrics"]["epoch_seconds"][1:]))


ROWS = ("views", "extraction", "soe", "segmenter", "epochs")


def measure(args: argparse.Namespace, root: Path) -> Iterator[Row]:
    """Every row of ``args.rows`` as [workload, unit, device, value, higher is better], as it is measured."""
    ws_path = root / "ws"
    ws = Workspace(ws_path)
    if set(args.rows) & {"views", "extraction", "epochs"}:
        ensure_images(ws, progress=False)
    name = f"TriDerm-V views (augment + frozen {OFFLINE_DEFAULT}), {args.views} views/photo"
    for device in args.devices if "views" in args.rows else ():
        for precision in (("bf16", "fp32") if device == "cuda" else ("fp32",)):
            yield [name, "views/s", f"{device} {precision}", triderm_views(ws, device, precision, args.views), True]
    for device in args.devices if "extraction" in args.rows else ():
        for torchrun in (False, True) if device == "cuda" else (False,):
            rate, backend = extraction(ws_path, device, args.views, torchrun)
            yield [f"feature extraction (core.extract_features, {args.views} views)", "photos/s",
                   f"{device}, torchrun 1 process ({backend})" if torchrun else device, rate, True]
    soe_name = ("SOE, 100,000 planted triplets / 1,000 objects (--quick)" if args.quick
                else "SOE, 10,000,000 planted triplets / 10,000 objects, 400 epochs")
    for device in args.devices if "soe" in args.rows else ():
        seconds, held = soe_seconds(device, args.seed, args.quick)
        yield [soe_name, "s per fit", f"{device} (held-out {held:.1f} %)", seconds, False]
    if args.medetec and "segmenter" in args.rows:
        for device in args.devices:
            epoch, infer, n = segmenter_rows(Path(args.medetec), device, args.epochs, args.quick)
            yield [f"segmenter training epoch (Medetec, {n} real photos, cached features)", "s/epoch", device, epoch,
                   False]
            yield ["segmenter inference, one 512-px photo, 4 flips", "s/photo", device, infer, False]
    for device in args.epoch_devices if "epochs" in args.rows else ():
        for objective in CONCEPT_OBJECTIVES:
            yield [f"concept model epoch (core.train_concepts --objective {objective})", "s/epoch", device,
                   epoch_seconds(ws_path, device, args.epochs, "core.train_concepts", "--objective", objective), False]
        yield ["SLIMP epoch (core.train_slimp)", "s/epoch", device,
               epoch_seconds(ws_path, device, args.epochs, "core.train_slimp"), False]


def speedups(rows: list[Row]) -> list[Row]:
    """Table rows with the speed-up against the same workload's CPU row (None without one)."""
    cpu = {r[0]: r[3] for r in rows if r[2].startswith("cpu")}  # the SOE device cell also holds its accuracy
    out = []
    for workload, unit, device, value, higher in rows:
        base = cpu.get(workload)
        ratio = None if base is None or device.startswith("cpu") else (value / base if higher else base / value)
        out.append([workload, unit, device, value, ratio])
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure the chosen rows on each device, rewriting ``gpu.json`` after every row (a run cut short keeps
    what it measured), and print the table at the end."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--medetec", help="Medetec folder (images/, masks/) for the segmenter rows (left out without)")
    parser.add_argument("--views", type=int, default=16, help="augmented views per photo (default: 16)")
    cli.add_epochs(parser, 3, help="epochs of each timed training run (≥ 3: the first is not timed; default 3)")
    cli.add_seed(parser)
    parser.add_argument("--devices", default="cuda,cpu", help="comma-separated: cuda, cpu (default: cuda,cpu)")
    parser.add_argument("--epoch-devices", help="devices of the concept and SLIMP epoch rows (default: --devices)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated rows to measure: {', '.join(ROWS)} "
                        "(default: all)")
    parser.add_argument("--quick", action="store_true", help="smoke sizes (SOE 10⁵ triplets, 6 segmenter photos)")
    parser.add_argument("--results", default=str(RESULTS_DIR), help="folder of the result file gpu.json")
    args = cli.parse_args(parser, argv)
    args.devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    args.epoch_devices = ([d.strip() for d in args.epoch_devices.split(",") if d.strip()] if args.epoch_devices
                          else args.devices)
    if not args.devices or not set(args.devices + args.epoch_devices) <= {"cuda", "cpu"} or args.epochs < 3:
        parser.error(f"--devices and --epoch-devices take cuda and/or cpu, --epochs must be ≥ 3; got "
                     f"{args.devices}, {args.epoch_devices}, {args.epochs}")
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if not args.rows or not set(args.rows) <= set(ROWS):
        parser.error(f"--rows takes {', '.join(ROWS)}; got {args.rows}")
    if "cuda" in args.devices + args.epoch_devices and not torch.cuda.is_available():
        parser.error("no CUDA device on this machine: the GPU rows need one (--devices cpu checks the CPU rows)")
    t_start = time.perf_counter()
    card = torch.cuda.get_device_name(0) if "cuda" in args.devices + args.epoch_devices else None
    measured: list[Row] = []

    def write(done: bool) -> Path:
        table = {"caption": f"GPU rows on {card or 'no GPU'} beside the same machine's CPU ({os.cpu_count()} cores, "
                            f"{torch.get_num_threads()} torch threads)" + (" [--quick sizes]" if args.quick else ""),
                 "columns": ["workload", "unit", "device", "value", "speed-up vs CPU"], "rows": speedups(measured),
                 "legend": "one measurement per row; speed-up = CUDA rate ÷ CPU rate (or CPU s ÷ CUDA s), same "
                           "machine, same run"}
        notes = [f"Card: {card}; CUDA runs bf16 autocast unless the row says fp32." if card else
                 "CPU rows only (--devices cpu): no GPU figure.",
                 "SYNTHETIC phantom demo workspace, except the segmenter rows (real Medetec photos).",
                 f"Epoch times are the median of epochs 2…{args.epochs} of one run (the first warms up); a row "
                 "without a speed-up had no CPU run (--epoch-devices)."]
        if not done:
            notes.append(f"PARTIAL: the run stopped after {len(measured)} rows; the rows after them are missing.")
        if done:
            print(render_tables([table]), flush=True)
        return write_result("gpu", "GPU rows (CUDA beside the same machine's CPU)" + (" [quick]" if args.quick else ""),
                            command_line("benchmarks.gpu", argv), [args.seed], [table], notes=notes, synthetic=True,
                            seconds=time.perf_counter() - t_start, results_dir=args.results)

    with tempfile.TemporaryDirectory(prefix="triderm-gpu-") as tmp:
        for row in measure(args, Path(tmp)):
            measured.append(row)
            print(row, flush=True)
            write(done=False)  # a run cut short still leaves every row it measured
    path = write(done=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
