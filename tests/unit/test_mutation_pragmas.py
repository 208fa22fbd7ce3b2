"""Equivalent mutants are marked in the source, not keyed by mutmut's numbered names (issue 34)."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRAGMA = "# pragma: no mutate"


def test_the_mutation_script_keys_nothing_by_numbered_mutant_names():
    script = (REPO / "scripts" / "mutation.py").read_text(encoding="utf-8")
    assert not re.search(r"__mutmut_\d+", script)
    assert "EQUIVALENT" not in script


def test_every_no_mutate_pragma_gives_its_reason():
    """The reason follows the pragma on its line, or stands in the comment line just above it."""
    marked = []
    for path in sorted((REPO / "annotations").rglob("*.py")) + sorted((REPO / "core").rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if PRAGMA not in line:
                continue
            marked.append(f"{path.name}:{n + 1}")
            reason = line.partition(PRAGMA)[2].strip(" ()")
            above = lines[n - 1].strip() if n else ""
            assert reason or above.startswith("#"), f"{path.relative_to(REPO)}:{n + 1}: no reason for the pragma"
    assert marked, "the equivalent mutants of annotations/ are marked with the pragma"
