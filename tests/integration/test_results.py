"""Result files and docs/RESULTS.md: every figure in RESULTS.md is rendered from results/*.json."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest

from benchmarks import results
from benchmarks.results import REQUIRED, RESULTS_DIR, RESULTS_MD, SECTIONS, paired_claim, render, write_result

KNOWN = {
    "section": "toy", "title": "Toy benchmark", "command": "python -m benchmarks.toy --quick", "seeds": [0, 1],
    "machine": {"cpus": 2, "platform": "Linux-x", "python": "3.11.2", "torch": "2.5.1", "cuda": None},
    "commit": "0123456789abcdef0123", "date": "2026-11-23T13:00:00+00:00", "seconds": 150.0, "synthetic": True,
    "tables": [{"caption": "Scores", "columns": ["method", "n", "score %", "time s"],
                "rows": [["a|b", 3, {"mean": 61.234, "sd": 1.27, "ci": [58.1, 64.4]}, 0.123456],
                         ["c", None, {"mean": 70.0, "sd": None, "ci": None}, 1234.5]]}],
    "claims": [{"claim": "a beats c", "test": "one-sided paired t-test, n = 2", "p": 0.0123, "holds": True},
               {"claim": "c beats a", "test": "one-sided paired t-test, n = 2", "p": 0.9, "holds": False}],
    "notes": ["a note"],
}
EXPECTED_SECTION = """## Toy benchmark

- data: **SYNTHETIC phantom data**
- command: `python -m benchmarks.toy --quick`
- seeds: 0, 1
- machine: 2 CPUs, Linux-x, torch 2.5.1, no CUDA
- commit 0123456789ab, 2026-11-23T13:00:00+00:00, took 2.5 min

**Scores**

| method | n | score % | time s |
|---|---|---|---|
| a\\|b | 3 | 61.2 ± 1.3 [58.1, 64.4] | 0.1235 |
| c | – | 70.0 | 1234 |

Cells read mean ± sd [95 % CI] over seeds.

Claims (a claim holds only when its paired test says so, p < 0.05; q: the p-value adjusted for the 2 tests of this section by Benjamini–Hochberg, 1 with q < 0.05):
- a beats c: **holds** (one-sided paired t-test, n = 2, p = 0.012, q = 0.025)
- c beats a: **does not hold** (one-sided paired t-test, n = 2, p = 0.9, q = 0.9)

