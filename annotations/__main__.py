"""``python -m annotations <command>``: dataset import/export, revision history, privacy, backup,
accounts (``users``).

Each subcommand is one function taking the parsed arguments; :data:`COMMANDS` maps names to
(help, add-arguments, run) so new subcommands slot in beside the others.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable
from typing import Any

from annotations.accounts import accounts
from annotations.accounts.privacy import erase_patient
from annotations.infra.backup import backup, restore
from annotations.infra.workspace import DEFAULT_MIN_WOUND_AREA, Workspace, resolve_workspace
from annotations.io.convert import OVERLAP_RULES, SOURCES, convert
from annotations.io.dataset import PREFER, import_dataset
from annotations.io.exports import EXPORTS, export
from annotations.io.formats import LS_LOCAL_FILES
from annotations.io.readers import DatasetError, clear_error
from annotations.store.history import history_lines, restore_revision
from annotations.store.rows import StoreError


def _import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="dataset folder (images/, masks/, wounds.csv, …)")
    p.add_argument("--prefer", choices=PREFER, default=None,
                   help="resolve rows changed both in the app and in the dataset since the last import "
                        "(default: report them and import nothing)")
    p.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    p.add_argument("--prune", action="store_true",
                   help="delete rows an earlier import brought that the dataset no longer has "
                        "(outlines drawn in the app are never deleted)")
    p.add_argument("--study-ids", metavar="CSV", default=None,
                   help="replace photo names by study ids; the original→study id mapping is kept in "
                        "this CSV (outside the workspace's images/)")
    p.add_argument("--keep-metadata", action="store_true",
                   help="keep the photos' EXIF/XMP/IPTC metadata (GPS, dates, camera serials); "
                        "by default it is stripped on import")


def _import(args: argparse.Namespace) -> dict[str, Any]:
    return import_dataset(Workspace(args.workspace), args.dir, prefer=args.prefer, dry_run=args.dry_run,
                          prune=args.prune, study_ids=args.study_ids, keep_metadata=args.keep_metadata)


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="output folder (new or empty)")
    p.add_argument("--format", choices=tuple(EXPORTS), default="dataset",
                   help="what to write (default: a dataset folder that imports back losslessly; "
                        "coco, coco-rle, geojson, labelstudio: the outlines only, for other annotation tools)")
    p.add_argument("--force", action="store_true", help="replace the files of a non-empty folder")
    p.add_argument("--image-prefix", default=LS_LOCAL_FILES,
                   help="labelstudio: each photo's URL is this + its file name (default: %(default)s: Label "
                        "Studio's local files, LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT the workspace folder, the "
                        "project's local storage its images/)")


def _export(args: argparse.Namespace) -> dict[str, Any]:
    return export(Workspace(args.workspace), args.out, args.format, force=args.force,
                  image_prefix=args.image_prefix)


def _history_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--entity", choices=("wounds", "images", "patients", "triplets"), default=None,
                   help="only this table")
    p.add_argument("--key", default=None,
                   help='only this row: its id, or its key as JSON (e.g. \'{"image_id": "a", "wound_index": 1}\')')


def _history(args: argparse.Namespace) -> list[str]:
    key = args.key
    if key is not None:
        with contextlib.suppress(json.JSONDecodeError):  # else a plain id (photo or patient)
            key = json.loads(key)
    return history_lines(Workspace(args.workspace), args.entity, key)


def _restore_revision_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", type=int, help="revision number (from `history`); its change is undone")
    p.add_argument("--actor", default="restore", help="who restores (recorded in the history)")


def _restore_revision(args: argparse.Namespace) -> str:
    return restore_revision(Workspace(args.workspace), args.id, args.actor)


def _erase_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("patient_id", metavar="ID", help="patient id")
    p.add_argument("--study-ids", metavar="CSV", default=None, help="also drop the patient's rows from this mapping")


def _erase(args: argparse.Namespace) -> dict[str, Any]:
    return erase_patient(Workspace(args.workspace), args.patient_id, args.study_ids)


def _backup_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="new backup folder")


def _backup(args: argparse.Namespace) -> dict[str, Any]:
    return backup(Workspace(args.workspace), args.out)


def _restore_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", metavar="IN", help="backup folder (from `backup`)")
    p.add_argument("--force", action="store_true",
                   help="replace a non-empty workspace (refused while the app or a job holds it)")


def _restore(args: argparse.Namespace) -> dict[str, Any]:
    return restore(args.src, resolve_workspace(args.workspace), force=args.force)


def _convert_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="source", choices=SOURCES, required=True, help="the tool's export format")
    p.add_argument("src", metavar="IN", help="the export: a file, or the folder holding it")
    p.add_argument("out", metavar="OUT", help="new (or empty) dataset folder to write")
    p.add_argument("--images", default=None,
                   help="folder of the photos (default: IN's folder, then its images/ subfolder)")
    p.add_argument("--name", default=None, help="dataset name (default: IN's folder name)")
    p.add_argument("--synthetic", action="store_true", help="mark the dataset SYNTHETIC (phantom data)")
    p.add_argument("--overlap", choices=OVERLAP_RULES, default=None,
                   help="who gets a pixel two outlines cover: z-order (CVAT's z_order, then the later outline; the "
                        "default for cvat), later-wins (the default otherwise) or refuse")
    p.add_argument("--min-area", type=int, default=DEFAULT_MIN_WOUND_AREA,
                   help="drop wounds under this many pixels, as import does (default: the workspace default, "
                        f"{DEFAULT_MIN_WOUND_AREA}; use your workspace's min_wound_area if you changed it)")


def _convert(args: argparse.Namespace) -> dict[str, Any]:
    result = convert(args.source, args.src, args.out, images=args.images, name=args.name, synthetic=args.synthetic,
                     overlap=args.overlap, min_area=args.min_area)
    return {**result, "next": f"python -m annotations import {args.out}"}


#: name → (help, add its arguments, run it; the result is printed as JSON or lines).
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], Any]]] = {
    "import": ("validate a dataset folder, then merge it into the workspace", _import_args, _import),
    "export": ("write the workspace as a dataset folder", _export_args, _export),
    "convert": ("turn a COCO, GeoJSON, Label Studio or CVAT export into a dataset folder (then import it)",
                _convert_args, _convert),
    "history": ("print the revision history (who changed what, when, old → new)", _history_args, _history),
    "restore-revision": ("undo one recorded change (restore the value it replaced)", _restore_revision_args,
                         _restore_revision),
    "erase-patient": ("remove a patient's photos, masks, wounds, judgments and their revisions", _erase_args,
                      _erase),
    "backup": ("write a verified copy of the workspace (safe while annotators work)", _backup_args, _backup),
    "restore": ("verify a backup, then restore it as the workspace", _restore_args, _restore),
}


def main(argv: list[str] | None = None) -> int:
    """The ``python -m annotations`` command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m annotations",
                                     description="TriDerm datasets, revision history, privacy, backups and accounts.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (text, add_arguments, _) in COMMANDS.items():
        p = sub.add_parser(name, help=text, description=text)
        add_arguments(p)
        p.add_argument("--workspace", default=None,
                       help="workspace folder (default: $TRIDERM_WORKSPACE or ./workspace)")
    accounts.add_cli(sub.add_parser("users", help="manage accounts (first run: users add --role admin NAME)"))
    args = parser.parse_args(argv)
    if args.command == "users":
        return accounts.run_cli(Workspace(args.workspace).store, args)
    try:
        result = COMMANDS[args.command][2](args)
    except DatasetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (OSError, StoreError) as err:  # a full disk, a store locked too long: one line, not a traceback
        clear = clear_error(err, resolve_workspace(args.workspace).resolve(), f"{args.command} did not finish")
        if clear is None:
            raise
        print(f"error: {clear}", file=sys.stderr)
        return 2
    if isinstance(result, list):
        print("\n".join(result))
    elif isinstance(result, str):
        print(result)
    else:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
