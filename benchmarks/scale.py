"""How each part grows with the study: phantom studies of N photos, timed stage by stage.

    python -m benchmarks.scale [--sizes 100 1000] [--full] [--seed 0]
    python -m benchmarks.scale --scheduler 1000 1000000

``--scheduler N M`` times only the scheduler: a store of N photo rows holding M judgments (10 %
from ten expert annotators, the rest from an LLM), 40 draws by one of those annotators.

For each N (default 100 and 1,000; ``--full`` adds 10,000), SYNTHETIC phantom data:

- phantom: ``core.phantoms.build`` with N photos, N/2 patients, 3N wounds, 5N expert triplets;
- import: ``import_dataset`` in a child process (:func:`import_in_child`): wall and CPU time and
  its peak resident memory (``wait4`` rusage);
- judgments: 100·N extra judgments stored with one batched ``Store.add_triplets``;
- features: ``FeatureCache.extract`` (efficientnet-lite0@stage5, untrained weights: the same
  compute as trained ones, no download; CPU, 1 view) on 16 photos after one warm-up photo,
  seconds per photo, and the shard files' KiB per photo on disk;
- SOE: 100·N planted triplets over N objects, dim 8 (``benchmarks.soe.planted_triplets``), after
  an untimed warm-up fit: the default gradient (through the n×n distance matrix up to 2,048
  objects, per-triplet above) and the per-triplet gradient at every size (``gradient="sparse"``,
  the algorithm whose growth the exponent then measures alone);
- scheduler: median and 95th percentile of ``TripletScheduler.next`` over 30 draws;
- explorer: bytes of the Vega-Lite spec JSON for 3N wound points (the Explore page's map,
  ``core.eval.explore.scatter_spec``, 24 colour groups, without thumbnails; the page sends its points as Arrow,
  so this is an upper bound). results/scale.json up to commit 033d038 measured the Plotly figure of that time.

Then the growth exponent of each (slope of log value vs log N between the two largest sizes,
so start-up costs do not hide the growth). The machine is shared: the load average is printed.
The table is written to ``results/scale.json`` (``--results``), a section of docs/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.results import RESULTS_DIR, command_line, render_tables, write_result
from benchmarks.soe import planted_triplets
from core import cli

STAGES = ("phantom s", "import s", "import CPU s", "import peak RSS MiB", "100·N judgments s", "feature s/photo",
          "feature KiB/photo", "SOE s", "SOE s, per-triplet gradient", "next() median ms", "next() p95 ms", "explorer KiB")
#: The import as a child process; it prints its own peak resident memory in KiB: VmHWM, the high-water mark
#: of its address space (``ru_maxrss`` would keep the parent's, inherited through fork and exec).
IMPORT_CHILD = """import re, resource, sys
from annotations.io.dataset import import_dataset
from annotations.infra.workspace import Workspace
import_dataset(Workspace(sys.argv[1]), sys.argv[2])
try:
    print(re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1))
except (OSError, AttributeError):
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def import_in_child(workspace: Path, dataset: Path) -> dict[str, float]:
    """Import ``dataset`` into ``workspace`` in a fresh Python process; its wall s, CPU s and peak RSS MiB."""
    repo = Path(__file__).resolve().parents[1]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", IMPORT_CHILD, str(workspace), str(dataset)], cwd=repo,
                            stdout=subprocess.PIPE, text=True)
    peak_kib = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"the import of {dataset} failed (exit {proc.returncode})")
    return {"import s": time.perf_counter() - t0, "import CPU s": usage.ru_utime + usage.ru_stime,
            "import peak RSS MiB": int(peak_kib) / 1024}


