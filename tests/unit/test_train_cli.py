"""``python -m core.train_triderm``'s options: each mode reads its configs' fields, every option given either changes
the config the run records or is refused naming the option and the mode; the generic :mod:`core.cli` helpers."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

import pytest

from core import cli
from core.train_triderm import OPTIONS, build_parser, configs_of
from core.vision.triderm_config import (
    MODE_OPTIONS,
    MODE_READS,
    PAPER_RECIPE_MODES,
    FineTuneConfig,
    TriDermConfig,
    mode_defaults,
)

PARSER = build_parser()
#: every option that sets a config: the config fields' and ``--paper-recipe``
CONFIG_ACTIONS = [a for a in PARSER._actions if a.dest in OPTIONS or a.dest == "paper_recipe"]
DEFAULTS = {f.name: f.default for kind in (TriDermConfig, FineTuneConfig) for f in fields(kind)}


def other_value(action: argparse.Action, current: Any) -> list[str]:
    """The command-line words giving ``action``'s option a valid value other than ``current``."""
    name = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        return [f"--no-{name[2:]}" if current else name]
    if action.nargs == 0:  # store_true
        return [name]
    if action.choices:
        return [name, next(str(c) for c in action.choices if c != current)]
    if action.type is int:
        return [name, str(current + 1)]
    if action.type is float:
        return [name, repr(current * 2)]
    return [name, f"other-{current}"]  # a name (backbone, layer), checked when it is loaded


def built(mode: str, *argv: str) -> dict[type, Any]:
    return configs_of(PARSER, PARSER.parse_args(["--mode", mode, *argv]), mode)


def test_every_option_is_some_modes_and_auto_reads_only_what_both_its_modes_read():
    assert {a.dest for a in CONFIG_ACTIONS} == {*OPTIONS, "paper_recipe"}
    every_field = {f.name for f in (*fields(TriDermConfig), *fields(FineTuneConfig))}
    assert every_field - {"supervise"} == OPTIONS
    assert MODE_OPTIONS["auto"] == MODE_OPTIONS["frozen"] & MODE_OPTIONS["fine-tune"]
    assert set(MODE_READS["fine-tune"]) == {FineTuneConfig, TriDermConfig}  # its own config + the views and folds


@pytest.mark.parametrize("mode", list(MODE_READS))
def test_every_option_changes_the_recorded_config_or_is_refused(mode, capsys):
    """Given a value other than the mode's own default, an option the mode reads changes that field of the config
    it records (and nothing else); any other option exits 2 naming the option and the mode."""
    base = built(mode)
    start = {**DEFAULTS, **mode_defaults(mode)}
    refused, read = [], []
    for action in CONFIG_ACTIONS:
        argv = other_value(action, start.get(action.dest))
        try:
            configs = built(mode, *argv)
        except SystemExit as e:
            assert e.code == 2
            assert f"{argv[0]}: not read by --mode {mode}" in capsys.readouterr().err, argv
            refused.append(action.dest)
            continue
        changed = {(kind.__name__, f.name) for kind, cfg in configs.items() for f in fields(cfg)
                   if getattr(cfg, f.name) != getattr(base[kind], f.name)}
        assert changed, f"{argv} changes nothing in --mode {mode}"
        if action.dest != "paper_recipe":
            assert {name for _, name in changed} == {action.dest}, (argv, changed)
        read.append(action.dest)
    assert set(read) == MODE_OPTIONS[mode] | ({"paper_recipe"} if mode in PAPER_RECIPE_MODES else set())
    assert refused and read  # each mode refuses something and reads something


def test_the_fine_tune_modes_options_reach_its_config():
    configs = built("fine-tune", "--steps", "3", "--lr", "0.001", "--seed", "4", "--cv", "0", "--views", "2")
    assert configs[FineTuneConfig] == FineTuneConfig(steps=3, lr=1e-3, seed=4)
    tri = configs[TriDermConfig]
    assert (tri.views, tri.cv, tri.cv_repeats, tri.supervise) == (2, 0, 3, "triplets")
    assert built("fine-tune")[TriDermConfig].cv == 2  # scored on patient-disjoint folds unless told
    assert built("self-supervised", "--lr", "0.001")[TriDermConfig].lr == 1e-3  # one option, each mode its field


@pytest.mark.parametrize(("argv", "message"), [
    (["--mode", "fine-tune", "--epochs", "3"], "--epochs: not read by --mode fine-tune"),
    (["--mode", "frozen", "--lr", "0.1", "--pooling", "mean"], "--pooling, --lr: not read by --mode frozen"),
    (["--mode", "fine-tune", "--layer", "stage5"], "--layer: not read by --mode fine-tune"),
    (["--mode", "fine-tune", "--steps", "0"], "--steps must be ≥ 1, got 0"),
    (["--mode", "fine-tune", "--lr", "0"], "--lr must be > 0, got 0"),
])
def test_a_refused_option_or_bad_value_names_itself(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        configs_of(PARSER, PARSER.parse_args(argv), argv[1])
    assert err.value.code == 2 and message in capsys.readouterr().err


@dataclass(frozen=True)
class Toy:
    """A config of the generic helpers' test."""

    steps: int = cli.option(10, "steps", minimum=1, metavar="N")
    rate: float = cli.option(0.5, "rate", positive=True)
    kind: str = cli.option("a", "kind", choices=("a", "b"))
    fast: bool = cli.option(False, "fast")
    keep: bool = cli.option(True, "keep")

    def __post_init__(self) -> None:
        cli.check_options(self)


def test_the_generic_helpers_turn_a_config_into_options_and_back(capsys):
    parser = argparse.ArgumentParser()
    cli.add_config_options(parser, {"": {"default": Toy(), "quick": Toy(steps=2)}})
    text = " ".join(parser.format_help().split())
    assert "--steps N steps (default 10; quick 2)" in text and "--kind {a,b}" in text
    assert "--keep, --no-keep" in text and "fast (" not in text  # a False flag shows no default
    args = parser.parse_args(["--steps", "3", "--no-keep", "--kind", "b"])
    assert cli.given_options(args, [f.name for f in fields(Toy)]) == {"steps": 3, "kind": "b", "keep": False}
    assert cli.config_from_args(parser, args, Toy()) == Toy(steps=3, kind="b", keep=False)
    assert cli.config_from_args(parser, args, Toy(), reads=frozenset({"kind"})) == Toy(kind="b")
    with pytest.raises(SystemExit):
        cli.config_from_args(parser, parser.parse_args(["--rate", "-1"]), Toy())
    assert "--rate must be > 0, got -1.0" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"steps must be int, got 2\.5"):
        Toy(steps=2.5)  # type: ignore[arg-type]
