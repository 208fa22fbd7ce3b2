"""Machine-readable result files and the renderer of docs/RESULTS.md.

Every benchmark (section) writes ``results/<section>.json`` through :func:`write_result`
(:mod:`core.eval.result_files`, re-exported here with the statistics of :mod:`core.eval.stats`);
``python -m benchmarks.results`` renders docs/RESULTS.md from those files alone, so every
number in RESULTS.md comes from a result file. ``--run NAME`` (or ``--run all``) first reruns
the section's command from :data:`SECTIONS` from scratch (``make results [SECTION=name]``).

The file format is :mod:`core.eval.result_files`'s. A result found wrong after it was written keeps
its file and gets ``results/<section>.erratum.md`` (text without digits), rendered under it.

    python -m benchmarks.results [--run NAME|all] [--out FILE]
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from annotations.infra.fileio import read_json
from core.eval.formatting import agreement_text
from core.eval.protocol import paired_claim
from core.eval.result_files import COMMAND_ENV, STARTED_ENV, command_line, machine, write_result
from core.eval.stats import fdr_adjusted, mean_sd_ci, multiple_tests_note

__all__ = ["REPO", "REQUIRED", "RESULTS_DIR", "RESULTS_MD", "SECTIONS", "command_line", "fmt_cell", "machine",
           "mean_sd_ci", "multiple_tests_note", "paired_claim", "render", "render_tables", "write_result"]

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "results"  # the checkout's result files (benchmarks run from a checkout, never a wheel)
RESULTS_MD = REPO / "docs" / "RESULTS.md"

# Section name → the shell command (run from the repository root) that regenerates it from scratch.
SECTIONS: dict[str, str] = {
    "vision_ablation": "python -m benchmarks.vision_ablation",
    "real_vision": "python -m benchmarks.real_vision --data ../shared/data/azh-dev --views 4",
    "real_vision_adapt": ("python -m benchmarks.real_vision_adapt --data ../shared/data/azh-dev"
                          " --unlabelled ../shared/data/fuseg-dev ../shared/data/medetec"),
    "real_vision_directions": "python -m benchmarks.real_vision_directions --data ../shared/data/azh-dev --views 4",
    "real_vision_medetec": "python -m benchmarks.real_vision --data ../shared/data/medetec --section real_vision_medetec",
    "real_retrieval": "python -m benchmarks.real_retrieval --data ../shared/data/azh-dev --views 4 --seeds 0 1 2",
    "train_triderm": "python -m benchmarks.train_triderm",
    "soe": "python -m benchmarks.soe",
    "soe_scale": "python -m benchmarks.soe --scale",
    "scale": "python -m benchmarks.scale --full",
    "active": "python -m benchmarks.active",
    "active_scale": "python -m benchmarks.active --planted 1000",
    "active_real": "python -m benchmarks.active_real --data ../shared/data/azh-dev",
    "learning_curve": "python -m benchmarks.active_real --data ../shared/data/azh-dev --learner finetune --seeds 0 1 2",
    "ablation": ("d=$(mktemp -d) && trap 'rm -rf \"$d\"' EXIT && python -m core.phantoms --out $d/data --seed 0"
                 " && python -m annotations import $d/data --workspace $d/ws"
                 " && python -m core.llm_triplets --workspace $d/ws --oracle phantom --budget 100% --seed 0"
                 " && python -m core.ablate --workspace $d/ws --tables text --results results"),
    "orderings": "python -m benchmarks.orderings",
    "concepts": "python -m benchmarks.concepts",
    "flip": "python -m benchmarks.flip",
    "segmentation": "python -m benchmarks.segmentation",
    "segmentation_ablation": "python -m benchmarks.segmentation --part ablation --section segmentation_ablation",
    "segmentation_timing": "python -m benchmarks.segmentation --part timing --section segmentation_timing",
    "segmentation_default": "python -m benchmarks.segmentation_default",
    "followup": "python -m benchmarks.followup --data ../shared/data",
    "app_latency": "python -m benchmarks.app_latency --triplets --upload 20 --worklist --zoom --after-job",
    "gpu": "python -m benchmarks.gpu --medetec ../shared/data/medetec --epochs 3 --epoch-devices cuda --views 4",
}
NEEDS_CUDA = ("gpu",)  # `--run all` keeps these sections' stored files on a machine without CUDA
REQUIRED = ("section", "title", "command", "seeds", "machine", "commit", "date", "seconds", "synthetic", "tables",
            "claims", "notes")
HEADER = """# Measured results

