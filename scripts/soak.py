"""Soak test of the annotation store: concurrent annotators, a SIGKILL and re-imports at once.

    python scripts/soak.py [--annotators 8] [--answers 100] [--edit-every 10] [--photos 24]
                           [--reimports 5] [--workspace DIR] [--json OUT]

Builds a small real-kind dataset, imports it, then starts ``--annotators`` processes that each
answer ``--answers`` triplet questions and, every ``--edit-every`` answers, draw a new outline and
edit its description. Each process appends every acknowledged write to its own fsynced log. One
annotator is SIGKILLed halfway and restarted (it resumes from the store); meanwhile the dataset
(with a description changed each round) is re-imported ``--reimports`` times. At the end every
acknowledged judgment, outline and description is checked against the store and the masks.
Prints one summary line per check and exits 1 when anything was lost or duplicated.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from itertools import combinations
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from annotations.accounts import session
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset


def build_dataset(root: Path, photos: int, seed: int = 0) -> Path:
    """``photos`` photos, one imported wound each, with descriptions."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rows = ["image_id,wound_index,description"]
    for n in range(photos):
        name = f"p{n:03d}"
        Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)).save(root / "images" / f"{name}.png")
        mask = np.zeros((96, 128), np.uint8)
        mask[4:20, 4:24] = 1
        Image.fromarray(mask).save(root / "masks" / f"{name}.png")
        rows.append(f"{name},1,imported {n}")
    (root / "wounds.csv").write_text("\n".join(rows) + "\n")
    return root


def questions(image_ids: list[str], name: str, count: int) -> list[tuple[str, str, str]]:
    """The annotator's own ``count`` distinct questions (deterministic, so a restart resumes)."""
    combos = list(combinations(image_ids, 3))
    return random.Random(name).sample(combos, min(count, len(combos)))


def annotate(workspace: Path, name: str, answers: int, edit_every: int, log_path: Path) -> None:
    """One annotator process: answer, draw and describe, logging each acknowledged write."""
    ws = Workspace(workspace)
    ids = [r["image_id"] for r in ws.store.images()]
    rng = random.Random(f"{name}-{os.getpid()}")
    done = set()
    if log_path.exists():
        done = {tuple(e["key"]) for e in map(json.loads, log_path.read_text().splitlines()) if e["kind"] == "answer"}
    with log_path.open("a") as log:
        def write(entry: dict) -> None:
            log.write(json.dumps(entry) + "\n")
            log.flush()
            os.fsync(log.fileno())

        for n, (a, j, k) in enumerate(questions(ids, name, answers)):
            if (a, j, k) in done:
                continue
            choice = "jk"[zlib.crc32(f"{a}{j}{k}{name}".encode()) % 2]
            row = ws.store.add_triplet(a, j, k, choice, f"expert:{name}")
            write({"kind": "answer", "key": [a, j, k], "new": row is not None})
            if n % edit_every != edit_every - 1:
                continue
            image = rng.choice(ids)
            y, x = rng.randrange(24, 88), rng.randrange(28, 120)
            region = np.zeros((96, 128), bool)
            region[y:y + 8, x:x + 8] = True
            try:
                index = session.add_wound(ws, image, region, description=f"{name} drew", actor=name)
            except ValueError:  # the square lay entirely on other outlines
                continue
            wound = ws.store.wound(image, index)
            write({"kind": "outline", "image": image, "index": index, "area": wound["area"]})
            text = f"{name} note {n}"
            session.update_wound_text(ws, image, index, text, {"stage": n % 4}, actor=name)
            write({"kind": "description", "image": image, "index": index, "text": text})


def _spawn(args: argparse.Namespace, workspace: Path, name: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, __file__, "--workspace", str(workspace), "--child", name,
                             "--answers", str(args.answers), "--edit-every", str(args.edit_every),
                             "--log", str(log)], env=env)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def soak(args: argparse.Namespace, workspace: Path, scratch: Path) -> dict:
    """Run the soak on a fresh workspace: import a dataset, then the annotators' sessions; returns the record."""
    data = build_dataset(scratch / "dataset", args.photos)
    ws = Workspace(workspace)
    import_dataset(ws, data)
    logs = {f"ann{i}": scratch / f"ann{i}.log" for i in range(args.annotators)}
    start = time.perf_counter()
    procs = {name: _spawn(args, workspace, name, log) for name, log in logs.items()}
    victim, killed, restarted = "ann0", False, False
    reimports, import_seconds, conflicts = 0, [], 0
    expected_text = "imported 0"
    while any(p.poll() is None for p in procs.values()) or not restarted or reimports < args.reimports:
        if not killed and _lines(logs[victim]) >= args.answers // 2:
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            killed = _lines(logs[victim])
            procs[victim] = _spawn(args, workspace, victim, logs[victim])  # resumes from the store
            restarted = True
        if reimports < args.reimports and _lines(logs[f"ann{args.annotators - 1}"]) >= (
                reimports + 1) * args.answers // (args.reimports + 1):
            expected_text = f"round {reimports}"  # the dataset's first description changes
            lines = (data / "wounds.csv").read_text().splitlines()
            lines[1] = f"{lines[1].split(',')[0]},1,{expected_text}"
            (data / "wounds.csv").write_text("\n".join(lines) + "\n")
            t0 = time.perf_counter()
            summary = import_dataset(ws, data)
            import_seconds.append(time.perf_counter() - t0)
            conflicts += summary["merge"]["conflict"]
            reimports += 1
        time.sleep(0.05)
    elapsed = time.perf_counter() - start
    failed = {n: p.returncode for n, p in procs.items() if p.returncode != 0}
    return {"elapsed_s": round(elapsed, 2), "children_failed": failed, "killed": f"{victim} after {killed} logged writes",
            "reimports": reimports, "reimport_s": [round(t, 2) for t in import_seconds],
            "reimport_conflicts": conflicts, **check(Workspace(workspace), logs, args, expected_text)}


