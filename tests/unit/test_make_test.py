"""``make test`` runs the suite in two phases on xdist workers (the browser and Label Studio tests apart from the
rest): together they select every test exactly once, and the test extra installs the plugins they use."""
from __future__ import annotations

import itertools
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def phases() -> list[tuple[str, str]]:
    """(pytest arguments, -m expression) of each pytest call of the Makefile's ``test`` recipe."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^test: install\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "the Makefile has no `test: install` recipe"
    calls = [line for line in recipe.group(1).splitlines() if "-m pytest" in line]
    return [(line, re.search(r'-m pytest.*?-m "([^"]+)"', line).group(1)) for line in calls]


def test_the_two_phases_select_every_test_once():
    markers = re.findall(r'"(\w+):', (REPO / "pyproject.toml").read_text(encoding="utf-8").split("markers = [")[1]
                         .split("]")[0])
    assert {"slow", "browser", "labelstudio"} <= set(markers)
    calls = phases()
    assert len(calls) == 2
    for values in itertools.product((False, True), repeat=len(markers)):
        marks = dict(zip(markers, values))
        chosen = [eval(expression, {"__builtins__": {}}, marks) for _, expression in calls]  # and/or/not of names
        assert sum(chosen) == 1, f"markers {marks}: selected by {sum(chosen)} phases"


def test_the_first_phase_leaves_out_the_browser_and_only_browser_tests_rerun():
    (first, expression), (browser, _) = phases()
    assert "-n " in first and "-n " in browser and "OMP_NUM_THREADS=1" in first
    assert not eval(expression, {"__builtins__": {}}, {"browser": True, "labelstudio": False, "slow": False})
    assert "--reruns" not in first and "--reruns 1 " in browser  # one retry, for the browser phase only
    extra = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert {"pytest-xdist", "pytest-rerunfailures"} <= {re.match(r"[\w-]+", spec).group(0) for spec in extra["test"]}
