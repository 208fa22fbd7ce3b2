"""``python -m annotations import DIR`` / ``export OUT`` / ``users add --role admin NAME``."""
from __future__ import annotations

import argparse
import json
import sys

from annotations import accounts
from annotations.dataset import export_dataset, import_dataset
from annotations.formats import FORMATS, export_outlines
from annotations.readers import DatasetError
from annotations.workspace import Workspace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m annotations",
                                     description="Import or export a TriDerm dataset folder; manage accounts.")
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="validate, then import a dataset folder (idempotent)")
    imp.add_argument("dir", help="dataset folder (images/, masks/, wounds.csv, …)")
    exp = sub.add_parser("export", help="write the workspace as a dataset folder")
    exp.add_argument("out", help="output folder")
    exp.add_argument("--format", default="dataset", choices=("dataset", *FORMATS),
                     help="dataset folder (default), or the outlines only: COCO polygons/RLE or GeoJSON")
    for p in (imp, exp):
        p.add_argument("--workspace", default=None,
                       help="workspace folder (default: $TRIDERM_WORKSPACE or ./workspace)")
    accounts.add_cli(sub.add_parser("users", help="manage accounts (first run: users add --role admin NAME)"))
    args = parser.parse_args(argv)
    ws = Workspace(args.workspace)
    if args.command == "users":
        return accounts.run_cli(ws.store, args)
    try:
        if args.command == "import":
            summary = import_dataset(ws, args.dir)
        elif args.format == "dataset":
            summary = export_dataset(ws, args.out)
        else:
            summary = export_outlines(ws, args.out, args.format)
    except DatasetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
