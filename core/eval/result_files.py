"""Machine-readable result files: ``<folder>/<section>.json``, one per benchmark section (the benchmarks
write them to the checkout's ``results/``, :data:`benchmarks.results.RESULTS_DIR`).

A result file holds: section, title, command (the shell command that regenerates it from
scratch), seeds, machine, commit, date, seconds, synthetic, tables (caption, columns, rows;
a mean ± sd cell is ``{"mean", "sd", "ci": [lo, hi]}``; an optional legend says what a cell
reads, else "mean ± sd [95 % CI] over seeds"), claims (claim, test, p, holds) and
notes (free text whose figures are formatted from the measured data by the writer).
:mod:`benchmarks.results` renders docs/RESULTS.md from these files alone and reruns their commands.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from annotations.infra.fileio import write_json

REPO = Path(__file__).resolve().parents[2]
COMMAND_ENV = "TRIDERM_RESULT_COMMAND"  # set by --run: the registry command a writer records
STARTED_ENV = "TRIDERM_RESULT_STARTED"  # set by --run: epoch seconds when the section's command started


def command_line(prog: str, argv: Sequence[str] | None) -> str:
    """The shell command of a run: the registry command under ``--run``, else ``python -m prog argv``."""
    if os.environ.get(COMMAND_ENV):
        return os.environ[COMMAND_ENV]
    return shlex.join(["python", "-m", prog, *(sys.argv[1:] if argv is None else argv)])


#: Distributions whose version a result file records beside Python and torch (None where one is absent).
LIBRARIES = ("numpy", "scipy", "scikit-learn", "timm", "open_clip_torch", "umap-learn")


def _cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`); None if unknown."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip() or None
    return platform.processor() or None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """CPU count and model, platform, the versions of Python, torch and :data:`LIBRARIES`, and the CUDA
    device (None without one)."""
    import torch

    return {"cpus": os.cpu_count(), "cpu": _cpu_model(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "libraries": {name: _version(name) for name in LIBRARIES},
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def git_commit() -> str:
    """HEAD's sha, suffixed ``-dirty`` when tracked code (outside tests/, docs/ and results/) differs from it;
    ``TRIDERM_RESULT_COMMIT`` names it for a copy whose .git is not its own (a lent GPU machine's)."""
    if os.environ.get("TRIDERM_RESULT_COMMIT"):
        return os.environ["TRIDERM_RESULT_COMMIT"]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!results", ":!docs", ":!tests")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


RUN_COMMIT = git_commit()  # taken when a run starts (imports its code), not when it writes


def _clean(value: Any) -> Any:
    """JSON-ready copy: numpy scalars → Python numbers, NaN/inf → None, tuples → lists."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_result(section: str, title: str, command: str, seeds: Sequence[int], tables: Sequence[dict],
                 claims: Sequence[dict] = (), notes: Sequence[str] = (), synthetic: bool = True,
                 seconds: float = 0.0, *, results_dir: Path | str) -> Path:
    """Write ``<results_dir>/<section>.json`` atomically (temp file in the folder, fsync, replace). The caller
    names the folder (a benchmark's ``--results``): no default, since a repository's ``results/`` means nothing
    to an installed wheel.

    Under ``--run`` the recorded wall time is the whole section command's (e.g. data preparation too)."""
    for t in tables:
        if not {"caption", "columns", "rows"} <= set(t) <= {"caption", "columns", "rows", "legend"}:
            raise ValueError(f"a table needs caption, columns and rows (and may have a legend), got {sorted(t)}")
        bad = [r for r in t["rows"] if len(r) != len(t["columns"])]
        if bad:
            raise ValueError(f"table {t['caption']!r}: row {bad[0]} does not have {len(t['columns'])} cells")
    for c in claims:
        if set(c) != {"claim", "test", "p", "holds"}:
            raise ValueError(f"a claim needs exactly claim, test, p and holds, got {sorted(c)}")
    if os.environ.get(STARTED_ENV):
        seconds = time.time() - float(os.environ[STARTED_ENV])
    record = _clean({"section": section, "title": title, "command": command, "seeds": list(seeds),
                     "machine": machine(), "commit": RUN_COMMIT,
                     "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "seconds": float(seconds),
                     "synthetic": bool(synthetic), "tables": list(tables), "claims": list(claims),
                     "notes": list(notes)})
    folder = Path(results_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{section}.json"
    write_json(target, record, indent=1, ensure_ascii=False, allow_nan=False)
    return target
