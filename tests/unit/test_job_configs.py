"""The jobs whose options are generated from a frozen config dataclass (:mod:`core.cli`): every option given either
changes the config the run records (built from the parsed arguments, without training) or is refused naming it."""
from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from types import SimpleNamespace
from typing import Any

import pytest

from core import cli


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
        return [name, str((current or 100) + 1)]
    if action.type is float:
        return [name, repr(current / 2)]
    return [name, f"other-{current}"]  # a name (backbone, target, checkpoint), checked when the job opens it


def config_actions(parser: argparse.ArgumentParser, config: type) -> list[argparse.Action]:
    """The parser's options generated from ``config``'s fields (deprecated spellings left out)."""
    names = {f.name for f in fields(config)}
    return [a for a in parser._actions if a.dest in names and a.help != argparse.SUPPRESS]


# --- SLIMP (python -m core.train_slimp) -------------------------------------------------------------------------

def test_slimp_options_are_its_config_fields():
    from core.nested.config import SlimpConfig
    from core.train_slimp import build_parser

    parser = build_parser()
    assert [a.dest for a in config_actions(parser, SlimpConfig)] == [f.name for f in fields(SlimpConfig)]
    assert parser._option_string_actions["--lambda"].dest == "lam"  # the vocabulary's spelling, not --lam
    assert "--lam" not in parser._option_string_actions


def test_slimp_every_option_changes_the_recorded_config_or_is_refused(capsys):
    """Each option given a value other than its default changes that field (and only it) of the config the run
    records; ``--permutations`` without ``--target`` exits 2 naming it."""
    from core.nested.config import SlimpConfig
    from core.train_slimp import _config, build_parser, config_of

    parser = build_parser()
    base = SlimpConfig()
    bb = SimpleNamespace(name="efficientnet-lite0@stage5", channels=320)
    recorded = _config(base, 1, bb, (None, None), False)
    assert {f.name for f in fields(SlimpConfig)} <= set(recorded) and recorded["lam"] == 0.9
    refused = []
    for action in config_actions(parser, SlimpConfig):
        argv = other_value(action, getattr(base, action.dest))
        try:
            cfg = config_of(parser, parser.parse_args(argv))
        except SystemExit as e:
            assert e.code == 2 and f"{argv[0]}: read only with --target" in capsys.readouterr().err, argv
            refused.append(action.dest)
            continue
        changed = {k for k, v in _config(cfg, 1, bb, (None, None), False).items() if recorded[k] != v}
        assert changed - {"trainable"} == {action.dest}, (argv, changed)  # --continual also names what it trains
    assert refused == ["permutations"]
    assert config_of(parser, parser.parse_args(["--target", "t", "--permutations", "200"])).permutations == 200


def test_slimp_resume_refuses_the_settings_its_checkpoint_fixes(capsys):
    """With ``--resume`` the checkpoint's settings replace the defaults; giving one of them is an error, while the
    epochs (and the probes of the target it was trained with) are read."""
    from core.nested.config import TRAIN_KEYS, SlimpConfig
    from core.train_slimp import build_parser, config_of

    parser = build_parser()
    saved = {**{k: getattr(SlimpConfig(), k) for k in TRAIN_KEYS}, "lr": 1e-3, "crop_size": 64, "target": "subtype"}
    args = parser.parse_args(["--resume", "3", "--epochs", "5", "--permutations", "200"])
    assert config_of(parser, args).permutations == 200  # checked before the checkpoint is read: its target unknown
    cfg = config_of(parser, args, saved)
    assert (cfg.epochs, cfg.lr, cfg.crop_size, cfg.target, cfg.permutations) == (5, 1e-3, 64, "subtype", 200)
    with pytest.raises(SystemExit):
        config_of(parser, args, {**saved, "target": None})
    assert "--permutations: read only with --target" in capsys.readouterr().err
    for argv in (["--lr", "0.1"], ["--batch-size", "4"], ["--init", "2"], ["--continual"]):
        with pytest.raises(SystemExit) as e:
            config_of(parser, parser.parse_args(["--resume", "3", *argv]), saved)
        assert e.value.code == 2
        assert f"{argv[0]}: not read with --resume 3" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--epochs", "0"], "--epochs must be ≥ 1, got 0"),
    (["--lambda", "1.5"], "--lambda must be in [0, 1], got 1.5"),
    (["--lr", "0"], "--lr must be > 0, got 0"),
    (["--max-wounds", "0"], "--max-wounds must be ≥ 1, got 0"),
    (["--target", "t", "--permutations", "10"], "--permutations must be ≥ 100, got 10"),
    (["--no-wound-meta", "--no-patient-meta"], "--no-wound-meta and --no-patient-meta together leave nothing"),
])
def test_slimp_a_bad_value_names_its_option(argv, message, capsys):
    from core.train_slimp import build_parser, config_of

    parser = build_parser()
    with pytest.raises(SystemExit) as e:
        config_of(parser, parser.parse_args(argv))
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_spelled_option_keeps_its_field_as_dest(capsys):
    """:func:`core.cli.option`'s ``spelling``: the option's name; its field stays the dest and names the error."""
    from core.nested.config import SlimpConfig

    parser = argparse.ArgumentParser()
    cli.add_config_options(parser, {"": {"default": SlimpConfig()}}, only=frozenset({"lam"}))
    args = parser.parse_args(["--lambda", "0.5"])
    assert cli.config_from_args(parser, args, SlimpConfig()).lam == 0.5
    assert asdict(cli.config_from_args(parser, parser.parse_args([]), SlimpConfig())) == asdict(SlimpConfig())
    with pytest.raises(SystemExit):
        cli.config_from_args(parser, parser.parse_args(["--lambda", "-1"]), SlimpConfig())
    assert "--lambda must be ≥ 0, got -1" in capsys.readouterr().err


