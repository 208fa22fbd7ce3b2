"""``triderm app|<job>|<command> [ARGS…]``: the app, a job under ``core`` or a command of ``annotations``."""
from __future__ import annotations

import ast
import importlib.util
import os
import runpy
import sys
import tomllib
from pathlib import Path

from triderm import ANNOTATION_COMMANDS, JOBS, app_path

CONFIG = Path(__file__).resolve().parent / "streamlit.toml"


def _summary(job: str) -> str:
    """The first line of ``core.<job>``'s docstring, read from its source without importing it."""
    spec = importlib.util.find_spec(f"core.{job}")
    if spec is None or spec.origin is None:
        return "(not installed)"
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def usage() -> str:
    """The ``triderm`` command's usage text: the subcommands and every job with its summary."""
    jobs = "\n".join(f"  {job.replace('_', '-'):<18} {_summary(job)}" for job in JOBS)
    return (
        "usage: triderm COMMAND [ARGS…]   (triderm COMMAND --help for each)\n\n"
        "TriDerm Studio: collect wound outlines and expert similarity judgments, learn and explore embeddings.\n\n"
        "app:\n  app                serve the app (Streamlit): triderm app [--workspace PATH] [streamlit options…]\n\n"
        f"jobs (python -m core.<job>; need the [ml] extra, core.llm_triplets also [llm]):\n{jobs}\n\n"
        "workspace commands (python -m annotations <command>):\n  " + ", ".join(ANNOTATION_COMMANDS) + "\n\n"
        "Every command takes --workspace (default $TRIDERM_WORKSPACE, else ./workspace).\n")


def streamlit_flags(config: Path = CONFIG) -> list[str]:
    """The shipped ``.streamlit/config.toml`` as ``--section.option=value`` flags: Streamlit reads a
    config file only from the working directory and ``~/.streamlit``, not beside an installed app.py."""
    flags = []
    for section, options in tomllib.loads(config.read_text(encoding="utf-8")).items():
        for option, value in options.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            flags.append(f"--{section}.{option}={text}")
    return flags


def run_app(args: list[str]) -> int:
    """``streamlit run app.py`` with the shipped settings; ``--workspace PATH`` goes to the app.

    The launcher becomes Streamlit (exec, same process id): a signal to ``triderm app`` (a service manager's
    SIGTERM, Ctrl-C, a closed terminal's SIGHUP, SIGKILL) reaches the server itself, which never outlives it.
    Returns only on an error in the arguments."""
    workspace: list[str] = []
    if "--workspace" in args:
        at = args.index("--workspace")
        if at + 1 >= len(args):
            print("error: --workspace needs a folder", file=sys.stderr)
            return 2
        workspace = ["--", "--workspace", args[at + 1]]
        args = args[:at] + args[at + 2:]
    if importlib.util.find_spec("streamlit") is None:
        print('error: the app needs the [app] extra: pip install "triderm-studio[app]"', file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "streamlit", "run", str(app_path()), *streamlit_flags(), *args, *workspace]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)


def main(argv: list[str] | None = None) -> int:
    """The ``triderm`` command: run the app, the annotations CLI or a job; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "app":
        return run_app(rest)
    job = command.replace("-", "_")
    if job in JOBS:
        sys.argv = [f"python -m core.{job}", *rest]
        runpy.run_module(f"core.{job}", run_name="__main__", alter_sys=True)
        return 0
    if command in ANNOTATION_COMMANDS:
        from annotations.__main__ import main as annotations_main

        return annotations_main([command, *rest])
    print(f"error: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
