"""`make gpu-check`: every CLI once on a fresh SYNTHETIC demo workspace, on CUDA, 1–2 epochs.

Prints one PASS/FAIL line per command (exit status, seconds, peak CUDA memory the command
allocated — a command that ran on the CPU by mistake shows 0 and fails) and exits 1 if any
failed. Without CUDA it says so and exits 0. Every job that runs torch gets ``--device cuda``
(``--device cpu`` with ``--cpu``), so a job that cannot use CUDA fails instead of falling back.

    python scripts/gpu_check.py [--keep] [--timeout SECONDS] [--cpu]

``--cpu`` runs the same commands on the CPU (no CUDA-memory check): it validates the commands
themselves on a machine without a GPU (slow: every CLI end to end).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script (python scripts/gpu_check.py): the repository's packages

from benchmarks.results import repo_env  # noqa: E402 (after the path above)

# Runs a job module as __main__ and reports the peak CUDA memory it allocated (stderr marker).
_LAUNCHER = """
import runpy, sys, torch
module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
code = 0
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
print(f"GPU_CHECK_CUDA_BYTES={torch.cuda.max_memory_allocated()}", file=sys.stderr)
sys.exit(code)
"""
MARKER = "GPU_CHECK_CUDA_BYTES="
NUMPY_ONLY = ("evaluate",)  # steps that use no torch device: they pass without CUDA memory


def steps(ws: str, device: str = "cuda") -> list[tuple[str, list[str]]]:
    """(label, argv) of every command, in dependency order, on workspace ``ws`` and ``device``
    (``core.evaluate`` is numpy only and takes no ``--device``)."""
    py = [sys.executable, "-c", _LAUNCHER]
    w = ["--workspace", ws, "--device", device]
    return [
        ("train_triderm", [*py, "core.train_triderm", *w, "--mode", "self-supervised", "--epochs", "2"]),  # the demo first
        ("extract_features", [*py, "core.extract_features", *w, "--views", "2"]),
        ("embed", [*py, "core.embed", *w]),
        ("text_embed", [*py, "core.text_embed", *w]),
        ("llm_triplets (local oracle, for fit_soe)", [*py, "core.llm_triplets", *w, "--oracle", "local", "--budget", "40"]),
        ("fit_soe", [*py, "core.fit_soe", *w, "--epochs", "2"]),
        ("evaluate", [*py, "core.evaluate", "--workspace", ws, "--n-boot", "50"]),
        ("train_slimp", [*py, "core.train_slimp", *w, "--epochs", "2", "--target", "fitzpatrick", "--ablation"]),
        ("torchrun train_slimp (1 process)", [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
                                              "-m", "core.train_slimp", *w, "--epochs", "1"]),
        *((f"train_concepts --objective {o}", [*py, "core.train_concepts", *w, "--objective", o, "--epochs", "1"])
          for o in ("clip", "make", "conceptclip")),
        ("bench_contrastive --quick", [*py, "core.bench_contrastive", *w, "--quick", "--epochs", "1"]),
        ("train_segmenter", [*py, "core.train_segmenter", *w, "--epochs", "1"]),
        ("segment (default segmenter)", [*py, "core.segment", "--images", f"{ws}/images", "--out", f"{ws}-masks",
                                         "--device", device]),
        ("ablate --tables vision --quick", [*py, "core.ablate", *w, "--tables", "vision", "--quick", "--n-seeds", "1",
                                            "--vision-epochs", "1"]),
    ]


def run_step(argv: list[str], timeout: float, need_cuda: bool = True) -> tuple[bool, str]:
    """Run one command; (passed, detail)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=repo_env())
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    secs = time.perf_counter() - t0
    peak = [int(line[len(MARKER):]) for line in proc.stderr.splitlines() if line.startswith(MARKER)]
    tail = next((line for line in reversed((proc.stderr + proc.stdout).splitlines())
                 if line.strip() and not line.startswith(MARKER)), "")
    if proc.returncode != 0:
        return False, f"exit {proc.returncode} after {secs:.0f} s: {tail[:200]}"
    if need_cuda and peak and peak[0] == 0:
        return False, f"exit 0 after {secs:.0f} s but no CUDA memory was allocated (ran on the CPU?)"
    mem = f", peak CUDA {peak[0] / 2**20:.0f} MiB" if peak else ""
    return True, f"{secs:.0f} s{mem}"


def main(argv: list[str] | None = None) -> int:
    """Run each command of :func:`steps` on a fresh demo workspace and print PASS/FAIL per step; 1 when any
    failed (0 with nothing checked on a machine without CUDA)."""
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary workspace (its path is printed)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per command")
    parser.add_argument("--cpu", action="store_true", help="run the commands on the CPU (validates them; no GPU check)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.cpu:
        print("gpu-check: no CUDA device on this machine — nothing to check (exit 0). "
              "Run `make gpu-check` on a machine with an NVIDIA GPU.")
        return 0
    root = Path(tempfile.mkdtemp(prefix="triderm-gpu-check-"))
    ws = str(root / "workspace")
    where = "the CPU (--cpu)" if args.cpu else torch.cuda.get_device_name(0)
    print(f"gpu-check on {where}; fresh demo workspace {ws}", flush=True)
    failed = 0
    try:
        for label, cmd in steps(ws, "cpu" if args.cpu else "cuda"):
            ok, detail = run_step(cmd, args.timeout, need_cuda=not args.cpu and label not in NUMPY_ONLY)
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'}  {label:<40} {detail}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"gpu-check: {failed} failed" if failed else "gpu-check: all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
