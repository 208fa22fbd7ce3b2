"""`make lint` is configured and run by CI (issue 34): ruff's wider rules, numpydoc docstrings, a type checker."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_ruff_selects_docstrings_simplify_and_its_own_rules_in_numpy_style():
    lint = PROJECT["tool"]["ruff"]["lint"]
    assert {"D", "SIM", "RUF", "F"} <= set(lint["select"])
    assert lint["pydocstyle"]["convention"] == "numpy"
    # the public API's docstrings are checked everywhere but in tests/
    per_file = lint["per-file-ignores"]
    assert per_file["tests/**"] == ["D"]
    assert not [rule for path, rules in per_file.items() if path != "tests/**" for rule in rules if rule.startswith("D")]
    assert not {"D", "D100", "D101", "D102", "D103", "D104"} & set(lint["ignore"])


def test_mypy_checks_the_library_packages():
    mypy = PROJECT["tool"]["mypy"]
    assert set(mypy["files"]) == {"annotations", "core"}
    assert mypy["check_untyped_defs"] is True


def test_lint_tools_are_pinned_and_installed_by_make():
    pins = PROJECT["project"]["optional-dependencies"]["lint"]
    assert {re.match(r"[\w-]+", p).group(0) for p in pins} == {"ruff", "mypy", "import-linter"}
    assert all("==" in p for p in pins)
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r'pip install -e "\.\[[^\]]*\blint\b[^\]]*\]"', makefile)
    recipe = re.search(r"^lint: install\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe and "ruff check ." in recipe.group(1) and "mypy" in recipe.group(1)
    assert "lint-imports" in recipe.group(1)


def test_import_linter_contracts_cover_the_layers_and_the_forbidden_imports():
    linter = PROJECT["tool"]["importlinter"]
    assert {"core", "annotations", "pages", "app", "components"} <= set(linter["root_packages"])
    assert linter["include_external_packages"] is True  # torch and streamlit are external modules
    contracts = linter["contracts"]
    layers = [c["layers"] for c in contracts if c["type"] == "layers"]
    assert any(ls[-2:] == ["core", "annotations"] and "pages" in ls[0] for ls in layers)
    forbidden = {c["source_modules"][0]: set(c["forbidden_modules"]) for c in contracts if c["type"] == "forbidden"}
    assert {"core", "streamlit", "torch"} <= forbidden["annotations"]
    assert {"streamlit", "pages", "app"} <= forbidden["core"]
    independent = [set(c["modules"]) for c in contracts if c["type"] == "independence"]
    assert {"core.vision", "core.text"} <= set().union(*independent)


def test_ci_runs_make_lint_before_the_tests():
    commands = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert "make lint" in commands
    assert commands.index("make lint") < commands.index("make test")
