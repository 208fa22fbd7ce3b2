"""Mutation testing with mutmut, one module at a time against its own test files (issue 22).

Each module is mutated in a scratch copy of the working tree (``--workdir``, default
``/tmp/triderm-mutation``), so the checkout is never touched and a module's results survive
for the next run (mutmut tests new mutants; this script re-tests the survivors). Prints killed / total and the score per
module; survivors are listed with ``--survivors`` with their changed lines (or ``cd WORKDIR/<module> &&
mutmut show NAME``). Equivalent mutants are never made: their lines carry ``# pragma: no mutate`` with the
reason; those that only change the letter case of SQL are excused (:func:`sql_case_only`) and left out of the score. Not part of ``make test``: hours on 2 cores for every module.

    python scripts/mutation.py [MODULE ...] [--workdir DIR] [--jobs N] [--survivors] [--report]
"""
from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    from tomllib import loads as toml_loads
except ModuleNotFoundError:  # Python 3.10: mutmut depends on toml there
    from toml import loads as toml_loads

ROOT = Path(__file__).resolve().parents[1]

# module (or package folder) -> the test files that exercise it
MODULES: dict[str, list[str]] = {
    "core/eval/metrics.py": ["tests/unit/test_metrics.py"],
    "core/eval/fusion.py": ["tests/unit/test_fusion.py", "tests/integration/test_retrieval.py"],
    "core/vision/pooling.py": ["tests/integration/test_features.py", "tests/unit/test_gpu_paths.py"],
    "core/losses": ["tests/unit/test_losses_vision.py", "tests/unit/test_losses_concepts.py",
                    *(f"tests/integration/test_slimp.py::{t}" for t in ("test_inner_loss_zero_for_single_wound_patient",
                                                            "test_inner_loss_ignores_other_patients_wounds",
                                                            "test_outer_loss_matches_hand_computed_three_patients",
                                                            "test_temperature_is_learnable_from_clip_init"))],
    "annotations/scheduling/scheduler.py": ["tests/unit/test_scheduler_unit.py"],
    "core/text/soe.py": ["tests/unit/test_soe.py"],
    **{f"annotations/store/{m}.py": ["tests/unit/test_store_unit.py"] for m in ("store", "rows", "run_records",
                                                                                 "revisions")},
    "annotations/io/dataset.py": ["tests/unit/test_dataset_unit.py",
                                  *(f"tests/integration/test_merge.py::{t}" for t in (
                                      "test_reimport_keeps_app_edits_drawn_outlines_and_undone_answers",
                                      "test_a_change_in_the_dataset_alone_is_applied",
                                      "test_both_sides_changed_is_a_conflict_named_by_file_line_field",
                                      "test_dry_run_reports_and_writes_nothing",
                                      "test_rows_gone_from_the_dataset_are_deleted_only_with_prune",
                                      "test_import_is_atomic_when_it_fails_midway",
                                      "test_export_refuses_a_non_empty_folder_unless_forced",
                                      "test_study_ids_replace_photo_names_and_keep_the_mapping_apart",
                                      "test_workspace_kinds_are_kept_apart",
                                      "test_synthetic_flag_is_parsed_never_truthy_by_being_non_empty",
                                      "test_every_write_names_its_actor",
                                      "test_import_waiting_too_long_for_the_lock_changes_nothing",
                                      "test_an_outline_drawn_in_the_app_is_never_overwritten_by_a_new_dataset_wound",
                                      "test_judgments_follow_the_three_way_rules",
                                      "test_a_judgment_changed_on_both_sides_is_a_conflict",
                                      "test_a_judgment_deleted_in_the_app_and_changed_in_the_file_is_a_conflict",
                                      "test_judgments_gone_from_the_file_are_deleted_only_with_prune_and_app_changes_conflict")),
                                  "tests/integration/test_dataset_streaming.py"],
}
# Mutants reviewed by hand and judged equivalent (no behaviour can tell them from the original) are
# not made at all: the line carries ``# pragma: no mutate`` and the reason, in the module itself, so the
# excuse moves with the code (mutmut's numbered mutant names shift whenever a function changes). A pragma
# silences every mutation starting on its line: the equivalent part stands on a line of its own, inside
# the brackets. Mutants that only change the letter case of an SQL statement are excused here, and left
# out of the score (:func:`sql_case_only`).
SQL_CASE = "only the letter case of SQL keywords/identifiers changes (SQLite reads them case-insensitively)"
KILLED = {1, 3, 24, -24, 36, 152, 255}  # test failure, pytest internal error, timeout (SIGXCPU)
NOT_RUN = {None, 2, 34}  # not checked, interrupted, skipped