# --- segmenter (python -m core.train_segmenter) -----------------------------------------------------------------

def test_segmenter_every_option_changes_the_recorded_config():
    """Each option given a value other than its default changes the config the run records (``--seed``: the
    record's seed column); the job has no option a run does not read."""
    from core.segmentation.defaults import EPOCHS, PRETRAIN_EPOCHS, SegmenterConfig
    from core.segmentation.training import run_config
    from core.train_segmenter import build_parser

    parser = build_parser()
    base = SegmenterConfig()
    actions = config_actions(parser, SegmenterConfig)
    assert [a.dest for a in actions] == [f.name for f in fields(SegmenterConfig)]

    def recorded(argv: list[str]) -> dict[str, Any]:
        args = parser.parse_args(argv)
        cfg = cli.config_from_args(parser, args, base)
        return {**run_config(cfg, args.data, "cpu", 3, 1), "seed": cfg.seed}

    default = recorded([])
    assert default["epochs"] == EPOCHS and recorded(["--pretrain"])["epochs"] == PRETRAIN_EPOCHS
    for action in actions:
        current = base.train_epochs if action.dest == "epochs" else getattr(base, action.dest)
        argv = other_value(action, current)
        assert recorded(argv) != default, argv
    assert recorded(["--data", "d1", "--data", "d2"])["data"] == ["d1", "d2"]
    assert recorded(["--epochs", "3", "--pretrain"])["epochs"] == 3  # given epochs win over either default


@pytest.mark.parametrize(("argv", "message"), [
    (["--epochs", "0"], "--epochs must be ≥ 1, got 0"),
    (["--lr", "0"], "--lr must be > 0, got 0"),
    (["--val-fraction", "1"], "--val-fraction must be < 1, got 1.0"),
    (["--batch-size", "0"], "--batch-size must be ≥ 1, got 0"),
    (["--tune", "encoder"], "argument --tune: invalid choice: 'encoder'"),
    (["--pretrain", "--tune", "head"], "--pretrain trains every part"),
])
def test_segmenter_a_bad_value_names_its_option(argv, message, capsys):
    from core.segmentation.defaults import SegmenterConfig
    from core.train_segmenter import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit) as e:
        cli.config_from_args(parser, parser.parse_args(argv), SegmenterConfig())
    assert e.value.code == 2 and message in capsys.readouterr().err


# --- concepts (python -m core.train_concepts) -------------------------------------------------------------------

def test_concepts_every_option_changes_the_recorded_config_or_is_refused(capsys):
    """Trained, every option changes its field (and only it) of the config the run records; with ``--untrained``
    the training options exit 2 naming themselves and the rest still change the record."""
    from core.concepts.defaults import TRAINING_OPTIONS, ConceptsConfig
    from core.train_concepts import _parser, config_of, run_config

    parser = _parser()
    base = ConceptsConfig()
    actions = config_actions(parser, ConceptsConfig)
    assert [a.dest for a in actions] == [f.name for f in fields(ConceptsConfig)]
    for untrained in ([], ["--untrained"]):
        recorded = run_config(config_of(parser, parser.parse_args(untrained)), None)
        assert {"workspace", "device", "precision", *(f.name for f in fields(ConceptsConfig))} == set(recorded)
        refused = set()
        for action in actions:
            if action.dest == "untrained":
                continue
            argv = [*untrained, *other_value(action, getattr(base, action.dest))]
            try:
                cfg = config_of(parser, parser.parse_args(argv))
            except SystemExit as e:
                assert e.code == 2 and f"{argv[-2]}: not read with --untrained" in capsys.readouterr().err, argv
                refused.add(action.dest)
                continue
            changed = {k for k, v in run_config(cfg, None).items() if recorded[k] != v}
            assert changed == {action.dest}, (argv, changed)
        assert refused == (TRAINING_OPTIONS if untrained else set())
    assert run_config(config_of(parser, parser.parse_args(["--untrained"])), None)["untrained"] is True