- a note
"""


def _write(folder: Path, record: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{record['section']}.json").write_text(json.dumps(record), encoding="utf-8")


def test_committed_results_md_is_rendered_from_the_result_files():
    """Byte for byte, so every figure in RESULTS.md comes from a result file (none typed by hand)."""
    assert RESULTS_MD.read_text(encoding="utf-8") == render(RESULTS_DIR), \
        "docs/RESULTS.md differs from the rendering of results/*.json: run `python -m benchmarks.results`"


@pytest.mark.parametrize("path", sorted(RESULTS_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_every_result_file_has_the_required_keys(path):
    record = json.loads(path.read_text(encoding="utf-8"))
    assert set(REQUIRED) <= set(record) and record["section"] == path.stem
    assert isinstance(record["command"], str) and record["command"].strip()
    assert all(isinstance(s, int) for s in record["seeds"]) and isinstance(record["synthetic"], bool)
    assert {"cpus", "platform", "torch", "cuda"} <= set(record["machine"])
    assert isinstance(record["seconds"], (int, float)) and record["seconds"] >= 0 and record["commit"]
    for table in record["tables"]:
        assert {"caption", "columns", "rows"} <= set(table) <= {"caption", "columns", "rows", "legend"}
        assert all(len(row) == len(table["columns"]) for row in table["rows"])
    for claim in record["claims"]:
        assert set(claim) == {"claim", "test", "p", "holds"} and isinstance(claim["holds"], bool)
        assert claim["holds"] is False or (claim["p"] is not None and claim["p"] < 0.05)
    assert all(isinstance(n, str) for n in record["notes"])


#: Options a stored command may add to its registry entry: where this machine keeps data or an interpreter.
MACHINE_LOCAL = {"--fuseg", "--medetec", "--data", "--cblearn-python", "--device", "--work"}
QUIET = {"--quiet"}  # hides progress bars, changes no figure


@pytest.mark.parametrize("path", sorted(RESULTS_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_the_registry_command_regenerates_the_stored_file(path):
    """``make results SECTION=s`` runs what made the file: the stored command is the registry's, or the registry's
    with machine-local arguments after it (a data path, the cblearn interpreter). The GPU section's file came
    from the device, whose paths and older epoch count it records (its erratum says so)."""
    record = json.loads(path.read_text(encoding="utf-8"))
    if record["section"] in results.NEEDS_CUDA:
        pytest.skip("written on the GPU machine")
    registry, stored = SECTIONS[record["section"]], record["command"]
    assert stored == registry or stored.startswith(registry + " "), (stored, registry)
    extra = [a for a in shlex.split(stored[len(registry):]) if a not in QUIET]
    assert [o for o in extra[::2] if o not in MACHINE_LOCAL] == [] and len(extra) % 2 == 0, extra


def test_renderer_formats_a_known_result_as_expected(tmp_path):
    _write(tmp_path, KNOWN)
    _write(tmp_path, {**KNOWN, "section": "zeta", "title": "Zeta", "synthetic": False, "tables": [], "claims": [],
                      "notes": [], "seeds": [], "seconds": 4.25, "machine": {**KNOWN["machine"], "cuda": "H100"}})
    _write(tmp_path, {**KNOWN, "section": "soe", "title": "First by the registry"})
    _write(tmp_path, {**KNOWN, "section": "zz_versions", "title": "Versions", "machine": {
        **KNOWN["machine"], "cpu": "AMD EPYC", "libraries": {"numpy": "2.4.6", "timm": None}}})
    text = render(tmp_path)
    assert text.startswith(results.HEADER + "\n## First by the registry\n")
    assert "\n" + EXPECTED_SECTION + "\n## Zeta\n" in text  # unknown sections follow, alphabetically
    assert ("- data: **real data**\n- command: `python -m benchmarks.toy --quick`\n- seeds: none (deterministic)\n"
            "- machine: 2 CPUs, Linux-x, torch 2.5.1, CUDA H100\n"
            "- commit 0123456789ab, 2026-11-23T13:00:00+00:00, took 4.2 s\n") in text
    assert "- machine: 2 CPUs (AMD EPYC), Linux-x, torch 2.5.1, numpy 2.4.6, no CUDA\n" in text  # absent: not named
    missing = [s for s in SECTIONS if s != "soe"]
    assert text.endswith("## Not yet regenerated\n\nNo result file yet, so no figures here; rerun with "
                         "`make results SECTION=name`:\n\n" + "\n".join(f"- `{s}`: `{SECTIONS[s]}`" for s in missing)
                         + "\n")


@pytest.mark.parametrize("holds", [False, None, "true", 1])
def test_a_claim_that_is_not_true_is_never_printed_as_holding(tmp_path, holds):
    claim = {"claim": "attention beats mean", "test": "paired t-test", "p": 0.001, "holds": holds}
    _write(tmp_path, {**KNOWN, "claims": [claim]})
    text = render(tmp_path)
    assert "attention beats mean: **does not hold** (paired t-test, p = 0.001, q = 0.001)" in text
    assert "**holds**" not in text


def test_claims_are_adjusted_for_the_sections_tests_and_an_undefined_test_is_not_counted(tmp_path):
    claims = [{"claim": f"x{i}", "test": "t", "p": p, "holds": p is not None and p < 0.05}
              for i, p in enumerate([None, 0.01, 0.04, 0.03])]
    _write(tmp_path, {**KNOWN, "claims": claims})
    text = render(tmp_path)
    assert "adjusted for the 3 tests of this section by Benjamini–Hochberg, 3 with q < 0.05):" in text
    assert "- x0: **does not hold** (t, p = n/a, q = n/a)" in text
    assert "- x1: **holds** (t, p = 0.01, q = 0.03)" in text and "- x2: **holds** (t, p = 0.04, q = 0.04)" in text


def test_paired_claim_holds_only_when_the_paired_test_says_so():
    assert paired_claim("a > b", [61.0, 62.0, 63.5, 64.0], [60.0, 60.5, 61.0, 62.5])["holds"] is True
    noisy = paired_claim("a > b", [61.0, 59.0, 63.0], [60.0, 60.5, 61.0])
    assert noisy["holds"] is False and noisy["p"] > 0.05
    assert paired_claim("b > a", [60.0, 60.5, 61.0], [61.0, 62.0, 63.5])["holds"] is False
    constant = paired_claim("a > b", [61.0, 62.0], [60.0, 61.0])
    assert constant["holds"] is False and constant["p"] is None and "undefined" in constant["test"]
    with pytest.raises(ValueError, match="paired"):
        paired_claim("a > b", [1.0], [0.0])


def test_write_result_is_atomic_fills_the_run_facts_and_rejects_bad_tables(tmp_path):
    table = {"caption": "t", "columns": ["x", "y"], "rows": [["a", float("nan")]]}
    path = write_result("toy", "Toy", "python -m toy", [0], [table], notes=["n"], synthetic=False, seconds=1.5,
                        results_dir=tmp_path)
    record = json.loads(path.read_text(encoding="utf-8"))
    assert [p.name for p in tmp_path.iterdir()] == ["toy.json"]  # no temp file left behind
    assert record["tables"][0]["rows"] == [["a", None]] and record["synthetic"] is False
    assert record["commit"] and record["date"].endswith("+00:00") and record["machine"]["cpus"] >= 1
    assert record["machine"]["libraries"]["numpy"] == np.__version__
    assert set(record["machine"]["libraries"]) == {"numpy", "scipy", "scikit-learn", "timm", "open_clip_torch",
                                                   "umap-learn"} and "cpu" in record["machine"]
    with pytest.raises(ValueError, match="2 cells"):
        write_result("toy", "Toy", "c", [0], [{**table, "rows": [["a"]]}], results_dir=tmp_path)
    with pytest.raises(ValueError, match="holds"):
        write_result("toy", "Toy", "c", [0], [table], claims=[{"claim": "x", "p": 0.1}], results_dir=tmp_path)


def test_write_result_takes_its_folder_explicitly(tmp_path, monkeypatch):
    """No default folder: the repository's results/ means nothing to an installed wheel."""
    monkeypatch.chdir(tmp_path)
    table = {"caption": "t", "columns": ["x"], "rows": [[1]]}
    with pytest.raises(TypeError, match="results_dir"):
        write_result("toy", "Toy", "c", [0], [table])
    assert list(tmp_path.iterdir()) == [] and not (RESULTS_DIR / "toy.json").exists()


