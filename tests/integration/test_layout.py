"""The folder tree is the method: import rules between the parts, and every job's ``--help``.

The rules (docs/ARCHITECTURE.md) are read off the code by walking every import statement with
:mod:`ast`, function-level imports included, so they stay true as the code grows.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "core"
MAX_PAGE_SCRIPT_LINES = 30  # the Wound masks page's photo choice and session state, the longest
MAX_PAGE_LINES = 150  # a page file (and app.py) wires widgets to the app/ package's functions
JOBS = ("train_triderm", "embed", "llm_triplets", "fit_soe", "text_embed", "evaluate", "ablate", "train_slimp",
        "train_concepts", "bench_contrastive", "train_segmenter", "extract_features", "export_model", "segment",
        "ml_backend", "token_maps")
PLUMBING = ("runtime", "cli")
PARTS = ("vision", "text", "eval", "nested", "concepts", "losses", "experiments", "phantoms", "segmentation")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (``from a.b import c`` counts as ``a.b`` and ``a.b.c``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def graph(folder: Path) -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in folder.rglob("*.py")}


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(edges: dict[str, set[str]], src: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} imports {i}" for m, imps in edges.items() if under(m, src)
                  for i in imps if any(under(i, f) for f in forbidden))


_spec = importlib.util.spec_from_file_location("architecture", REPO / "scripts" / "architecture.py")
architecture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(architecture)

CORE_EDGES = graph(CORE)
ANNOTATIONS_EDGES = graph(REPO / "annotations")


def test_annotations_import_neither_core_nor_streamlit_nor_torch():
    assert violations(ANNOTATIONS_EDGES, "annotations", ("core", "streamlit", "torch")) == []


@pytest.mark.parametrize(("src", "edges"), [("core", CORE_EDGES), ("annotations", ANNOTATIONS_EDGES)])
def test_the_product_never_imports_its_benchmarks(src, edges):
    assert violations(edges, src, ("benchmarks",)) == []


def test_core_never_imports_the_ui():
    assert violations(CORE_EDGES, "core", ("streamlit", "pages", "app")) == []


@pytest.mark.parametrize(("src", "dst"), [("core.vision", "core.text"), ("core.text", "core.vision")])
def test_vision_and_text_never_import_each_other(src, dst):
    assert violations(CORE_EDGES, src, (dst,)) == []


def test_eval_sits_below_the_branches_it_compares():
    """Vision and text meet in eval through distance matrices only: eval imports neither branch."""
    assert violations(CORE_EDGES, "core.eval", ("core.vision", "core.text", "core.nested", "core.concepts",
                                                "core.experiments")) == []


def test_losses_and_phantoms_are_self_contained():
    assert [v for v in violations(CORE_EDGES, "core.losses", ("core",)) if " core.losses" not in v] == []
    assert [v for v in violations(CORE_EDGES, "core.phantoms", ("core",)) if " core.phantoms" not in v] == []


def test_library_code_never_imports_a_job():
    jobs = tuple(f"core.{j}" for j in JOBS)
    for part in PARTS:
        assert violations(CORE_EDGES, f"core.{part}", jobs) == [], part


def test_a_rule_breach_is_caught(tmp_path):
    """The walker sees a function-level import, so a breach hidden in a function fails the rules."""
    bad = tmp_path / "core" / "vision" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def f():\n    from core.text.soe import SOE\n    return SOE\n")
    edges = {"core.vision.bad": imports_of(bad)}
    assert violations(edges, "core.vision", ("core.text",)) == ["core.vision.bad imports core.text.soe",
                                                                "core.vision.bad imports core.text.soe.SOE"]


def test_the_architecture_picture_is_current_and_the_packages_hold_no_cycle():
    """docs/ARCHITECTURE.md's Mermaid block is what `make architecture` writes from today's imports."""
    pytest.importorskip("grimp", reason="the lint extra (`make install` installs it; `make test-min` does not)")
    arrows = architecture.package_edges(architecture.module_edges())
    assert architecture.cycles(arrows) == []
    assert ("pages", "app") in arrows and ("core.vision", "annotations") in arrows  # grimp and ast both read
    text = architecture.DOC.read_text(encoding="utf-8")
    assert architecture.render(text, architecture.mermaid(arrows)) == text, "run `make architecture`"


def test_the_tree_names_every_module_of_annotations():
    """docs/ARCHITECTURE.md's tree shows each subpackage of annotations and, under it, each of its modules."""
    text = architecture.DOC.read_text(encoding="utf-8")
    tree = text[text.index("\nannotations/ "):text.index("\ncore/\n")]
    blocks = dict(re.findall(r"^  (\w+)/(.*?)(?=^  \w+/|\Z)", tree, flags=re.M | re.S))
    packages = {p.parent.name for p in (REPO / "annotations").glob("*/__init__.py")}
    assert set(blocks) == packages
    for package in packages:
        modules = {p.name for p in (REPO / "annotations" / package).glob("*.py") if p.stem != "__init__"}
        assert {m for m in modules if m not in blocks[package]} == set(), package


