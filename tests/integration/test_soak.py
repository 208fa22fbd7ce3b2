"""A small run of scripts/soak.py: concurrent annotators, one SIGKILLed, re-imports meanwhile —
no judgment, outline or description lost or duplicated."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_soak_small(tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, "scripts/soak.py", "--annotators", "3", "--answers", "16", "--photos", "8",
                          "--reimports", "2", "--edit-every", "4", "--json", str(out)], cwd=ROOT, check=False,
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(out.read_text())
    assert summary["judgments"] == summary["judgments_expected"] == 48
    assert summary["duplicated_judgments"] == 0 and summary["lost_total"] == 0
    assert summary["killed"].startswith("ann0 after") and summary["reimports"] == 2
    assert summary["outlines_acknowledged"] > 0 and summary["orphan_mask_labels"] == 0