def scratch_copy(workdir: Path) -> None:
    """Copy the working tree's tracked and untracked, not ignored files to ``workdir``."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        src, dst = ROOT / name, workdir / name
        if src.is_file() and (not dst.exists() or dst.read_bytes() != src.read_bytes()):
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


def write_config(workdir: Path, module: str, tests: list[str]) -> None:
    """The copy's ``[tool.mutmut]``: the checkout's settings plus ``module`` and its ``tests``."""
    settings = toml_loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    settings = {**settings, "source_paths": [module], "pytest_add_cli_args_test_selection": tests}
    pyproject = workdir / "pyproject.toml"
    text = pyproject.read_text().split("[tool.mutmut]")[0].rstrip()
    body = "\n".join(f"{key} = {json.dumps(value)}" for key, value in settings.items())
    pyproject.write_text(f"{text}\n\n[tool.mutmut]\n{body}\n")


def _functions(source: str) -> dict[str, str]:
    """Source of every function in a mutmut-instrumented file, by name (methods included)."""
    lines = source.splitlines()
    return {node.name: "\n".join(lines[node.lineno - 1:node.end_lineno]) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


_SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|PRAGMA|BEGIN|COMMIT|ROLLBACK|WHERE|VALUES|FROM|GROUP BY|ORDER BY|SET)\b"
                  r"|^\s*(AND|OR)\s*$|\w = \?|= excluded\.\w")


def sql_case_only(original: str, mutant: str) -> bool:
    """Whether two versions of a function differ only in the letter case of SQL text: every changed
    string literal is SQL (an upper-case SQL keyword) and its quoted SQL literals ('…') are unchanged."""
    old = [line for line in original.splitlines()[1:]]
    new = [line for line in mutant.splitlines()[1:]]
    if len(old) != len(new) or old == new:
        return False
    for a, b in zip(old, new):
        if a == b:
            continue
        if a.lower() != b.lower():
            return False
        for lit_a, lit_b in zip(re.findall(r'"([^"]*)"', a), re.findall(r'"([^"]*)"', b)):
            if lit_a != lit_b and (not _SQL.search(lit_a) or re.findall(r"'[^']*'", lit_a) != re.findall(r"'[^']*'", lit_b)):
                return False
    return True


def excuse(workdir: Path, name: str, cache: dict[str, dict[str, str]]) -> str | None:
    """Why the surviving mutant ``name`` is equivalent, or None (a survivor that counts)."""
    module, function = name.rsplit(".", 1)
    path = workdir / "mutants" / (module.replace(".", "/") + ".py")
    if not path.exists():
        return None
    if module not in cache:
        cache[module] = _functions(path.read_text())
    functions = cache[module]
    original = functions.get(function.rsplit("__mutmut_", 1)[0] + "__mutmut_orig")
    if original is not None and function in functions and sql_case_only(original, functions[function]):
        return SQL_CASE
    return None


def diff(workdir: Path, name: str, cache: dict[str, dict[str, str]]) -> str:
    """The mutant's changed lines (``-``/``+``), for the survivors list."""
    module, function = name.rsplit(".", 1)
    if module not in cache:
        cache[module] = _functions((workdir / "mutants" / (module.replace(".", "/") + ".py")).read_text())
    functions = cache[module]
    old = functions[function.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"].splitlines()[1:]
    new = functions[function].splitlines()[1:]
    return " | ".join(line.strip() for line in difflib.ndiff(old, new) if line[:1] in "-+")


def score(workdir: Path) -> tuple[int, int, list[str], int]:
    """(killed, total tested, surviving mutant names, not yet tested) from mutmut's ``.meta`` files
    under ``workdir/mutants``."""
    killed, total, survivors, pending = 0, 0, [], 0
    for meta in sorted((workdir / "mutants").rglob("*.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if code in NOT_RUN:
                pending += 1
                continue
            total += 1
            if code in KILLED:
                killed += 1
            else:
                survivors.append(name)
    return killed, total, survivors, pending


def run_module(module: str, workdir: Path, jobs: int) -> tuple[int, int, list[str], int]:
    """Run mutmut on ``module`` in its own scratch copy; returns :func:`score`. Mutants that
    survived an earlier run are tested again (the tests may have changed since)."""
    here = workdir / module.replace("/", "_").removesuffix(".py")
    here.mkdir(parents=True, exist_ok=True)
    scratch_copy(here)
    write_config(here, module, MODULES[module])
    survivors = score(here)[2] if (here / "mutants").exists() else []
    # which tests cover which function is cached; the tests may have changed: collect it again
    (here / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    mutmut = [str(Path(sys.executable).with_name("mutmut")), "run", "--max-children", str(jobs)]
    # the tests' tmp_path workspaces (SQLite, fsync) in memory where there is a tmpfs: ~5x faster
    with tempfile.TemporaryDirectory(prefix="triderm-mutation-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        env["TMPDIR"] = tmp
        if survivors:  # first, so that an interrupted run has already re-checked them against the new tests
            subprocess.run(mutmut + survivors, cwd=here, env=env, check=False)
        subprocess.run(mutmut, cwd=here, env=env, check=False)
    return score(here)


def main(argv: list[str] | None = None) -> int:
    """Mutate the chosen modules (or report their stored scores) and print the table; returns 0."""
    parser = argparse.ArgumentParser(prog="python scripts/mutation.py", description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"modules to mutate (default: all, in order: {', '.join(MODULES)})")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/triderm-mutation"))
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested in parallel")
    parser.add_argument("--survivors", action="store_true", help="list the surviving mutants' names")
    parser.add_argument("--report", action="store_true", help="print the stored scores; mutate nothing")
    args = parser.parse_args(argv)
    unknown = set(args.modules) - set(MODULES)
    if unknown:
        parser.error(f"not in MODULES: {', '.join(sorted(unknown))}")
    rows = []
    for module in args.modules or list(MODULES):
        here = args.workdir / module.replace("/", "_").removesuffix(".py")
        if args.report and not (here / "mutants").exists():
            continue
        killed, total, survivors, pending = score(here) if args.report else run_module(module, args.workdir, args.jobs)
        cache: dict[str, dict[str, str]] = {}
        reasons = {name: excuse(here, name, cache) for name in survivors}
        excused = [name for name in survivors if reasons[name]]
        rows.append((module, killed, total, len(excused), pending))
        if args.survivors:
            print(f"survivors in {module} (not excused):",
                  *(f"{name}: {diff(here, name, cache)}" for name in survivors if not reasons[name]), sep="\n  ")
            print(f"equivalent (excused) in {module}:", *(f"{name}: {reasons[name]}" for name in excused), sep="\n  ")
    print(f"\n{'module':28} {'killed':>7} {'tested':>7} {'excused':>8} {'score':>6} {'raw':>6} {'not tested':>11}")
    for module, killed, total, excused, pending in rows:
        print(f"{module:28} {killed:7d} {total:7d} {excused:8d} {100 * killed / max(total - excused, 1):5.1f}% "
              f"{100 * killed / max(total, 1):5.1f}% {pending:11d}")
    print("score = killed / (tested - excused); raw = killed / tested; excused: equivalent mutants (--survivors lists them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
