"""Backup and restore of a whole workspace while annotators keep working.

``backup`` copies the store with SQLite's online backup API while holding the write lock (so the
label masks copied in the same moment match it), then the photos, truth and run folders, and
writes ``manifest.json`` with the sha256 of every file. ``restore`` checks every file against
the manifest and the database's integrity before touching anything, and refuses a corrupted or
incomplete backup with the name of the first bad file.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from annotations.fileio import write_json
from annotations.readers import DatasetError
from annotations.store import now
from annotations.workspace import DB_NAME, Workspace

MANIFEST = "manifest.json"
#: Folders of a workspace a backup holds (``cache/`` is rebuilt on demand).
FOLDERS = ("images", "masks", "truth", "runs")


class BackupError(DatasetError):
    """A backup that cannot be written or restored; the message names the file."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _empty_or_missing(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def backup(ws: Workspace, out: str | Path) -> dict[str, Any]:
    """Write a verified copy of ``ws`` to the new folder ``out``; returns counts and size."""
    out = Path(out).resolve()
    if not _empty_or_missing(out):
        raise BackupError(f"{out}: not empty; back up into a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with ws.store.transaction():  # writers wait: the store and the masks are one moment
            # A second connection reads the committed state (WAL readers pass the held write lock).
            source = sqlite3.connect(ws.store.path)
            dest = sqlite3.connect(staging / DB_NAME)
            try:
                source.backup(dest)
                dest.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
            finally:
                dest.close()
                source.close()
            if ws.masks_dir.is_dir():
                shutil.copytree(ws.masks_dir, staging / "masks", ignore=shutil.ignore_patterns(".*"))
            photos = {r[0]: r[1] for r in ws.store.db.execute("SELECT file, sha256 FROM images")}
        for name in ("images", "truth", "runs"):
            if (ws.root / name).is_dir():
                shutil.copytree(ws.root / name, staging / name, ignore=shutil.ignore_patterns(".*"))
        files = {}
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            rel = path.relative_to(staging).as_posix()
            files[rel] = {"sha256": _sha256(path), "size": path.stat().st_size}
        for file, sha in photos.items():
            got = files.get(f"images/{file}", {}).get("sha256")
            if got != sha:
                raise BackupError(f"images/{file}: changed or vanished during the backup (a re-import?); "
                                  "run the backup again")
        write_json(staging / MANIFEST, {"format": 1, "created": now(), "workspace": str(ws.root),
                                        "schema_version": ws.store.schema_version, "files": files})
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"out": str(out), "files": len(files), "bytes": sum(f["size"] for f in files.values()),
            "images": len(photos)}


def verify(src: str | Path) -> dict[str, Any]:
    """Check a backup folder against its manifest and the database's integrity; returns the
    manifest. Raises :class:`BackupError` naming the first problem."""
    src = Path(src)
    try:
        manifest = json.loads((src / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
    except FileNotFoundError:
        raise BackupError(f"{src}: no {MANIFEST}; not a TriDerm backup") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise BackupError(f"{src / MANIFEST}: unreadable ({err}); the backup is damaged") from None
    if DB_NAME not in files:
        raise BackupError(f"{src / MANIFEST}: lists no {DB_NAME}; the backup is damaged")
    for rel, entry in files.items():
        path = src / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise BackupError(f"{src / MANIFEST}: file {rel!r} points outside the backup")
        if not path.is_file() or path.is_symlink():
            raise BackupError(f"{path}: missing from the backup")
        if _sha256(path) != entry["sha256"]:
            raise BackupError(f"{path}: checksum differs from the manifest; the backup is corrupted")
    extra = [p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()
             and p.relative_to(src).as_posix() not in files and p.name != MANIFEST]
    if extra:
        raise BackupError(f"{src / extra[0]}: not in the manifest; the backup was altered")
    conn = sqlite3.connect(f"file:{src / DB_NAME}?mode=ro&immutable=1", uri=True)
    try:
        result = conn.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.DatabaseError as err:
        raise BackupError(f"{src / DB_NAME}: not a readable database ({err})") from None
    finally:
        conn.close()
    if result != "ok":
        raise BackupError(f"{src / DB_NAME}: integrity check failed ({result})")
    return manifest


def restore(src: str | Path, target: str | Path, force: bool = False) -> dict[str, Any]:
    """Verify the backup ``src``, then make ``target`` a copy of it. ``target`` must be empty
    unless ``force`` (then its store and data folders are replaced; stop the app and jobs first)."""
    src, target = Path(src).resolve(), Path(target).resolve()
    manifest = verify(src)
    if not _empty_or_missing(target) and not force:
        raise BackupError(f"{target}: not empty; restore into a new folder or give --force to replace it")
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".restore-", dir=target))
    try:
        for rel in manifest["files"]:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, staging / rel)
        old = staging / ".replaced"
        old.mkdir()
        moved = [name for name in (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", *FOLDERS)
                 if (target / name).exists()]
        try:
            for name in moved:
                os.replace(target / name, old / name)
            for name in (DB_NAME, *FOLDERS):
                if (staging / name).exists():
                    os.replace(staging / name, target / name)
        except BaseException:  # put the workspace back as it was
            for name in moved:
                if (old / name).exists():
                    if (target / name).is_dir():
                        shutil.rmtree(target / name)
                    os.replace(old / name, target / name)
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    ws = Workspace(target)
    counts = ws.store.counts()
    ws.store.close()
    return {"workspace": str(target), "files": len(manifest["files"]), "created": manifest.get("created"),
            **{k: counts[k] for k in ("images", "wounds", "expert_triplets")}}
