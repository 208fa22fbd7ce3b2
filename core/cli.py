"""One command-line vocabulary for every job (``python -m core.<job>``) and benchmark.

Spellings (each helper adds one option with its canonical help; ``**kw`` overrides help/default):

=================  =========================================================================
``--workspace``    workspace folder (default ``$TRIDERM_WORKSPACE`` or ``./workspace``)
``--seed``         one integer seed
``--seeds``        a list of seeds (``--seeds 0 1 2``)
``--n-seeds``      a count of seeds (seeds ``0 … N−1``)
``--device``       ``auto`` (CUDA when available), ``cpu`` or ``cuda``; one device for the whole job
``--precision``    ``auto`` (bf16 where the GPU has it, else fp16), ``fp32``, ``bf16`` or ``fp16``: CUDA's
                   compute precision, added with ``--device`` (the CPU always computes in fp32)
``--batch-size``   items (or patients, for SLIMP) per optimiser step
``--epochs``       training epochs
``--lr``           learning rate
``--lambda``       λ, a loss-mixing weight (dest ``lam``)
``--crop-size``    crop side in px
=================  =========================================================================

Old spellings stay accepted for one release through :func:`deprecated`: hidden from ``--help``,
they store into the new option and print a ``FutureWarning`` naming the new spelling (a
FutureWarning, not a DeprecationWarning, because it is meant for the person at the terminal).
:func:`parse_args` parses and sets the process's device (:func:`core.runtime.use_device`), so every
``core.runtime.pick_device()`` of the job returns the same one, and shows the library's messages
(:func:`log_to_console`): library modules log through ``logging.getLogger(__name__)``; only a job's
``main`` prints.
"""
from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from core.runtime import DEVICES, PRECISIONS, keep_freed_memory, use_device, use_precision

__all__ = ["DEVICES", "add_batch_size", "add_crop_size", "add_device", "add_epochs", "add_lambda", "add_lr",
           "add_n_seeds", "add_seed", "add_seeds", "add_workspace", "deprecated", "parse_args"]

WORKSPACE_HELP = "workspace folder (default: $TRIDERM_WORKSPACE or ./workspace)"

Parser = argparse.ArgumentParser | argparse._ArgumentGroup


def _add(parser: Parser, flag: str, defaults: dict[str, Any], kw: dict[str, Any]) -> argparse.Action:
    return parser.add_argument(flag, **{**defaults, **kw})


def add_workspace(parser: Parser, **kw: Any) -> argparse.Action:
    """``--workspace PATH``."""
    return _add(parser, "--workspace", {"default": None, "help": WORKSPACE_HELP}, kw)


def add_seed(parser: Parser, default: int | None = 0, **kw: Any) -> argparse.Action:
    """``--seed N``: one integer seed."""
    return _add(parser, "--seed", {"type": int, "default": default, "help": "random seed"}, kw)


def add_seeds(parser: Parser, default: Sequence[int] | None = (0, 1, 2), **kw: Any) -> argparse.Action:
    """``--seeds N [N …]``: a list of seeds (stored as a list)."""
    help_ = "seeds, a list" + (f" (default: {' '.join(map(str, default))})" if default else "")
    return _add(parser, "--seeds", {"type": int, "nargs": "+", "metavar": "SEED",
                                    "default": None if default is None else list(default), "help": help_}, kw)


def add_n_seeds(parser: Parser, default: int | None = 3, **kw: Any) -> argparse.Action:
    """``--n-seeds N``: a count of seeds (0 … N−1)."""
    return _add(parser, "--n-seeds", {"type": _positive, "default": default, "metavar": "N",
                                      "help": f"number of seeds 0 … N−1 (default: {default})"}, kw)


def add_device(parser: Parser, **kw: Any) -> argparse.Action:
    """``--device {auto,cpu,cuda}`` and, beside it, ``--precision {auto,fp32,bf16,fp16}``; :func:`parse_args`
    resolves them for the process (``"cpu"``/``"cuda"``; the precision the device computes in). Returns the
    ``--device`` action."""
    device = _add(parser, "--device", {"choices": DEVICES, "default": "auto",
                                       "help": "auto (CUDA when available), cpu or cuda (default: auto)"}, kw)
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="CUDA compute precision: auto (bf16 where the GPU supports it, else fp16 with loss "
                             "scaling; else $TRIDERM_CUDA_PRECISION), fp32, bf16 or fp16; the CPU always computes "
                             "in fp32 (default: auto)")
    return device