def test_render_rejects_a_result_file_without_a_required_key(tmp_path):
    _write(tmp_path, {k: v for k, v in KNOWN.items() if k != "seeds"})
    with pytest.raises(ValueError, match="seeds"):
        render(tmp_path)


def test_cli_unknown_section_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        results.main(["--run", "no_such_section"])
    assert exc.value.code == 2 and "unknown section" in capsys.readouterr().err


def test_a_zero_width_interval_is_not_shown_and_a_legend_replaces_the_seed_footer():
    from benchmarks.results import fmt_cell, render_tables

    assert fmt_cell({"mean": 64.2, "sd": 0.0, "ci": [64.2, 64.2]}) == "64.2 ± 0.0"  # one seed: no fake CI
    assert fmt_cell({"mean": 66.2, "sd": None, "ci": [63.0, 69.1]}) == "66.2 [63.0, 69.1]"
    table = {"caption": "strict", "columns": ["row", "strict %"], "rows": [["frozen", {"mean": 66.2, "sd": None,
                                                                                      "ci": [63.0, 69.1]}]],
             "legend": "Cells read balanced % [95 % CI, resampling patients]."}
    text = render_tables([table])
    assert "resampling patients" in text and "over seeds" not in text


def test_an_erratum_is_rendered_under_its_section_and_may_hold_no_figure(tmp_path) -> None:
    from benchmarks.results import render, write_result

    write_result("soe", "SOE", "python -m benchmarks.soe", [0], [{"caption": "c", "columns": ["a"], "rows": [[1.5]]}],
                 results_dir=tmp_path)
    (tmp_path / "soe.erratum.md").write_text("The rows of this run\nare wrong.\n", encoding="utf-8")
    assert "**Erratum** (written after the run): The rows of this run are wrong." in render(tmp_path)
    (tmp_path / "soe.erratum.md").write_text("The rows are off by 2.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"soe.erratum.md: an erratum may not contain digits"):
        render(tmp_path)
    (tmp_path / "soe.erratum.md").unlink()
    (tmp_path / "flip.erratum.md").write_text("Wrong.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"no result file flip.json to correct"):
        render(tmp_path)