def measure_size(n: int, root: Path, seed: int) -> dict[str, float]:
    """Every stage's figure for a study of ``n`` photos built under ``root``."""
    from plotly.colors import qualitative

    from annotations.infra.workspace import Workspace
    from annotations.scheduling.scheduler import TripletScheduler
    from core.eval.explore import scatter_spec
    from core.phantoms import build
    from core.text.soe import SOE
    from core.vision.backbones import load_backbone
    from core.vision.features import FeatureCache

    out: dict[str, float] = {}
    t0 = time.perf_counter()
    build(root / "data", seed=seed, photos=n, patients=max(1, n // 2), wounds=3 * n, triplets=5 * n)
    out["phantom s"] = time.perf_counter() - t0

    out.update(import_in_child(root / "ws", root / "data"))
    ws = Workspace(root / "ws")

    ids = ws.store.image_ids()
    rng = np.random.default_rng(seed)
    t = rng.integers(0, n, (100 * n, 3))
    t = t[(t[:, 0] != t[:, 1]) & (t[:, 0] != t[:, 2]) & (t[:, 1] != t[:, 2])]
    rows = [{"anchor": ids[a], "ref_j": ids[j], "ref_k": ids[k], "choice": "j", "source": "llm:scale"}
            for a, j, k in t.tolist()]
    t0 = time.perf_counter()
    ws.store.add_triplets(rows)
    out["100·N judgments s"] = time.perf_counter() - t0

    backbone = load_backbone("efficientnet-lite0@stage5", device="cpu", pretrained=False)
    cache = FeatureCache(ws, backbone)
    cache.extract(ids[:1], 1, progress=False)  # warm-up (first forward pass), not timed
    sample = ids[1:17]
    t0 = time.perf_counter()
    cache.extract(sample, 1, progress=False)
    out["feature s/photo"] = (time.perf_counter() - t0) / len(sample)
    out["feature KiB/photo"] = sum(p.stat().st_size for p in cache.shard_files()) / 1024 / (1 + len(sample))

    _, triplets = planted_triplets(n, 8, 100 * n, 2.0, seed)
    for label, gradient in (("SOE s", "auto"), ("SOE s, per-triplet gradient", "sparse")):
        SOE(n_components=8, n_objects=n, epochs=2, random_state=seed, gradient=gradient).fit(triplets[:100])  # warm-up
        t0 = time.perf_counter()
        SOE(n_components=8, n_objects=n, random_state=seed, gradient=gradient).fit(triplets)
        out[label] = time.perf_counter() - t0

    sched = TripletScheduler(ws, "scale", seed=seed)
    lat = []
    for _ in range(30):
        t0 = time.perf_counter()
        question = sched.next()
        lat.append(time.perf_counter() - t0)
        sched.answer(question, "j")
    out["next() median ms"] = 1000 * float(np.median(lat))
    out["next() p95 ms"] = 1000 * float(np.percentile(lat, 95))

    xy = rng.standard_normal((3 * n, 2))
    points = [f"{ids[i % n]} #{i // n + 1}" for i in range(3 * n)]
    groups = [f"group {i % 24}" for i in range(3 * n)]  # coloured by up to 24 categories, as the page
    spec = scatter_spec(xy, points, groups, dict(zip(sorted(set(groups)), qualitative.Dark24)), "patient", "map")
    out["explorer KiB"] = len(json.dumps(spec)) / 1024
    ws.store.close()
    return out


def scheduler_latency(n: int, m: int, root: Path, seed: int, draws: int = 40) -> dict[str, float]:
    """``TripletScheduler.next`` wall and CPU ms with ``m`` judgments stored over ``n`` photos."""
    from annotations.infra.workspace import Workspace
    from annotations.scheduling.scheduler import TripletScheduler

    ws = Workspace(root / "ws")
    ids = [f"P{i:06d}" for i in range(n)]
    with ws.store.transaction():
        for i in ids:
            ws.store.upsert_image(i, f"{i}.png", "0" * 64, 64, 64)
    rng = np.random.default_rng(seed)
    t0, stored = time.perf_counter(), 0
    for start in range(0, m, 200_000):  # batches keep memory bounded
        t = rng.integers(0, n, (min(200_000, m - start), 3))
        t = t[(t[:, 0] != t[:, 1]) & (t[:, 0] != t[:, 2]) & (t[:, 1] != t[:, 2])]
        stored += ws.store.add_triplets(
            {"anchor": ids[a], "ref_j": ids[j], "ref_k": ids[k], "choice": "j",
             "source": f"expert:a{(start + r) % 10}" if start + r < m // 10 else "llm:scale"}
            for r, (a, j, k) in enumerate(t.tolist()))
    insert_s = time.perf_counter() - t0
    sched = TripletScheduler(ws, "a0", seed=seed)
    wall, cpu = [], []
    for _ in range(draws):
        t0, c0 = time.perf_counter(), time.process_time()
        question = sched.next()
        wall.append(1000 * (time.perf_counter() - t0))
        cpu.append(1000 * (time.process_time() - c0))
        sched.answer(question, "j")
    ws.store.close()
    return {"stored": stored, "insert s": insert_s, "wall median": float(np.median(wall)),
            "wall p95": float(np.percentile(wall, 95)), "wall max": max(wall), "cpu median": float(np.median(cpu)),
            "cpu p95": float(np.percentile(cpu, 95)), "cpu max": max(cpu)}


def growth(sizes: list[int], values: list[float]) -> float | None:
    """Slope of log value vs log N between the two largest sizes."""
    if len(sizes) < 2 or min(values[-2:]) <= 0:
        return None
    return math.log(values[-1] / values[-2]) / math.log(sizes[-1] / sizes[-2])


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.scale`` benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000], help="study sizes N (photos)")
    parser.add_argument("--full", action="store_true", help="add N = 10,000")
    cli.add_seed(parser)
    cli.add_device(parser)
    parser.add_argument("--scheduler", type=int, nargs=2, metavar=("N", "M"),
                        help="only the scheduler: N photos, M judgments stored")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of the result file scale.json")
    args = cli.parse_args(parser, argv)
    if args.scheduler:
        n, m = args.scheduler
        if n < 3 or m < 0:
            parser.error(f"--scheduler needs N ≥ 3 photos and M ≥ 0 judgments, got {n} {m}")
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp:
            r = scheduler_latency(n, m, Path(tmp), args.seed)
        print(f"{r['stored']:,} judgments over {n:,} photos stored in {r['insert s']:.1f} s (batched); "
              f"next(): wall median {r['wall median']:.1f} ms, p95 {r['wall p95']:.1f}, max {r['wall max']:.1f}; "
              f"CPU median {r['cpu median']:.1f} ms, p95 {r['cpu p95']:.1f}, max {r['cpu max']:.1f} "
              f"(load average before: {load:.1f})")
        return 0
    sizes = sorted(set(args.sizes + ([10_000] * args.full)))
    if sizes[0] < 20:
        parser.error(f"--sizes must be ≥ 20 (the feature sample is 17 photos), got {sizes[0]}")
    results: list[dict[str, Any]] = []
    loads: list[float] = []
    t_start = time.perf_counter()
    for n in sizes:
        loads.append(os.getloadavg()[0])
        with tempfile.TemporaryDirectory() as tmp:
            results.append(measure_size(n, Path(tmp), args.seed))
        print(f"N = {n}: done (load average before: {loads[-1]:.1f})", flush=True)
    columns = ["stage", *[f"N = {n:,}" for n in sizes], "growth exponent"]
    rows = [[stage, *[r[stage] for r in results], growth(sizes, [r[stage] for r in results])] for stage in STAGES]
    tables = [{"caption": "SYNTHETIC phantom studies of N photos (3N wounds, 5N expert + 100·N extra judgments); "
                          "wall times unless stated", "columns": columns, "rows": rows}]
    notes = ["Load average (1 min) before each size: " + ", ".join(f"N = {n:,}: {v:.1f}" for n, v in zip(sizes, loads))
             + f"; {os.cpu_count()} CPUs, torch CPU threads as each stage sets them (SOE: 1).",
             "Growth exponent: slope of log value vs log N between the two largest sizes (1 = linear).",
             "SOE s: the default gradient, through the n×n distance matrix up to 2,048 objects and per-triplet "
             "gathers above (a faster constant at small N, so its exponent across the switch overstates the "
             "growth); SOE s, per-triplet gradient: the same algorithm at every size."]
    print(render_tables(tables))
    print("\n".join(notes))
    path = write_result("scale", "How each part grows with the study (SYNTHETIC phantom studies)",
                        command_line("benchmarks.scale", argv), [args.seed], tables, notes=notes, synthetic=True,
                        seconds=time.perf_counter() - t_start, results_dir=args.results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