def test_a_package_cycle_and_a_stale_picture_are_caught():
    assert sorted(set(architecture.cycles({("core.eval", "core.vision"), ("core.vision", "core.eval"),
                                           ("core.vision", "annotations")}))) == ["core.eval", "core.vision"]
    text = f"intro\n{architecture.BEGIN}\nold\n{architecture.END}\nrest\n"
    assert architecture.render(text, "new") == f"intro\n{architecture.BEGIN}\nnew\n{architecture.END}\nrest\n"
    with pytest.raises(ValueError, match="architecture:end"):
        architecture.render(f"{architecture.BEGIN}\n", "new")


def module_cycle(edges: dict[str, set[str]]) -> list[str]:
    """The modules of one import cycle among ``edges``' own modules (``[]`` when none): every import
    counts, function-level and ``TYPE_CHECKING`` ones included, as grimp counts them."""
    return architecture.cycles({(m, i) for m, imps in edges.items() for i in imps if i in edges and i != m})


PROJECT_EDGES = {**{m: imps for root in architecture.ROOT_PACKAGES for m, imps in graph(REPO / root).items()},
                 "app.py": imports_of(REPO / "app.py")}  # the entry script (run as __main__, imported by none)


@pytest.mark.parametrize("edges", [ANNOTATIONS_EDGES, CORE_EDGES, PROJECT_EDGES], ids=["annotations", "core", "all"])
def test_no_import_cycle_between_modules(edges):
    """No cycle inside annotations or core, nor anywhere in the project (pages, app, benchmarks … together)."""
    assert module_cycle(edges) == []


def test_a_module_cycle_is_caught(tmp_path):
    """A cycle through a function-level ``from package import module`` is found; a chain is not."""
    planted = {"annotations.a": {"annotations.b", "annotations.b.X", "numpy"}, "annotations.c": {"annotations.a"}}
    assert module_cycle(planted) == []
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from annotations import a\n    return a\n")
    planted["annotations.b"] = imports_of(b)
    assert sorted(set(module_cycle(planted))) == ["annotations.a", "annotations.b"]


# ------------------------------------------------------------------ SQL lives in the data layer (annotations/)
SQL_TEXT = re.compile(r"\b(SELECT\b.+\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|DELETE\s+FROM|UPDATE\s+\w+\s+SET|"
                      r"CREATE\s+(TABLE|INDEX|TRIGGER)|DROP\s+TABLE|PRAGMA\s+\w+)", re.S)
SQL_MODULES = ("sqlite3", "sqlite_utils")
OUTSIDE_THE_DATA_LAYER = ("app.py", "app", "pages", "components", "core", "benchmarks", "triderm")


