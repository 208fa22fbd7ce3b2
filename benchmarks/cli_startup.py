"""Benchmark: how long ``--help`` takes for ``triderm``, ``python -m annotations`` and every job
``python -m core.<job>``, and which heavy modules it imports. Target (issue 33): ≤ 2 s each on 2 cores.

Each command runs ``--runs`` times in a fresh interpreter; the table gives the median wall time, its
ratio to the named baseline ``python -c "import torch"`` (the floor of any command that imports torch),
and, with ``--ref REV`` (e.g. ``f8885f6``, the commit before the lazy imports), the same command's
median in that revision's tree (``git archive``) and the speed-up. The machine's load average is
printed with the table: on a busy machine every number grows.

    python -m benchmarks.cli_startup [--runs 3] [--ref f8885f6] [--only embed segment]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "timm", "open_clip", "transformers", "sentence_transformers", "sklearn", "umap",
         "pandas", "sqlite_utils", "scipy")
#: prints the modules of HEAVY that running ``sys.argv[1] --help`` as ``__main__`` imported
PROBE = ("import runpy, sys\nmodule = sys.argv[1]\nsys.argv = [module, '--help']\nimport contextlib, io\n"
         "with contextlib.redirect_stdout(io.StringIO()):\n    try:\n"
         "        runpy.run_module(module, run_name='__main__', alter_sys=True)\n    except SystemExit:\n        pass\n"
         f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")


def jobs(root: Path) -> list[str]:
    """The jobs of the tree at ``root``: ``core/<job>.py`` files that run as ``__main__``."""
    return sorted(p.stem for p in (root / "core").glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def median_seconds(command: list[str], cwd: Path, runs: int) -> float | None:
    """Median wall time of ``command`` in ``cwd`` (None when it fails)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(command, cwd=cwd, capture_output=True, env={**os.environ, "PYTHONPATH": str(cwd)})
        if done.returncode != 0:
            return None
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def heavy_imports(module: str, cwd: Path) -> str:
    """The heavy modules (torch, scikit-learn, model libraries) that ``module --help`` imports, space-separated."""
    out = subprocess.run([sys.executable, "-c", PROBE, module], cwd=cwd, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(cwd)})
    return out.stdout.strip() if out.returncode == 0 else "(failed)"


def export_tree(ref: str, into: Path) -> Path:
    """The tree of revision ``ref`` under ``into`` (``git archive``)."""
    archive = into / "tree.tar"
    with open(archive, "wb") as fh:
        subprocess.run(["git", "archive", ref], cwd=REPO, stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.cli_startup`` benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cli_startup", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per command (median)")
    parser.add_argument("--ref", default=None, help="also time the commands of this git revision (e.g. f8885f6)")
    parser.add_argument("--only", nargs="*", default=None, help="only these jobs (default: all)")
    args = parser.parse_args(argv)
    modules = ["triderm", "annotations", *(f"core.{j}" for j in jobs(REPO) if args.only is None or j in args.only)]
    baseline = median_seconds([sys.executable, "-c", "import torch"], REPO, args.runs)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {args.runs} runs each; "
          f'baseline python -c "import torch": {baseline:.2f} s')
    with tempfile.TemporaryDirectory() as tmp:
        old_root = export_tree(args.ref, Path(tmp)) if args.ref else None
        head = f"{'command':<44} {'s':>6} {'÷torch':>7}"
        print(head + (f" {args.ref + ' s':>12} {'speed-up':>9}" if old_root else "") + "  heavy modules imported")
        for module in modules:
            command = [sys.executable, "-m", module, "--help"]
            now = median_seconds(command, REPO, args.runs)
            line = f"{'python -m ' + module + ' --help':<44} " + (
                f"{now:>6.2f} {now / baseline:>7.2f}" if now is not None else f"{'failed':>14}")
            if old_root is not None:
                exists = (old_root / Path(*module.split("."))).with_suffix(".py").exists() or \
                    (old_root / Path(*module.split("."))).is_dir()
                old = median_seconds(command, old_root, args.runs) if exists else None
                line += (f" {old:>12.2f} {old / now:>8.1f}×" if old is not None and now else f" {'—':>12} {'—':>9}")
            print(line + "  " + (heavy_imports(module, REPO) or "none"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
