"""Backup and restore of a whole workspace while annotators keep working.

``backup`` copies the store with SQLite's online backup API while holding the write lock (so the
label masks copied in the same moment match it), then the photos, truth and run folders (never
following a link), and writes ``manifest.json`` with the sha256 of every file. A backup is registered
in the store when it starts (``backups_in_progress``) and listed in ``backups`` when it ends, so
erase-patient names every backup that holds or may come to hold the patient. ``restore`` checks
the manifest, every file, the database's integrity and schema (only TriDerm's own tables and
indexes: no trigger or view) before touching anything, refuses a corrupted, altered or
incomplete backup with the name of the first bad file, and swaps the workspace in through a
journal (:mod:`annotations.infra.journal`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from annotations.infra import holders, jobs
from annotations.infra.fileio import LinkError, copy_file, copy_tree, replace, write_json
from annotations.infra.journal import Swap
from annotations.infra.workspace import DB_NAME, Workspace
from annotations.io.readers import DatasetError, clear_error
from annotations.store.rows import now
from annotations.store.snapshots import UnreadableDatabase, copy_store, examine, product_schema
from annotations.store.store import MIGRATIONS

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


def _copy_folder(src: Path, dst: Path) -> None:
    """Copy a workspace folder without following links (hidden staging files left out)."""
    try:
        copy_tree(src, dst, skip_hidden=True)
    except LinkError as err:
        raise BackupError(f"{err.filename}: {err.strerror}; remove the link and back up again") from None


def backup(ws: Workspace, out: str | Path) -> dict[str, Any]:
    """Write a verified copy of ``ws`` to the new folder ``out``; returns counts and size."""
    out = Path(out).resolve()
    if not _empty_or_missing(out):
        raise BackupError(f"{out}: not empty; back up into a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    pid, created = jobs.process_identity()
    entry = {"out": str(out), "staging": str(staging), "pid": pid, "create_time": created, "host": jobs.hostname(),
             "started": now()}
    _in_progress(ws, add=entry)  # registered before the first byte is copied: erase-patient sees it
    finished = False
    try:
        with ws.store.transaction():  # writers wait: the store and the masks are one moment
            copy_store(ws.store.path, staging / DB_NAME, without_meta=IN_PROGRESS)  # the copy is running no backup
            if ws.masks_dir.is_dir():
                _copy_folder(ws.masks_dir, staging / "masks")
            photos = ws.store.photo_checksums()
        for name in ("images", "truth", "runs"):
            if (ws.root / name).is_dir():
                _copy_folder(ws.root / name, staging / name)
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
        replace(staging, out)
        finished = True
    except OSError as err:
        clear = clear_error(err, out, "no backup was written")
        if clear is None:
            raise
        raise clear from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not finished:
            _in_progress(ws, remove=entry)  # a failed backup holds nothing
    with ws.store.transaction():  # erase-patient lists the backups it cannot reach
        ws.store.set_meta("backups", sorted({*ws.store.get_meta("backups", []), str(out)}))
        _in_progress(ws, remove=entry)
    return {"out": str(out), "files": len(files), "bytes": sum(f["size"] for f in files.values()),
            "images": len(photos)}


#: Store meta key of the backups started and not yet finished (one entry per backup, with its process).
IN_PROGRESS = "backups_in_progress"


def _in_progress(ws: Workspace, add: dict[str, Any] | None = None, remove: dict[str, Any] | None = None) -> None:
    with ws.store.transaction():
        entries = [e for e in ws.store.get_meta(IN_PROGRESS, []) if e != remove]
        ws.store.set_meta(IN_PROGRESS, entries + ([add] if add else []))


def backups_in_progress(ws: Workspace) -> list[dict[str, Any]]:
    """The backups started and not finished that may hold data: their process runs (this host: pid and
    create time; another host: always counted) or their staging folder is still there."""
    return [e for e in ws.store.get_meta(IN_PROGRESS, [])
            if (e.get("host") != jobs.hostname() or jobs.process_alive(e.get("pid"), e.get("create_time"))
                or (e.get("staging") and Path(e["staging"]).is_dir()))]


def _manifest(src: Path) -> dict[str, dict[str, Any]]:
    """The files a backup's manifest lists, checked for shape and place; raises :class:`BackupError`."""
    path = src / MANIFEST
    if not os.path.lexists(path):
        raise BackupError(f"{src}: no {MANIFEST}; not a TriDerm backup")
    try:
        if path.is_symlink() or not path.is_file():
            raise BackupError(f"{path}: not a regular file (a link?); the backup was altered")
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise BackupError(f"{path}: unreadable ({err}); the backup is damaged") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(
            isinstance(rel, str) and isinstance(e, dict) and isinstance(e.get("sha256"), str)
            and isinstance(e.get("size"), int) for rel, e in files.items()):
        raise BackupError(f"{path}: malformed (expected {{\"files\": {{path: {{\"sha256\", \"size\"}}}}}}); "
                          "the backup is damaged")
    if DB_NAME not in files:
        raise BackupError(f"{path}: lists no {DB_NAME}; the backup is damaged")
    for rel in files:
        parts = Path(rel).parts
        if not parts or ".." in parts or Path(rel).is_absolute() or rel == MANIFEST or \
                (parts[0] not in FOLDERS and rel != DB_NAME) or (parts[0] in FOLDERS and len(parts) < 2):
            raise BackupError(f"{path}: file {rel!r} is not a workspace file inside the backup")
    return files