def raw_sql(path: Path) -> list[str]:
    """``line what`` for every SQL statement text, database connection use (``.db``, ``.execute(``) and
    import of a SQLite module in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL_TEXT.search(node.value):
            found.append(f"{node.lineno} SQL text {node.value[:40]!r}")
        elif isinstance(node, ast.Attribute) and node.attr in ("db", "execute", "executemany", "executescript"):
            found.append(f"{node.lineno} .{node.attr}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{node.lineno} import {n}" for n in names if n.split(".")[0] in SQL_MODULES]
    return sorted(found, key=lambda f: (int(f.split()[0]), f))


def test_no_raw_sql_outside_the_data_layer():
    """Pages, core and the benchmarks ask the store (annotations/) by name; they write no SQL of their own."""
    files = [p for name in OUTSIDE_THE_DATA_LAYER
             for p in ([REPO / name] if name.endswith(".py") else sorted((REPO / name).rglob("*.py")))]
    assert len(files) > 100
    assert [f"{p.relative_to(REPO)}:{v}" for p in files for v in raw_sql(p)] == []


STORE_LAYER = REPO / "annotations" / "store"
#: the store layer's modules that run SQL (the others hold its row values, run kinds and history)
STORE_QUERY_MODULES = ("store", "run_records", "revisions", "readings", "erasure", "accounts", "leases",
                       "snapshots", "imports")


def test_sql_inside_annotations_lives_in_its_store_layer():
    """annotations.store holds the SQL; no other module of annotations holds any: they ask the store's
    named queries."""
    modules = [p for p in sorted((REPO / "annotations").rglob("*.py")) if STORE_LAYER not in p.parents]
    assert len(modules) > 20
    assert [f"{p.relative_to(REPO)}:{v}" for p in modules for v in raw_sql(p)] == []
    assert all(raw_sql(STORE_LAYER / f"{name}.py") for name in STORE_QUERY_MODULES)


def test_raw_sql_is_caught(tmp_path):
    page = tmp_path / "page.py"
    page.write_text('import sqlite3\n\n\ndef last(store):\n    return store.db.execute(\n'
                    '        "SELECT max(id) "\n        "FROM revisions").fetchone()\n\n\n'
                    'LABEL = "Select the photos from the list"\nQ = "PRAGMA integrity_check"\n')
    assert raw_sql(page) == [
        "1 import sqlite3", "5 .db", "5 .execute", "6 SQL text 'SELECT max(id) FROM revisions'",
        "11 SQL text 'PRAGMA integrity_check'"]
    assert "SELECT" in (REPO / "annotations" / "store" / "store.py").read_text()  # the data layer does hold the SQL


def test_core_top_level_holds_only_jobs_and_the_plumbing():
    top = {p.stem for p in CORE.glob("*.py")}
    assert top == {"__init__", *PLUMBING, *JOBS}
    assert {p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(PARTS)
    for job in JOBS:
        source = (CORE / f"{job}.py").read_text()
        assert "def main(" in source and 'if __name__ == "__main__":' in source, job


def test_every_part_says_what_it_holds():
    for part in PARTS:
        doc = ast.get_docstring(ast.parse((CORE / part / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"core/{part}/__init__.py needs a docstring saying what it holds"


@pytest.mark.parametrize("job", [*JOBS, "phantoms"])
def test_every_documented_job_answers_help(job):
    out = subprocess.run([sys.executable, "-m", f"core.{job}", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (f"python -m core.{job}" in out.stdout and "--workspace" in out.stdout) or job == "phantoms"
    assert "usage:" in out.stdout


# ------------------------------------------------------------------ thin jobs; library code never prints or exits
MAX_FUNCTION_LINES = 60
JOB_MODULES = {*(f"core.{j}" for j in JOBS), "core.phantoms.__main__"}


def _scopes(tree: ast.AST) -> dict[ast.AST, list[str]]:
    """Every node → the names of the functions around it, outermost first."""
    out: dict[ast.AST, list[str]] = {}

    def visit(node: ast.AST, chain: list[str]) -> None:
        out[node] = chain
        inner = [*chain, node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else chain
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, [])
    return out


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``name (N lines)`` for every function of ``path`` longer than ``limit`` lines (decorators excluded)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{'.'.join([*chain, n.name])} ({n.end_lineno - n.lineno + 1} lines)"
            for n, chain in _scopes(tree).items()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit]


def prints_and_exits(path: Path, module: str) -> list[str]:
    """``print(`` calls, ``raise SystemExit`` and ``sys.exit(``/``exit(``/``os._exit(`` outside a job's ``main``
    (a job's module level may exit: ``raise SystemExit(main())``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    job = module in JOB_MODULES
    found = []
    for node, chain in _scopes(tree).items():
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            what = "print"
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "exit", "quit", "os._exit"):
            what = ast.unparse(node.func)
        elif isinstance(node, ast.Raise) and node.exc is not None and ast.unparse(node.exc).startswith("SystemExit"):
            what = "raise SystemExit"
        else:
            continue
        allowed = job and ("main" in chain or (not chain and what != "print"))
        if not allowed:
            found.append(f"{module}:{node.lineno} {what} in {'.'.join(chain) or 'module level'}")
    return found


@pytest.mark.parametrize("job", [p.stem for p in sorted(CORE.glob("*.py"))])
def test_jobs_are_thin_no_function_over_60_lines(job):
    """A job parses, opens the workspace, calls the method's folder and prints: its loops live there."""
    assert long_functions(CORE / f"{job}.py") == []


def test_only_a_jobs_main_prints_or_exits():
    """Library code logs (``logging.getLogger(__name__)``) and raises; only a job's ``main`` prints or exits."""
    found = [v for p in CORE.rglob("*.py") for v in prints_and_exits(p, module_name(p))]
    assert found == []


def script_lines(path: Path) -> int:
    """Lines of ``path``'s module-level statements other than imports (an optional import's ``try`` too),
    definitions and the docstring."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imports = (ast.Import, ast.ImportFrom)
    return sum(n.end_lineno - n.lineno + 1 for n in tree.body[1:]
               if not isinstance(n, (*imports, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               and not (isinstance(n, ast.Try) and all(isinstance(b, imports) for b in n.body)))


@pytest.mark.parametrize("page", sorted(p.name for p in (REPO / "pages").glob("*.py")))
def test_pages_are_functions_a_test_can_call(page):
    """A page's module level only sets up (``navigation.page``, constants, session defaults) and calls its
    functions."""
    assert script_lines(REPO / "pages" / page) <= MAX_PAGE_SCRIPT_LINES


@pytest.mark.parametrize("script", ["app.py", *sorted(f"pages/{p.name}" for p in (REPO / "pages").glob("*.py"))])
def test_pages_and_the_entry_are_thin(script):
    """Each page file and app.py holds at most 150 lines: its logic lives in the app/ package."""
    assert len((REPO / script).read_text(encoding="utf-8").splitlines()) <= MAX_PAGE_LINES


def test_a_long_page_script_is_caught(tmp_path):
    page = tmp_path / "page.py"
    page.write_text('"""Doc."""\nimport streamlit as st\n\n\ndef main():\n    st.write(1)\n\n\n'
                    + "st.write(2)\n" * (MAX_PAGE_SCRIPT_LINES + 1) + "main()\n")
    assert script_lines(page) == MAX_PAGE_SCRIPT_LINES + 2


def test_a_long_function_or_a_library_print_is_caught(tmp_path):
    lib = tmp_path / "lib.py"
    lib.write_text("import sys\n\n\ndef helper():\n    print('x')\n    raise SystemExit(1)\n\n\n"
                   "def main():\n    def inner():\n        print('ok in main')\n    sys.exit(inner())\n\n\n"
                   "def long():\n" + "    x = 1\n" * 60 + "\n\nif True:\n    raise SystemExit(main())\n")
    assert long_functions(lib) == ["long (61 lines)"]
    assert prints_and_exits(lib, "core.embed") == ["core.embed:5 print in helper", "core.embed:6 raise SystemExit in helper"]
    assert prints_and_exits(lib, "core.text.lib") == [
        "core.text.lib:5 print in helper", "core.text.lib:6 raise SystemExit in helper",
        "core.text.lib:11 print in main.inner", "core.text.lib:12 sys.exit in main",
        "core.text.lib:79 raise SystemExit in module level"]
