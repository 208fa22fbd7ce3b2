"""Print pip constraints pinning every dependency of pyproject.toml to its declared floor (Python ≥ 3.11).

``make test-min`` installs the project with it (``pip install -c``), so the fast tests run
against the oldest versions the project claims to support. Each ``name>=X`` (main dependencies
and the ``app``, ``ml``, ``llm`` and ``test`` extras) becomes ``name==X``; torch and torchvision are exempt (one build of each
installs here), and a dependency without a floor is left free.

    python scripts/min_constraints.py [pyproject.toml] > constraints.txt
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

EXEMPT = {"torch", "torchvision"}
#: the extras `make test-min` installs (`.[all,test]`: all = app + ml + llm)
EXTRAS = ("app", "ml", "llm", "test")
# Caps the floors themselves need: pyarrow >= 20 refuses NumPy < 2 at import (see numpy in pyproject.toml)
EXTRA = ["pyarrow<20"]
FLOOR = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)")


def floors(pyproject: Path) -> list[str]:
    """``name==floor`` for every dependency (and the extras ``make test-min`` installs) declared with
    ``>=floor``; a name declared twice gets the higher floor."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    extras = project.get("optional-dependencies", {})
    out: dict[str, str] = {}
    for spec in [*project["dependencies"], *(s for extra in EXTRAS for s in extras.get(extra, []))]:
        match = FLOOR.fullmatch(spec)
        if match is None:
            raise ValueError(f"{pyproject}: cannot read the requirement {spec!r}")
        name, rest = match.groups()
        lower = re.search(r">=\s*([^,;\s]+)", rest)
        key = name.lower().replace("_", "-")
        if key not in EXEMPT and lower and _version(lower.group(1)) > _version(out.get(key, "0")):
            out[key] = lower.group(1)
    return [f"{name}=={version}" for name, version in out.items()] + EXTRA


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "pyproject.toml"
    print("\n".join(floors(path)))