def check(ws: Workspace, logs: dict[str, Path], args: argparse.Namespace, expected_text: str) -> dict:
    """Compare every acknowledged write with the store and the masks."""
    store = ws.store
    ids = [r["image_id"] for r in store.images()]
    lost = Counter(dict.fromkeys(("judgments", "judgment revisions", "outlines", "outline pixels", "descriptions",
                                  "imported description"), 0))
    answers = duplicates = unacknowledged = 0
    acknowledged_outlines: dict[tuple[str, int], dict] = {}
    last_text: dict[tuple[str, int], str] = {}
    for name, log in logs.items():
        entries = [json.loads(line) for line in log.read_text().splitlines()]
        stored = [(t["anchor"], t["ref_j"], t["ref_k"]) for t in store.triplets(source=f"expert:{name}")]
        expected = set(questions(ids, name, args.answers))
        acked = {tuple(e["key"]) for e in entries if e["kind"] == "answer"}
        answers += len(stored)
        duplicates += len(stored) - len(set(stored))
        lost["judgments"] += len(acked - set(stored)) + len(expected - set(stored))
        inserts = [r for r in store.revisions("triplets") if r["actor"] == f"expert:{name}" and r["action"] == "insert"]
        lost["judgment revisions"] += abs(len(inserts) - len(stored))
        for e in entries:
            if e["kind"] == "outline":
                acknowledged_outlines[(e["image"], e["index"])] = e
            elif e["kind"] == "description":
                last_text[(e["image"], e["index"])] = e["text"]
    orphans = 0
    for image_id in ids:
        labels = ws.load_mask(image_id)
        rows = {w["wound_index"]: w for w in store.wounds(image_id)}
        present = {int(v) for v in np.unique(labels) if v > 0}
        orphans += len(present - set(rows))
        for index, w in rows.items():
            if (labels == index).sum() != w["area"]:
                lost["outline pixels"] += 1
            if index > 1 and (image_id, index) not in acknowledged_outlines:
                unacknowledged += 1  # drawn by the killed process just before its death
    for (image_id, index), e in acknowledged_outlines.items():
        w = store.wound(image_id, index)
        if w is None or w["area"] != e["area"]:
            lost["outlines"] += 1
        elif (image_id, index) in last_text and w["description"] != last_text[(image_id, index)]:
            lost["descriptions"] += 1
    first = store.wound(ids[0], 1)
    lost["imported description"] += int(first is None or first["description"] != expected_text)
    return {"judgments": answers, "judgments_expected": args.annotators * args.answers,
            "duplicated_judgments": duplicates, "outlines_acknowledged": len(acknowledged_outlines),
            "descriptions_acknowledged": len(last_text), "unacknowledged_outlines_kept": unacknowledged,
            "orphan_mask_labels": orphans, "lost": dict(lost), "lost_total": sum(lost.values())}


def main(argv: list[str] | None = None) -> int:
    """The soak test's entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--annotators", type=int, default=8)
    parser.add_argument("--answers", type=int, default=100, help="answers per annotator")
    parser.add_argument("--edit-every", type=int, default=10, help="an outline + description edit every N answers")
    parser.add_argument("--photos", type=int, default=24)
    parser.add_argument("--reimports", type=int, default=5)
    parser.add_argument("--workspace", default=None, help="workspace folder (default: a new temporary one)")
    parser.add_argument("--json", default=None, help="also write the summary here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--log", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        annotate(Path(args.workspace), args.child, args.answers, args.edit_every, Path(args.log))
        return 0
    with tempfile.TemporaryDirectory(prefix="triderm-soak-") as tmp:
        workspace = Path(args.workspace) if args.workspace else Path(tmp) / "ws"
        summary = soak(args, workspace, Path(tmp))
    for key, value in summary.items():
        print(f"{key}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    ok = summary["lost_total"] == 0 and summary["duplicated_judgments"] == 0 and not summary["children_failed"]
    ok = ok and summary["judgments"] == summary["judgments_expected"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