Rendered by `python -m benchmarks.results` from the result files in `results/`: do not edit by
hand. `make results` reruns every section from scratch and renders this page;
`make results SECTION=name` reruns one section. Each section states its command, seeds, machine,
date and how long it took. Sections on SYNTHETIC phantom data say how the software behaves, not
how a method performs on patients. Text and fusion have only been checked on phantoms: the
shared data holds no real wound descriptions.
"""


# ---------------------------------------------------------------------------------- rendering
def fmt_number(v: Any) -> str:
    """A stored cell value as text: None → –, bool → yes/no, whole numbers without decimals, other
    floats to 4 significant digits (one decimal from 100, none from 1000)."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "n/a"
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        if abs(v) >= 1000:
            return f"{v:.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        return f"{v:.4g}"
    return str(v)


def fmt_cell(v: Any) -> str:
    """A table cell: a number, text, or a mean ± sd [95 % CI] dict, whose figures are all given to the
    decimal of the sd's second significant digit (one decimal when the sd is 0 or missing); a
    missing sd or CI, or a CI of zero width (one seed, no spread), is left out rather than faked."""
    if isinstance(v, dict):
        if v.get("mean") is None:
            return "–"
        sd = v.get("sd")
        places = min(4, max(0, 1 - math.floor(math.log10(sd)))) if sd else 1
        ci = v.get("ci")
        if ci is not None and ci[0] == ci[1]:  # a zero-width interval is no interval
            ci = None
        return agreement_text(v["mean"], ci, sd=sd, scale=1, digits=places)
    return fmt_number(v).replace("|", "\\|")


def fmt_p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.2g}"


def fmt_seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def fmt_machine(m: dict[str, Any]) -> str:
    """The machine line: CPUs (and their model), platform, torch and the recorded library versions, GPU."""
    gpu = f"CUDA {m['cuda']}" if m.get("cuda") else "no CUDA"
    cpus = f"{m.get('cpus', m.get('cpu_count'))} CPUs" + (f" ({m['cpu']})" if m.get("cpu") else "")
    libraries = "".join(f", {name} {v}" for name, v in (m.get("libraries") or {}).items() if v)
    return f"{cpus}, {m.get('platform')}, torch {m.get('torch')}{libraries}, {gpu}"


def render_tables(tables: Sequence[dict[str, Any]]) -> str:
    """Markdown tables, each under its caption (benchmarks print this too)."""
    lines = []
    for t in tables:
        lines += [f"**{t['caption']}**", "",
                  "| " + " | ".join(t["columns"]) + " |",
                  "|" + "---|" * len(t["columns"])]
        lines += ["| " + " | ".join(fmt_cell(c) for c in row) + " |" for row in t["rows"]]
        lines.append("")
        if t.get("legend"):
            lines += [t["legend"], ""]
    if any(isinstance(c, dict) for t in tables if not t.get("legend") for row in t["rows"] for c in row):
        lines += ["Cells read mean ± sd [95 % CI] over seeds.", ""]
    return "\n".join(lines)


def render_section(r: dict[str, Any]) -> str:
    """One section of RESULTS.md from one result record."""
    seeds = ", ".join(str(s) for s in r["seeds"]) or "none (deterministic)"
    lines = [f"## {r['title']}", "",
             f"- data: **{'SYNTHETIC phantom data' if r['synthetic'] else 'real data'}**",
             f"- command: `{r['command']}`",
             f"- seeds: {seeds}",
             f"- machine: {fmt_machine(r['machine'])}",
             f"- commit {r['commit'][:12]}, {r['date']}, took {fmt_seconds(r['seconds'])}", ""]
    lines.append(render_tables(r["tables"]))
    if r["claims"]:
        adjusted = fdr_adjusted([c["p"] for c in r["claims"]])
        lines.append(f"Claims (a claim holds only when its paired test says so, p < 0.05; q: the p-value "
                     f"adjusted for the {sum(q is not None for q in adjusted)} tests of this section by "
                     f"Benjamini–Hochberg, {sum(q is not None and q < 0.05 for q in adjusted)} with q < 0.05):")
        for c, q in zip(r["claims"], adjusted):
            verdict = "holds" if c["holds"] is True else "does not hold"
            lines.append(f"- {c['claim']}: **{verdict}** ({c['test']}, p = {fmt_p(c['p'])}, q = {fmt_p(q)})")
        lines.append("")
    lines += [f"- {n}" for n in r["notes"]]
    if r["notes"]:
        lines.append("")
    if r.get("erratum"):
        lines += [f"**Erratum** (written after the run): {r['erratum']}", ""]
    return "\n".join(lines)


