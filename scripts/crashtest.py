"""Crash test: SIGKILL at every write step of import, re-import, restore, erase-patient and backup.

    python scripts/crashtest.py [--ops import,reimport,restore,erase,backup] [--photos 4] [--json OUT]

Each operation runs as ``python -m annotations …`` in a forked process with ``TRIDERM_CRASH_AT=N``
(:func:`annotations.infra.fileio.write_step`: the process kills itself at its N-th rename or commit), for
N = 1, 2, … until a run completes without being killed. After each run the workspace is opened
again (which replays or rolls back an interrupted swap) and checked: ``PRAGMA integrity_check``
ok, every stored photo's bytes match its sha256, no photo file without its row, no mask label
without its wound row (nor a wound row without pixels), no swap folder left, and the state equals
either the state before the operation or the one after it (a backup: the workspace unchanged and
the backup folder absent or verified). Prints the steps tried and the inconsistent end states per
operation; exits 1 when any end state is inconsistent.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from annotations.__main__ import main as cli
from annotations.infra import fileio, journal
from annotations.infra.backup import BackupError, backup, verify
from annotations.infra.fileio import CRASH_ENV
from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

OPS = ("import", "reimport", "restore", "erase", "backup")


def build_dataset(root: Path, photos: int, version: int) -> Path:
    """``photos`` photos of two patients, two wounds each, descriptions and judgments; ``version`` 2
    changes half the photos' bytes, every description and one patient link, and adds a photo."""
    rng = np.random.default_rng(version)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    names = [f"ph{n}" for n in range(photos + (version == 2))]
    wounds, links = ["image_id,wound_index,description"], ["image_id,patient_id"]
    for n, name in enumerate(names):
        seed = version if n % 2 == 0 else 1
        pixels = np.random.default_rng([seed, n]).integers(0, 255, (24, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "images" / f"{name}.png")
        mask = np.zeros((24, 32), np.uint8)
        mask[2:8, 2:10] = 1
        mask[12:20, 14:26 - int(rng.integers(0, 4))] = 2
        Image.fromarray(mask).save(root / "masks" / f"{name}.png")
        wounds += [f"{name},1,wound one v{version}", f"{name},2,wound two of {name}"]
        links.append(f"{name},{'pA' if n % 2 == 0 or (version == 2 and n == 1) else 'pB'}")
    (root / "wounds.csv").write_text("\n".join(wounds) + "\n")
    (root / "images.csv").write_text("\n".join(links) + "\n")
    (root / "patients.csv").write_text("patient_id,age\npA,11\npB,12\n")
    (root / "triplets.csv").write_text("anchor,ref_j,ref_k,choice,annotator\n"
                                       f"{names[0]},{names[1]},{names[2]},j,ann\n")
    return root


def state(ws: Workspace) -> dict[str, Any]:
    """What an operation changes, without timestamps: rows, photos' bytes, label maps."""
    s = ws.store
    return {
        "patients": [(p["patient_id"], p["metadata"]) for p in s.patients()],
        "images": [(i["image_id"], i["file"], i["sha256"], i["patient_id"], i["metadata"]) for i in s.images()],
        "wounds": [(w["image_id"], w["wound_index"], w["description"], w["metadata"]) for w in s.wounds()],
        "triplets": sorted((t["anchor"], t["ref_j"], t["ref_k"], t["choice"], t["source"], t["rep"])
                           for t in s.triplets()),
        "photos": sorted(p.name for p in ws.images_dir.iterdir()),
        "masks": {i["image_id"]: hashlib.sha256(ws.load_mask(i["image_id"]).tobytes()).hexdigest()
                  for i in s.images()},
    }


def problems(ws: Workspace) -> list[str]:
    """The inconsistencies of an opened workspace (empty: consistent)."""
    found = []
    if (check := ws.store.db.execute("PRAGMA integrity_check").fetchone()[0]) != "ok":
        found.append(f"integrity_check: {check}")
    files = set()
    for img in ws.store.images():
        path = ws.images_dir / img["file"]
        files.add(img["file"])
        if not path.is_file():
            found.append(f"{img['file']}: missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != img["sha256"]:
            found.append(f"{img['file']}: bytes differ from the stored sha256")
        mask = ws.mask_path(img["image_id"])
        labels = set(np.unique(np.asarray(Image.open(mask))).tolist()) - {0} if mask.exists() else set()
        rows = {w["wound_index"] for w in ws.store.wounds(img["image_id"])}
        if labels - rows:
            found.append(f"{mask.name}: labels {sorted(labels - rows)} without a wound row")
        if rows - labels:
            found.append(f"{img['image_id']}: wound rows {sorted(rows - labels)} without pixels")
    stray = sorted(p.name for p in ws.images_dir.iterdir()) if ws.images_dir.is_dir() else []
    found += [f"images/{name}: a photo without its row" for name in stray if name not in files]
    found += [f"{p.name}: swap folder left" for p in journal.pending(ws.root)]
    return found


class Case:
    """One operation on a fresh copy of a prepared workspace: its CLI arguments and end states."""

    def __init__(self, op: str, base: Path, template: Path, args: list[str]) -> None:
        self.op, self.base, self.template, self.args = op, base, template, args

    def fresh(self, at: Path) -> Path:
        """A fresh copy of the prepared workspace under ``at``; returns its path."""
        if at.exists():
            shutil.rmtree(at)
        at.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(self.template, at / "ws", symlinks=True)
        return at / "ws"

    def run(self, at: Path, crash_at: int | None) -> tuple[int, Path]:
        """Run the command in a forked child (the modules are loaded once); its exit code (-9: killed)."""
        root = self.fresh(at)
        args = [a.replace("{ws}", str(root)).replace("{out}", str(at / "out")) for a in self.args]
        err = at / "stderr.txt"
        pid = os.fork()
        if pid == 0:  # the child: count its own steps from 1
            code = 3
            try:
                fd = os.open(err, os.O_WRONLY | os.O_CREAT, 0o600)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                os.dup2(fd, 2)
                fileio._steps = 0
                if crash_at is not None:
                    os.environ[CRASH_ENV] = str(crash_at)
                code = cli([*args, "--workspace", str(root)])
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code not in (0, -9):
            raise RuntimeError(f"{self.op} failed (exit {code}): {err.read_text().strip()[-400:]}")
        return code, root


def prepare(work: Path, photos: int) -> dict[str, Case]:
    """The datasets, the prepared workspaces and a backup; one :class:`Case` per operation."""
    ds1, ds2 = build_dataset(work / "ds1", photos, 1), build_dataset(work / "ds2", photos, 2)
    empty = work / "empty"
    Workspace(empty).store.close()
    one = Workspace(work / "one")
    import_dataset(one, ds1)
    two = Workspace(work / "two")
    import_dataset(two, ds2)
    backup(two, work / "bk2")
    for ws in (one, two):
        ws.store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        ws.store.close()
    return {"import": Case("import", empty, empty, ["import", str(ds1)]),
            "reimport": Case("reimport", one.root, one.root, ["import", str(ds2), "--prefer", "file"]),
            "restore": Case("restore", one.root, one.root, ["restore", str(work / "bk2"), "--force"]),
            "erase": Case("erase", one.root, one.root, ["erase-patient", "pA"]),
            "backup": Case("backup", one.root, one.root, ["backup", "{out}"])}


def check(case: Case, root: Path, out: Path, before: dict, after: dict) -> list[str]:
    """Open the workspace after a (killed) run; its problems, or the state matching neither end."""
    ws = Workspace(root)
    try:
        found = problems(ws)
        now = state(ws)
        if now not in (before, after):
            diff = [k for k in now if now[k] != after[k]]
            found.append(f"state is neither the before nor the after ({', '.join(diff)} differ from the after)")
        if case.op == "backup" and out.exists():
            try:
                verify(out)
            except BackupError as err:
                found.append(f"backup folder left unverifiable: {err}")
    finally:
        ws.store.close()
    return found


def crashtest(ops: tuple[str, ...], photos: int, work: Path, max_steps: int = 500) -> dict[str, Any]:
    """Run every operation killed at each write step; per op the steps tried and the inconsistencies."""
    cases = prepare(work, photos)
    report: dict[str, Any] = {}
    for op in ops:
        case = cases[op]
        ws = Workspace(case.template)
        before = state(ws)
        ws.store.close()
        code, root = case.run(work / op / "clean", None)
        ws = Workspace(root)
        after = state(ws)
        ws.store.close()
        tried, bad = 0, []
        bar = tqdm(desc=op, unit="kill", disable=None)
        for n in range(1, max_steps + 1):
            code, root = case.run(work / op / "kill", n)
            tried += 1
            bar.update()
            found = check(case, root, work / op / "kill" / "out", before, after)
            bad += [f"step {n}: {f}" for f in found]
            if code == 0:  # completed without reaching step n: every step was tried
                break
        bar.close()
        report[op] = {"steps": tried, "inconsistent": bad}
    return report


def main(argv: list[str] | None = None) -> int:
    """The crash test's entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    parser.add_argument("--photos", type=int, default=4, help="photos in the dataset (≥ 3)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    ops = tuple(o for o in args.ops.split(",") if o)
    unknown = [o for o in ops if o not in OPS]
    if unknown or args.photos < 3:
        parser.error(f"unknown op(s) {unknown}" if unknown else "--photos must be at least 3")
    with tempfile.TemporaryDirectory(prefix="triderm-crashtest-") as tmp:
        report = crashtest(ops, args.photos, Path(tmp))
    total = sum(len(r["inconsistent"]) for r in report.values())
    for op, r in report.items():
        print(f"{op}: {r['steps']} kill points tried, {len(r['inconsistent'])} inconsistent")
        for line in r["inconsistent"]:
            print(f"  {line}")
    print(f"total: {sum(r['steps'] for r in report.values())} kill points, {total} inconsistent")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