def _no_links(src: Path) -> None:
    """Refuse a backup folder holding a symbolic link (or a device, FIFO, socket) anywhere."""
    for dirpath, dirs, names in os.walk(src):
        for name in dirs + names:
            mode = os.lstat(os.path.join(dirpath, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise BackupError(f"{Path(dirpath, name)}: a symbolic link or special file in the backup; "
                                  "links are never followed (the backup was altered)")


def _check_database(path: Path) -> None:
    """The staged store opens, passes ``integrity_check``, has a schema version this TriDerm knows
    and only its schema objects (no trigger, view or table of anyone else)."""
    try:
        result, version, objects = examine(path)
    except UnreadableDatabase as err:
        raise BackupError(f"{path.name}: not a readable database ({err}); the backup is damaged") from None
    if result != "ok":
        raise BackupError(f"{path.name}: integrity check failed ({result})")
    if not 1 <= version <= len(MIGRATIONS):
        raise BackupError(f"{path.name}: schema version {version}, this TriDerm Studio reads 1 to {len(MIGRATIONS)}"
                          + ("; restore it with a newer TriDerm Studio" if version > len(MIGRATIONS) else ""))
    extra = sorted(objects - product_schema(version), key=lambda o: (o[0], o[1]))
    if extra:
        raise BackupError(f"{path.name}: holds a {extra[0][0]} {extra[0][1]!r} that TriDerm does not make; "
                          "the backup was altered, it is not restored")
    if len(objects) != len(product_schema(version)):
        raise BackupError(f"{path.name}: lacks tables of schema version {version}; the backup is damaged")


def verify(src: str | Path) -> dict[str, Any]:
    """Check a backup folder against its manifest, without links, and its database (opens, its
    integrity, its schema); returns the manifest. Raises :class:`BackupError` naming the first problem."""
    src = Path(src)
    files = _manifest(src)
    _no_links(src)
    for rel, entry in files.items():
        path = src / rel
        if not path.is_file():
            raise BackupError(f"{path}: missing from the backup")
        if _sha256(path) != entry["sha256"]:
            raise BackupError(f"{path}: checksum differs from the manifest; the backup is corrupted")
    extra = [p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()
             and p.relative_to(src).as_posix() not in files and p.name != MANIFEST]
    if extra:
        raise BackupError(f"{src / extra[0]}: not in the manifest; the backup was altered")
    _check_database(src / DB_NAME)
    return json.loads((src / MANIFEST).read_text(encoding="utf-8"))


def restore(src: str | Path, target: str | Path, force: bool = False) -> dict[str, Any]:
    """Verify the backup ``src``, then make ``target`` a copy of it. ``target`` must be empty
    unless ``force`` (then its store and data folders are replaced). Any other live process holding
    ``target`` (the app, a job: :mod:`annotations.infra.holders`) is refused, naming it, ``force`` or not.

    Each file is copied without following links into a side folder inside ``target`` and checked
    there (checksum, database, schema): what is swapped in is exactly what was checked. The swap is
    journalled (:mod:`annotations.infra.journal`): the old workspace is kept aside until the new one
    opens, and a restore killed midway is undone when the workspace is next opened."""
    src, target = Path(src).resolve(), Path(target).resolve()
    manifest = verify(src)
    held = holders.live(target)
    if held:
        raise BackupError(f"{target}: in use by {'; '.join(map(holders.describe, held))}; stop the app and jobs "
                          "first (restore never replaces a workspace in use, --force included)")
    files = manifest["files"]
    if not _empty_or_missing(target) and not force:
        raise BackupError(f"{target}: not empty; restore into a new folder or give --force to replace it")
    target.mkdir(parents=True, exist_ok=True)
    swap = Swap(target, "restore")
    new = swap.dir / "new"
    try:
        for rel, entry in files.items():
            (new / rel).parent.mkdir(parents=True, exist_ok=True)
            try:
                sha = copy_file(src / rel, new / rel)
            except LinkError as err:
                raise BackupError(f"{err.filename}: {err.strerror} (the backup was altered)") from None
            if sha != entry["sha256"]:
                raise BackupError(f"{src / rel}: changed while it was restored; run the restore again")
        _check_database(new / DB_NAME)
        names = (f"{DB_NAME}-wal", f"{DB_NAME}-shm", DB_NAME, *FOLDERS)
        swap.plan([(new / name if (new / name).exists() else None, target / name) for name in names],
                  commit="marker")
        try:
            swap.forward()
            ws = Workspace(target)
            counts = ws.store.counts()
            ws.store.close()
        except BaseException:
            swap.backward()  # the old workspace comes back as it was
            swap.done()
            raise
        swap.mark_committed()
        swap.done()
    except OSError as err:
        clear = clear_error(err, target, "the workspace was not changed")
        if clear is None:
            raise
        raise clear from None
    finally:
        swap.close()
    return {"workspace": str(target), "files": len(files), "created": manifest.get("created"),
            **{k: counts[k] for k in ("images", "wounds", "expert_triplets")}}
