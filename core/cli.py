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

A job's training options are one frozen dataclass per recipe, each field an :func:`option` (its ``--help``
text, range and metavar; :func:`check_options` validates an instance): :func:`add_config_options` gives the
parser one ``--NAME`` per field, :func:`given_options` and :func:`config_from_args` build the config back, so
the library receives configs, never an :class:`argparse.Namespace`.

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
import dataclasses
import logging
import numbers
import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, get_type_hints

from tqdm import tqdm

from core.runtime import DEVICES, PRECISIONS, keep_freed_memory, use_device, use_precision

__all__ = ["DEVICES", "add_batch_size", "add_config_options", "add_crop_size", "add_device", "add_epochs",
           "add_lambda", "add_lr", "add_n_seeds", "add_seed", "add_seeds", "add_workspace", "check_options",
           "config_from_args", "deprecated", "flag", "given_options", "option", "option_flag", "parse_args"]

WORKSPACE_HELP = "workspace folder (default: $TRIDERM_WORKSPACE or ./workspace)"

Parser = argparse.ArgumentParser | argparse._ArgumentGroup
Config = TypeVar("Config")


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


def option(default: Any, help: str, *, choices: tuple[Any, ...] | None = None, minimum: float | None = None,
           positive: bool = False, metavar: str | None = None, spelling: str | None = None) -> Any:
    """A config field with its ``--help`` text and its range: ``choices``, a ``minimum`` (inclusive) or ``positive``
    (``metavar``: the option's value in ``--help``; ``spelling``: its option when not :func:`flag` of the field's
    name, e.g. ``--lambda`` for ``lam``)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum,
                                                        "positive": positive, "metavar": metavar,
                                                        "spelling": spelling})


def check_options(config: Any) -> None:
    """Store every :func:`option` field of the frozen dataclass ``config`` as its type (an integral number →
    ``int``, a real one → ``float``) and check its range; one :class:`ValueError` naming the field and the value
    (call it from ``__post_init__``)."""
    hints = get_type_hints(type(config))
    for f in dataclasses.fields(config):
        given, meta = getattr(config, f.name), f.metadata
        value = _typed(f.name, given, hints[f.name])
        object.__setattr__(config, f.name, value)
        if value is None:
            continue
        if meta["choices"] is not None and value not in meta["choices"]:
            raise ValueError(f"{f.name} must be one of {list(meta['choices'])}, got {given!r}")
        if meta["minimum"] is not None and value < meta["minimum"]:
            raise ValueError(f"{f.name} must be ≥ {meta['minimum']}, got {given!r}")
        if meta["positive"] and value <= 0:
            raise ValueError(f"{f.name} must be > 0, got {given!r}")


def _typed(name: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type, or one :class:`ValueError` naming the field."""
    allowed = getattr(hint, "__args__", (hint,))
    if value is None and type(None) in allowed:
        return None
    if bool in allowed:
        if isinstance(value, bool):
            return value
    elif int in allowed:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
    elif float in allowed:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
    elif isinstance(value, str):
        return value
    kind = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
    raise ValueError(f"{name} must be {kind}, got {value!r}")


def flag(name: str) -> str:
    """The option of config field ``name``: ``batch_size`` → ``--batch-size``."""
    return "--" + name.replace("_", "-")


def option_flag(f: dataclasses.Field) -> str:
    """The option of :func:`option` field ``f``: its ``spelling``, else :func:`flag` of its name."""
    return f.metadata.get("spelling") or flag(f.name)


def add_config_options(parser: Parser, recipes: Mapping[str, Mapping[str, Any]],
                       only: frozenset[str] | None = None) -> None:
    """One ``--NAME`` per field of the frozen dataclasses of ``recipes`` (label → {recipe name → instance}, the
    first instance the default; label "" for the job's main config), ``only`` those named when given: the
    field's :func:`option` help with every recipe's value, its type, choices and metavar, and the default ``None``
    (not given: the recipe's value applies). A field of several configs is one option whose help names each
    (``label: help``); its type must agree. A bool is ``--NAME`` (default False) or ``--NAME/--no-NAME``."""
    seen: dict[str, tuple[Any, list[str], dataclasses.Field, Any]] = {}  # field → (type, help, field, default)
    for label, named in recipes.items():
        first = next(iter(named.values()))
        hints = get_type_hints(type(first))
        for f in dataclasses.fields(first):
            if only is not None and f.name not in only:
                continue
            values = {name: getattr(cfg, f.name) for name, cfg in named.items()}
            default = values.pop(next(iter(named)))
            shown = [f"default {default}"] if default is not None and default is not False else []
            shown += [f"{name} {v}" for name, v in values.items() if v != default]
            help_ = (f"{label}: " if label else "") + f.metadata["help"] + (f" ({'; '.join(shown)})" if shown else "")
            kind, parts, _, _ = seen.setdefault(f.name, (hints[f.name], [], f, default))
            if kind != hints[f.name]:
                raise TypeError(f"{f.name}: {kind} in one config, {hints[f.name]} in another")
            if not any(part.endswith(help_.removeprefix(f"{label}: ")) for part in parts):  # said once
                parts.append(help_)
    for name, (kind, parts, f, default) in seen.items():
        help_ = "; ".join(parts).replace("%", "%%")
        if kind is bool:
            parser.add_argument(option_flag(f), dest=name, default=None, help=help_,
                                action=argparse.BooleanOptionalAction if default else "store_true")
        else:
            parser.add_argument(option_flag(f), dest=name, default=None, help=help_, metavar=f.metadata["metavar"],
                                type=next(t for t in getattr(kind, "__args__", (kind,)) if t is not type(None)),
                                choices=f.metadata["choices"])


def given_options(args: argparse.Namespace, names: Sequence[str] | frozenset[str]) -> dict[str, Any]:
    """The options among ``names`` (config fields) given on the command line: those not ``None``."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace, base: Config,
                     reads: frozenset[str] | None = None) -> Config:
    """``base`` (a frozen dataclass) with the options given among its fields (only ``reads`` of them, when
    given); a bad value exits through ``parser.error`` naming the option."""
    spelled = {f.name: option_flag(f) for f in dataclasses.fields(base)}  # type: ignore[arg-type]
    names = [name for name in spelled if reads is None or name in reads]
    try:
        return dataclasses.replace(base, **given_options(args, names))  # type: ignore[type-var]
    except ValueError as e:
        name, _, rest = str(e).partition(" ")  # the message starts with the field; others it names → options
        for other in spelled:
            rest = re.sub(rf"\b{other}\b", spelled[other].removeprefix("--"), rest) if "_" in other else rest
        parser.error(f"{spelled.get(name, flag(name))} {rest}")


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
