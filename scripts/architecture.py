"""docs/ARCHITECTURE.md's picture of the packages and their import arrows (``make architecture``).

    python scripts/architecture.py [--check]

grimp (import-linter's import graph) reads every import of the root packages, function-level ones
included; app.py, the single-file entry that grimp cannot take as a root (grimp#300) and whose name is the
app/ package's, is read with :mod:`ast` and drawn in the app/ package's node. Modules are grouped into the picture's nodes (:func:`node_of`): each part of
``core`` is one, its jobs another, its plumbing (``core.runtime``, ``core.cli``) a third. An arrow
``A --> B`` says that some module of A imports some module of B. The Mermaid block is written between
:data:`BEGIN` and :data:`END` in docs/ARCHITECTURE.md; ``--check`` changes nothing and exits 1 when the
block there is not the current one, or when the nodes' arrows hold a cycle.
"""
from __future__ import annotations

import argparse
import ast
import graphlib
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "ARCHITECTURE.md"
ROOT_PACKAGES = ("core", "annotations", "pages", "app", "components", "triderm", "benchmarks")
CORE_PLUMBING = ("core.runtime", "core.cli")
BEGIN = "<!-- architecture:begin (make architecture writes this block) -->"
END = "<!-- architecture:end -->"
LABELS = {"app": "app.py, app/", "core.jobs": "core jobs (python -m core.*)",
          "core.plumbing": "core.runtime, core.cli"}


def node_of(module: str) -> str | None:
    """The picture's node holding ``module``, or None for a module outside the project (torch, stdlib, …)."""
    top = module.split(".")[0]
    if top not in ROOT_PACKAGES:
        return None
    if top != "core":
        return top
    parts = module.split(".")
    if len(parts) == 1:
        return "core.jobs"  # core/__init__.py: the docstring of the jobs' package
    if ".".join(parts[:2]) in CORE_PLUMBING:
        return "core.plumbing"
    if (REPO / "core" / parts[1]).is_dir():
        return f"core.{parts[1]}"
    return "core.jobs"


def _ast_imports(path: Path) -> set[str]:
    """Every absolute import of ``path`` at any depth (``from a import b`` counts as ``a`` and ``a.b``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return out


def module_edges() -> set[tuple[str, str]]:
    """(importer, imported) for every import of the project's modules (imported: possibly outside it)."""
    import grimp  # the lint extra's (import-linter's graph)

    if str(REPO) not in sys.path:  # grimp finds the root packages through the import system
        sys.path.insert(0, str(REPO))
    graph = grimp.build_graph(*ROOT_PACKAGES, include_external_packages=True, cache_dir=None)
    edges = {(m, i) for m in graph.modules for i in graph.find_modules_directly_imported_by(m)}
    edges |= {("app", i) for i in _ast_imports(REPO / "app.py")}
    return edges


def package_edges(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The arrows between the picture's nodes: ``(A, B)`` when a module of A imports one of B, A ≠ B."""
    out = set()
    for importer, imported in edges:
        a, b = node_of(importer), node_of(imported)
        if a and b and a != b:
            out.add((a, b))
    return out


def cycles(arrows: set[tuple[str, str]]) -> list[str]:
    """The nodes of one cycle among ``arrows`` (``[]`` when they hold none)."""
    sorter = graphlib.TopologicalSorter[str]()
    for a, b in arrows:
        sorter.add(a, b)
    try:
        sorter.prepare()
    except graphlib.CycleError as err:
        return list(err.args[1])
    return []


def _id(node: str) -> str:
    return re.sub(r"\W", "_", node)


def mermaid(arrows: set[tuple[str, str]]) -> str:
    """The Mermaid flowchart of ``arrows``, core's nodes in one subgraph, in a stable order."""
    nodes = sorted({n for arrow in arrows for n in arrow})
    lines = ["```mermaid", "flowchart TD"]
    outside = [n for n in nodes if not n.startswith("core.")]
    inside = [n for n in nodes if n.startswith("core.")]
    lines += [f'    {_id(n)}["{LABELS.get(n, n)}"]' for n in outside]
    lines.append('    subgraph core_folder ["core"]')
    lines += [f'        {_id(n)}["{LABELS.get(n, n)}"]' for n in inside]
    lines.append("    end")
    lines += [f"    {_id(a)} --> {_id(b)}" for a, b in sorted(arrows)]
    lines.append("```")
    return "\n".join(lines)


def render(text: str, block: str) -> str:
    """``text`` with ``block`` between its markers; a ValueError names a missing marker."""
    for marker in (BEGIN, END):
        if text.count(marker) != 1:
            raise ValueError(f"{DOC}: needs the line {marker!r} exactly once")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the picture; 1 when stale or cyclic."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when the block is stale")
    args = parser.parse_args(argv)
    arrows = package_edges(module_edges())
    cycle = cycles(arrows)
    if cycle:
        print("a cycle between packages: " + " -> ".join(cycle), file=sys.stderr)
        return 1
    text = DOC.read_text(encoding="utf-8")
    new = render(text, mermaid(arrows))
    if args.check:
        if new != text:
            print(f"{DOC.relative_to(REPO)} is out of date: run `make architecture`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"{DOC.relative_to(REPO)}: {len(arrows)} arrows between {len({n for a in arrows for n in a})} packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
