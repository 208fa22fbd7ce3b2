"""Print pip constraints pinning every dependency of pyproject.toml to its declared floor (Python ≥ 3.11).

``make test-min`` installs the project with it (``pip install -c``), so the fast tests run
against the oldest versions the project claims to support. Each ``name>=X`` (main dependencies
and the ``test`` extra) becomes ``name==X``; torch and torchvision are exempt (one build of each
installs here), and a dependency without a floor is left free.

    python scripts/min_constraints.py [pyproject.toml] > constraints.txt
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

EXEMPT = {"torch", "torchvision"}
FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")


def floors(pyproject: Path) -> list[str]:
    """``name==floor`` for every dependency (and the test extra) declared with ``>=floor``."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    out = []
    for spec in [*project["dependencies"], *project.get("optional-dependencies", {}).get("test", [])]:
        match = FLOOR.match(spec)
        if match is None:
            raise ValueError(f"{pyproject}: cannot read the requirement {spec!r}")
        name, rest = match.groups()
        lower = re.search(r">=\s*([^,;\s]+)", rest)
        if name.lower() not in EXEMPT and lower:
            out.append(f"{name}=={lower.group(1)}")
    return out


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "pyproject.toml"
    print("\n".join(floors(path)))