def read_erratum(path: Path) -> str:
    """``results/<section>.erratum.md``: what was found wrong with a run after it was written. It may hold no
    digit, so a figure reaches RESULTS.md only from a result file."""
    text = " ".join(path.read_text(encoding="utf-8").split())
    if any(ch.isdigit() for ch in text):
        raise ValueError(f"{path}: an erratum may not contain digits (figures come from result files only)")
    return text


def load_results(results_dir: Path | str) -> dict[str, dict[str, Any]]:
    """Every ``<section>.json`` in ``results_dir``; raises ValueError naming a file that lacks a key."""
    out = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        record = read_json(path)
        missing = [k for k in REQUIRED if k not in record]
        if missing:
            raise ValueError(f"{path}: missing keys {missing}")
        if record["section"] != path.stem:
            raise ValueError(f"{path}: section {record['section']!r} does not match the file name")
        out[path.stem] = record
    for path in sorted(Path(results_dir).glob("*.erratum.md")):
        section = path.name.removesuffix(".erratum.md")
        if section not in out:
            raise ValueError(f"{path}: no result file {section}.json to correct")
        out[section]["erratum"] = read_erratum(path)
    return out


def render(results_dir: Path | str = RESULTS_DIR) -> str:
    """docs/RESULTS.md from the result files: registry order, unknown sections alphabetically,
    then the registry sections that have no result file yet, with their commands."""
    records = load_results(results_dir)
    order = [s for s in SECTIONS if s in records] + sorted(s for s in records if s not in SECTIONS)
    parts = [HEADER] + [render_section(records[s]) for s in order]
    missing = [s for s in SECTIONS if s not in records]
    if missing:
        parts.append("## Not yet regenerated\n\nNo result file yet, so no figures here; rerun with "
                     "`make results SECTION=name`:\n\n" + "\n".join(f"- `{s}`: `{SECTIONS[s]}`" for s in missing)
                     + "\n")
    return "\n".join(parts)


# -------------------------------------------------------------------------------------- main
def repo_env() -> dict[str, str]:
    """``os.environ`` with this checkout first on ``PYTHONPATH``, for a child ``python -m core.<job>``:
    it imports this repository's code whatever its working directory or installed copy."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run_section(name: str, results_dir: Path) -> bool:
    """Run a section's registry command from the repository root; True when it wrote its file."""
    target = results_dir / f"{name}.json"
    before = target.stat().st_mtime_ns if target.exists() else None
    env = {**os.environ, COMMAND_ENV: SECTIONS[name], STARTED_ENV: repr(time.time()),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    print(f"[results] {name}: {SECTIONS[name]}", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run(["bash", "-c", SECTIONS[name]], cwd=REPO, env=env).returncode
    wrote = target.exists() and target.stat().st_mtime_ns != before
    print(f"[results] {name}: exit {rc}, {time.perf_counter() - t0:.0f} s, "
          + ("wrote " + str(target) if wrote else f"wrote no {target.name}"), flush=True)
    return rc == 0 and wrote


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.results", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default=None, metavar="NAME|all",
                        help=f"rerun a section (or all) before rendering: {', '.join(SECTIONS)}")
    parser.add_argument("--out", type=Path, default=RESULTS_MD, help="rendered Markdown (default docs/RESULTS.md)")
    args = parser.parse_args(argv)
    if args.run is not None and args.run != "all" and args.run not in SECTIONS:
        parser.error(f"unknown section {args.run!r}; known: all, {', '.join(SECTIONS)}")
    failed = []
    if args.run is not None:
        for name in SECTIONS if args.run == "all" else [args.run]:
            if args.run == "all" and name in NEEDS_CUDA and not cuda_available():
                print(f"[results] {name}: kept the stored result file (its command needs CUDA; none here)")
                continue
            if not run_section(name, RESULTS_DIR):
                failed.append(name)
    try:
        text = render(RESULTS_DIR)
    except ValueError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    args.out.write_text(text, encoding="utf-8")
    print(f"rendered {args.out} from {len(load_results(RESULTS_DIR))} result files")
    if failed:
        print(f"sections that failed or wrote no result file: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
