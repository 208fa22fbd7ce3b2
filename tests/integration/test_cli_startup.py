"""``--help`` of every job answers without importing torch, scikit-learn, the model libraries, pandas or
sqlite-utils (the timings are in ``python -m benchmarks.cli_startup``, not here)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import triderm

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchvision", "timm", "open_clip", "transformers", "sentence_transformers", "sklearn", "umap",
         "pandas", "sqlite_utils", "argon2")  # the last three: about 1 s more on 2 cores
#: runs every job's --help in one interpreter, then prints the heavy modules that were imported
SCRIPT = f"""
import contextlib, io, runpy, sys
for job in {triderm.JOBS!r}:
    sys.argv = ["python -m core." + job, "--help"]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            runpy.run_module("core." + job, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            assert stop.code in (0, None), (job, stop.code)
    assert "usage:" in out.getvalue(), job
print(sorted(m for m in {HEAVY!r} if m in sys.modules))
"""


def test_every_job_answers_help_without_the_model_libraries():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def test_the_losses_the_help_offers_are_the_ones_training_knows():
    """``--loss`` offers the torch-free module's names; training maps exactly those to losses."""
    from core.vision import recipe
    from core.vision.triderm import LOSSES

    assert sorted(LOSSES) == sorted(recipe.LOSS_NAMES)
