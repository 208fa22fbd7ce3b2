"""Store a vision run's token maps (where on each photo its embedding comes from) for the Explore page.

The training job writes them at its end; this job makes them for a run trained before that
(:mod:`core.vision.token_maps`): a fine-tune run's token contributions, a TriDerm-V run's attention. It runs the
run's tuned tail once per photo on the default device (seconds on a CPU), so it takes no ``--device``.

    python -m core.token_maps RUN [--workspace W]
"""
from __future__ import annotations

import argparse

from annotations.store import runs
from core import cli
from core.runtime import open_workspace, user_errors


def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.token_maps`` job; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m core.token_maps", description=__doc__.splitlines()[0])
    cli.add_workspace(parser)
    parser.add_argument("run", type=int, metavar="RUN", help="run id (a vision-finetune or vision-triderm run)")
    args = cli.parse_args(parser, argv)
    from core.vision.token_maps import write_token_maps  # torch: after the arguments (a fast --help)

    ws = open_workspace(args.workspace, parser)
    with user_errors(parser, ValueError, KeyError):
        runs.finished(ws, args.run)
        path = write_token_maps(ws, args.run, progress=True)
    print(f"token maps of run {args.run} → {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
