"""Serve the wound segmenter as a Label Studio ML backend: TriDerm's outline suggestions inside Label Studio.

    python -m core.ml_backend --port 9090 [--host 127.0.0.1] [--document-root DIR]
                              [--label-studio-url URL] [--api-key KEY] [--workspace W] [--device auto|cpu|cuda]

(also ``triderm ml-backend …``). In Label Studio: the project's Settings → Model → Connect model, URL
``http://127.0.0.1:9090``; then "Retrieve predictions" on the tasks, or the suggestions appear as tasks
open. Each wound the segmenter finds becomes a polygon (``PolygonLabels``) or brush (``BrushLabels``)
region of the project's labeling configuration (:mod:`core.segmentation.labelstudio`). The segmenter is
the one shipped with the package, or with ``--workspace`` that workspace's latest trained one (and its
minimum wound area).

Photos: ``/data/local-files/?d=…`` URLs are read below ``--document-root`` (Label Studio's
``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT``); uploads and other Label Studio URLs are fetched from
``--label-studio-url`` with ``--api-key`` (default ``$LABEL_STUDIO_API_KEY``; a legacy token or a personal
access token). Label Studio (1.23) refuses a backend on a local address unless it runs with
``LABEL_STUDIO_ML_BLOCK_LOCAL_IP=false`` and ``LABEL_STUDIO_SSRF_PROTECTION_ENABLED=false`` (it checks the
webhook it adds to the backend too). The server has no authentication: keep it on the loopback (the
default) or a trusted network.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from annotations.infra.workspace import DEFAULT_MIN_WOUND_AREA, Workspace
from core import cli
from core.runtime import user_errors


def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.ml_backend`` job: serve until interrupted; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m core.ml_backend", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9090, help="port to listen on (default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, the loopback)")
    parser.add_argument("--document-root", type=Path, default=None,
                        help="Label Studio's local-files document root: /data/local-files/?d=… photos are read below it")
    parser.add_argument("--label-studio-url", default=None,
                        help="Label Studio's address (e.g. http://127.0.0.1:8080), to fetch uploaded photos")
    parser.add_argument("--api-key", default=os.environ.get("LABEL_STUDIO_API_KEY"),
                        help="Label Studio API key (default: $LABEL_STUDIO_API_KEY)")
    cli.add_workspace(parser, help="use this workspace's latest trained segmenter and minimum wound area "
                                   "(default: the segmenter shipped with the package)")
    cli.add_device(parser)
    args = cli.parse_args(parser, argv)
    from core.segmentation.labelstudio import Backend, PhotoSource, make_server
    from core.segmentation.model import load_default, load_segmenter

    with user_errors(parser, ValueError, OSError):  # SegmenterError is a ValueError; a taken port an OSError
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port must lie between 0 and 65535 (got {args.port})")
        if args.document_root is not None and not args.document_root.is_dir():
            raise ValueError(f"--document-root {args.document_root}: not a folder")
        if args.workspace is None:
            segmenter, min_area = load_default(args.device), DEFAULT_MIN_WOUND_AREA
        else:
            ws = Workspace(args.workspace)
            segmenter, min_area = load_segmenter(ws, args.device), ws.min_wound_area
        photos = PhotoSource(args.document_root, args.label_studio_url, args.api_key)
        server = make_server(Backend(segmenter, min_area, photos), args.host, args.port)
    print(f"Label Studio ML backend ({segmenter.source} segmenter) on http://{args.host}:{server.server_address[1]}",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