def add_batch_size(parser: Parser, default: int | None, **kw: Any) -> argparse.Action:
    """``--batch-size N``."""
    return _add(parser, "--batch-size", {"type": int, "default": default, "help": f"batch size (default: {default})"}, kw)


def add_epochs(parser: Parser, default: int | None, **kw: Any) -> argparse.Action:
    """``--epochs N``."""
    return _add(parser, "--epochs", {"type": int, "default": default, "help": f"training epochs (default: {default})"}, kw)


def add_lr(parser: Parser, default: float | None, **kw: Any) -> argparse.Action:
    """``--lr X``."""
    return _add(parser, "--lr", {"type": float, "default": default, "help": f"learning rate (default: {default})"}, kw)


def add_lambda(parser: Parser, default: float | None, **kw: Any) -> argparse.Action:
    """``--lambda X`` (dest ``lam``)."""
    return _add(parser, "--lambda", {"dest": "lam", "type": float, "default": default, "metavar": "λ",
                                     "help": f"λ, a loss-mixing weight (default: {default})"}, kw)


def add_crop_size(parser: Parser, default: int | None, **kw: Any) -> argparse.Action:
    """``--crop-size PX``."""
    return _add(parser, "--crop-size", {"type": int, "default": default, "metavar": "PX",
                                        "help": f"crop side in px (default: {default})"}, kw)


class _Deprecated(argparse.Action):
    """An old spelling: stores into the new option's ``dest`` and warns once per use."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        warnings.warn(f"{option_string} is deprecated and will be removed in the next release; use {self.new}",
                      FutureWarning, stacklevel=2)
        setattr(namespace, self.dest, values)


def deprecated(parser: Parser, old: str, new: argparse.Action) -> argparse.Action:
    """Accept ``old`` (hidden from ``--help``) as a deprecated spelling of the option ``new``
    (the action :func:`add_*` or ``add_argument`` returned): same type, nargs, choices and dest."""
    # typeshed's add_argument rejects type=None, argparse's own default for "no conversion"
    return parser.add_argument(old, action=_Deprecated, new=new.option_strings[0], dest=new.dest, type=new.type,  # type: ignore[arg-type]
                               nargs=new.nargs, choices=new.choices, default=argparse.SUPPRESS,
                               metavar=new.metavar, help=argparse.SUPPRESS)


class _TqdmHandler(logging.Handler):
    """Writes each record to stderr through :func:`tqdm.write`, so a message never tears a progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging's own contract: report, never raise
            self.handleError(record)


def log_to_console() -> None:
    """Show the ``core`` loggers' INFO and higher messages on stderr (once per process)."""
    logger = logging.getLogger("core")
    if not any(isinstance(h, _TqdmHandler) for h in logger.handlers):
        handler = _TqdmHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)``; a ``--device`` is resolved (``auto`` → ``"cuda"`` or ``"cpu"``) and
    fixed for the whole process, with its ``--precision`` (resolved to ``fp32``, ``bf16`` or ``fp16``); a
    ``cuda`` request without CUDA, or ``bf16`` on a GPU without it, exits through ``parser.error``. The
    library's messages go to stderr from then on (:func:`log_to_console`); freed memory is kept for reuse
    (:func:`~core.runtime.keep_freed_memory`: a third less CPU for a batch of the cache's forward)."""
    log_to_console()
    keep_freed_memory()
    with warnings.catch_warnings():
        warnings.simplefilter("always", FutureWarning)  # every deprecated spelling is reported, even twice
        args = parser.parse_args(argv)
    if isinstance(getattr(args, "device", None), str):
        try:
            args.device = str(use_device(args.device))  # "cpu" or "cuda": JSON-safe in run configs
            if isinstance(getattr(args, "precision", None), str):
                args.precision = use_precision(args.precision, args.device)  # what the device computes in
        except ValueError as e:
            parser.error(str(e))
    return args


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value