@pytest.mark.parametrize(("argv", "message"), [
    (["--holdout", "1"], "--holdout must be in (0, 1), got 1.0"),
    (["--beta", "1.5"], "--beta must be in [0, 1], got 1.5"),
    (["--unlock", "-2"], "--unlock must be ≥ -1, got -2"),
    (["--batch-size", "1"], "--batch-size must be ≥ 2, got 1"),
    (["--untrained", "--epochs", "3", "--lr", "0.1"], "--epochs, --lr: not read with --untrained"),
])
def test_concepts_a_bad_value_names_its_option(argv, message, capsys):
    from core.train_concepts import _parser, config_of

    parser = _parser()
    with pytest.raises(SystemExit) as e:
        config_of(parser, parser.parse_args(argv))
    assert e.value.code == 2 and message in capsys.readouterr().err


# --- contrastive benchmark (python -m core.bench_contrastive) ---------------------------------------------------

@pytest.mark.parametrize("variants", [None, "clip,siglip"])
def test_contrastive_every_option_changes_the_recorded_config_or_is_refused(variants, capsys):
    """Each option changes its field of the config the run records (``--quick`` also the defaults it settles);
    an option only variants left out of ``--variants`` read exits 2 naming it and them."""
    from core.bench_contrastive import FLAGS, _parser, config_of, run_config
    from core.experiments.defaults import QUICK, VARIANT_OPTIONS, ContrastiveConfig

    parser = _parser()
    chosen = [] if variants is None else ["--variants", variants]
    base = config_of(parser, parser.parse_args(chosen))
    recorded = run_config(base)
    assert (base.n_seeds, base.epochs, base.crop_size) == (5, 8, 160)
    refused = set()
    for action in config_actions(parser, ContrastiveConfig):
        if action.dest == "variants":
            argv = ["--variants", "clip"]
        else:
            argv = [*chosen, *other_value(action, getattr(base, action.dest))]
        try:
            cfg = config_of(parser, parser.parse_args(argv))
        except SystemExit as e:
            assert e.code == 2, argv
            assert f"{FLAGS[action.dest]}: read only by the {', '.join(VARIANT_OPTIONS[action.dest])}" in \
                capsys.readouterr().err
            refused.add(action.dest)
            continue
        changed = {k for k, v in run_config(cfg).items() if recorded[k] != v}
        assert changed == ({action.dest, *QUICK} if action.dest == "quick" else {action.dest}), (argv, changed)
    assert refused == (set() if variants is None else set(VARIANT_OPTIONS))


@pytest.mark.parametrize(("argv", "message"), [
    (["--holdout", "1.5"], "--holdout must be in (0, 1), got 1.5"),
    (["--lambda", "2"], "--lambda must be in [0, 1], got 2.0"),
    (["--patch-dropout", "1"], "--patch-dropout must be in [0, 1), got 1.0"),
    (["--crop-size", "16"], "--crop-size must be ≥ 32, got 16"),
    (["--variants", "clip,bogus"], "--variants: unknown variant(s) ['bogus']; choose from ('clip', 'siglip', "
                                   "'image_frozen'"),
    (["--variants", "clip", "--lambda", "0.2", "--patch-dropout", "0.1"], "--lambda: read only by the clip_unimodal"),
])
def test_contrastive_a_bad_value_names_its_option(argv, message, capsys):
    from core.bench_contrastive import _parser, config_of

    parser = _parser()
    with pytest.raises(SystemExit) as e:
        config_of(parser, parser.parse_args(argv))
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_contrastive_quick_settles_only_what_is_not_given():
    from core.bench_contrastive import _parser, config_of

    parser = _parser()
    quick = config_of(parser, parser.parse_args(["--quick", "--epochs", "3"]))
    assert (quick.n_seeds, quick.epochs, quick.crop_size) == (1, 3, 96)
