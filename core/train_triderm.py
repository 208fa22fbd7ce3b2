"""Learn a workspace's vision embedding: frozen centred, TriDerm-V or metric heads on the expert's triplets.

TriDerm-V (``--mode self-supervised``; TriDerm §2.2, §3.2): wound attention pooling + predictor on a
frozen backbone. Each step takes a batch of wounds, two different augmented views of each wound's photo,
pools each wound's tokens (attention or mean), maps them with the predictor (Linear +
LayerNorm, dim 512) and applies VICReg (default), InfoNCE or a triplet loss to the pair.
AdamW, cosine learning-rate schedule over all steps. With the feature cache (default) the
K views per photo are computed once by the frozen backbone and a step is a tensor gather;
``--no-cache`` augments and runs the backbone at every step (the naive baseline).

Inference: photos resized to the backbone's input size, no augmentation; a wound's
embedding is the head's output, an image's the mean of its wounds. The run (kind
``vision-triderm``) stores the loss per epoch, wound and image embeddings and, per wound
token, its attention weight and grid position (``token_wound``, ``token_pos``,
``token_weight``, ``grid``); the job then stores what the Explore page shows of the run — every photo's token
map (:mod:`core.vision.token_maps`: a fine-tune run's token contributions, a TriDerm-V run's attention) and the
map's UMAP at the page's default setting — and prints frozen baseline vs trained agreement.

``--mode`` (default ``auto``) follows the strict real-data evidence (:data:`core.vision.recipe.MODES`):
with the expert's triplets in the workspace it fine-tunes the backbone's last stage + head on them
(:mod:`core.vision.finetune`), scored out of fold first; without them it records the frozen centred embedding
(a ``vision-baseline`` run, no training), since no self-supervised recipe beat it on new patients.
``--mode supervised`` trains metric heads on the triplets, ``--mode self-supervised`` TriDerm-V.

Each mode reads the fields of its configs (:data:`~core.vision.triderm_config.MODE_READS`: TriDerm-V's
:class:`~core.vision.triderm_config.TriDermConfig`, the fine-tune mode's
:class:`~core.vision.triderm_config.FineTuneConfig`); an option the mode does not read exits with an error naming
it and the mode (``auto`` first chooses its mode from the workspace), and every option read is in the run record.

    python -m core.train_triderm [--workspace W] [--mode auto|frozen|self-supervised|supervised|fine-tune] ...
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from annotations.infra.workspace import Workspace
from core import cli
from core.eval.formatting import agreement_text
from core.eval.report import run_report
from core.runtime import open_workspace, user_errors
from core.vision.recipe import MODES
from core.vision.triderm_config import (AUTO_MODES, DEFAULT, MODE_OPTIONS, MODE_READS, PAPER_RECIPE, PAPER_RECIPE_MODES,
                                       FineTuneConfig, TriDermConfig, base_config)

#: the recipes ``--help`` shows each config's values of: label → {recipe → instance}, the first the default
RECIPES: dict[str, dict[str, Any]] = {"": {"default": DEFAULT, "paper recipe": PAPER_RECIPE},
                                      "fine-tune": {"default": FineTuneConfig()}}
#: every config field some mode reads: one option each (``supervise`` is set by ``--mode supervised``)
OPTIONS = frozenset().union(*(MODE_OPTIONS[mode] for mode in MODE_READS))
#: the config fields in ``--help`` order
ORDER = [f.name for recipes in RECIPES.values() for f in fields(next(iter(recipes.values())))]


def agreement_table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """Plain-text table per labelled result: balanced agreement (%), with its 95% interval when the
    result has ``ci``, micro agreement and macro-F1 (%), Cohen's κ and the triplets scored; "—" where a result
    has no such figure (a run's strict out-of-fold figure is its balanced agreement only)."""
    width = max(len(label) for label, _ in rows)

    def cell(m: dict[str, Any], key: str, with_ci: bool = True, scale: float = 100, digits: int = 1) -> str:
        if m.get(key) is None or not math.isfinite(m[key]):
            return "—"
        ci = (m.get("ci") or {}).get(key) if with_ci else None
        return agreement_text(m[key], ci, scale=scale, digits=digits)

    cells = [[cell(m, "balanced"), cell(m, "micro"), cell(m, "macro_f1", False), cell(m, "kappa", False, 1, 3),
              str(m["n"])] for _, m in rows]
    heads = ["balanced", "micro", "macro-F1", "kappa", "scored"]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = [f"{'':{width}}  " + " ".join(f"{h:>{w}}" for h, w in zip(heads, widths))]
    lines += [f"{label:{width}}  " + " ".join(f"{c:>{w}}" for c, w in zip(row, widths))
              for (label, _), row in zip(rows, cells)]
    return "\n".join(lines)


def scored_note(m: dict[str, Any], expert: int) -> str:
    """Why fewer triplets were scored than the expert answered (skips, photos without an embedding)."""
    why = [f"{m[k]} {text}" for k, text in (("n_skipped", "the expert skipped (no answer to score)"),
                                          ("n_missing", "name a photo without an embedding")) if m.get(k)]
    return f"scored {m['n']} of the expert's {expert} triplets" + (f": {'; '.join(why)}" if why else "")


def next_steps(ws) -> str:
    """What to do after the demo: an admin account (only when the workspace has no active admin), the app,
    the Report page (venv commands)."""
    from annotations.accounts.accounts import list_accounts

    py = Path(sys.executable)
    venv = py.parent.parent if (py.parent.parent / "pyvenv.cfg").exists() else None
    bin_ = f"{venv.name}/bin/" if venv is not None and venv.parent == Path.cwd() else ""
    steps = [f"open the app:             make app   (or {bin_}streamlit run app.py -- --workspace {ws.root})",
             "sign in; the Report page shows this evaluation, Explore the embeddings, Train more runs."]
    if not any(a["role"] == "admin" and not a["disabled"] for a in list_accounts(ws.store)):
        steps.insert(0, f"create an admin account:  {bin_}python -m annotations users add --role admin NAME"
                        f" --workspace {ws.root}")
    return "\nNext steps:\n" + "\n".join(f"  {n}. {step}" for n, step in enumerate(steps, 1))


def build_parser() -> argparse.ArgumentParser:
    """The job's options: workspace, device, ``--mode``, ``--paper-recipe`` and one option per config field some
    mode reads (:func:`core.cli.add_config_options`)."""
    reads = "; ".join(f"{mode}: {', '.join(cli.flag(n) for n in sorted(MODE_OPTIONS[mode], key=ORDER.index))}"
                      + (", --paper-recipe" if mode in PAPER_RECIPE_MODES else "") for mode in MODE_READS)
    parser = argparse.ArgumentParser(prog="python -m core.train_triderm", description=__doc__.splitlines()[0],
                                     epilog=f"The options each mode reads (any other is an error): {reads}; auto: "
                                            "those of the mode it chooses.")
    cli.add_workspace(parser)
    cli.add_device(parser)
    parser.add_argument("--mode", choices=tuple(MODES), default="auto",
                        help=("what to learn (default auto); an option the mode does not read is an error. "
                              + "; ".join(f"{k}: {v}" for k, v in MODES.items())).replace("%", "%%"))
    parser.add_argument("--paper-recipe", action="store_true",
                        help="start from the TriDerm paper's settings instead of the real-data default (the "
                             f"{' and '.join(PAPER_RECIPE_MODES)} modes)")
    cli.add_config_options(parser, RECIPES, only=OPTIONS)
    return parser


def unread_options(args: argparse.Namespace, mode: str) -> str | None:
    """The error for options given that ``mode`` does not read (``--paper-recipe`` included), else None."""
    given = cli.given_options(args, sorted(OPTIONS, key=ORDER.index))
    unread = [cli.flag(("no_" if v is False else "") + n) for n, v in given.items() if n not in MODE_OPTIONS[mode]]
    if args.paper_recipe and mode not in PAPER_RECIPE_MODES:
        unread.append("--paper-recipe")
    if not unread:
        return None
    reads = ", ".join(cli.flag(n) for n in sorted(MODE_OPTIONS[mode], key=ORDER.index))
    return (f"{', '.join(unread)}: not read by --mode {mode}, which reads only {reads}; leave "
            f"{'it' if len(unread) == 1 else 'them'} out")


def configs_of(parser: argparse.ArgumentParser, args: argparse.Namespace, mode: str, chose: str = ""
               ) -> dict[type, Any]:
    """The configs ``mode`` trains with (:data:`~core.vision.triderm_config.MODE_READS`), each its
    :func:`base_config` with the options given among the fields the mode reads of it; an option the mode does
    not read, or a bad value, exits through ``parser.error`` (``chose``: how ``auto`` chose the mode, said first)."""
    if error := unread_options(args, mode):
        parser.error(chose + error)
    return {kind: cli.config_from_args(parser, args, base_config(kind, mode, args.paper_recipe), reads)
            for kind, reads in MODE_READS[mode].items()}


def check_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit through ``parser.error`` on a bad option value, before ``auto`` opens the workspace to choose its mode."""
    for kind in {kind for mode in AUTO_MODES for kind in MODE_READS[mode]}:
        cli.config_from_args(parser, args, base_config(kind, "fine-tune"))


def out_of_fold_lines(cv: dict[str, Any]) -> list[str]:
    """The strict and anchor-unseen out-of-fold agreement of a run's ``metrics["cv"]``, and the frozen
    centred embedding's on the same strict triplets with the paired test of the run against it."""
    lines = [(f"out of fold, {cv['repeats']} random splits × {cv['folds']} patient-disjoint folds "
              "(95 % CI resamples patients):")]
    for name, m in (("strict — all three photos unseen (the run's figure)", cv),
                    ("anchor unseen — a new photo among trained photos", cv["anchor_unseen"])):
        if m["balanced"] is None:
            lines.append(f"  {name}: no such triplets")
            continue
        lines.append(f"  {name}: balanced {agreement_text(m['balanced'], m['ci'], unit='%')} over "
                     f"{m['n']} scored triplets, {m['n_patients']} patients")
    base = cv.get("frozen_centred") or {}
    if base.get("balanced") is not None:
        lines.append("  frozen centred, the same strict triplets: balanced "
                     + agreement_text(base["balanced"], base["ci"], unit="%"))
    if "paired" in base:
        t = base["paired"]
        verdict = "beats it" if t["t_p"] < 0.05 and t["mean_diff"] > 0 else "does not beat it"
        lines.append(f"  this run − frozen centred: {100 * t['mean_diff']:+.1f} pp per patient over {t['n_patients']} "
                     f"patients (paired t-test p = {t['t_p']:.2g}, Wilcoxon p = {t['wilcoxon_p']:.2g}): the run "
                     f"{verdict} at p < 0.05")
    return lines


def agreement_lines(ws: Workspace, run: dict[str, Any], rows: list[tuple[str, int]], cfg: TriDermConfig
                    ) -> list[str]:
    """Evaluate every run of ``ws`` (the saved report the Report page shows); the lines of the labelled
    ``rows``' (label, run id) agreement, then what ``run``'s figure is: its strict out-of-fold lines for a
    supervised run, else how many of the expert's triplets were scored; last the verdict in words and the next
    step (:func:`core.eval.verdict.verdict`, the Report page's first line)."""
    report = run_report(ws, n_boot=1000, seed=cfg.seed)
    by_run = {r["run_id"]: r for r in report["rows"]}
    tag = " [SYNTHETIC phantom data]" if ws.is_synthetic else ""
    lines = [f"\nAgreement with the expert's triplets{tag}, % with 95% bootstrap intervals:",
             agreement_table([(label, by_run[rid]) for label, rid in rows])]
    cv = run["metrics"].get("cv")
    if cfg.supervise and cv:
        lines += ["(the supervised row is its strict out-of-fold figure, never its agreement with the triplets it "
                  "was trained on)", *out_of_fold_lines(cv)]
    else:
        lines.append(scored_note(by_run[run["id"]], len(ws.store.expert_triplets())))
    if cfg.supervise and not cv:
        lines.append("(the supervised row is scored on the triplets it was trained on: IN-SAMPLE, optimistic, not "
                     "its figure; --cv K scores it out of fold)")
    return [*lines, f"\nVerdict{tag}: {report['verdict']['line']}", f"Next step: {report['verdict']['next_step']}",
            f"evaluation saved (report run {report['run_id']}): the Report page shows it."]


def store_for_explore(ws: Workspace, run: dict[str, Any]) -> str:
    """Store what the Explore page shows of ``run`` — every photo's token map (a fine-tune or TriDerm-V run) and the
    map's UMAP at the page's default setting — so that a visit computes neither; returns where and how long."""
    from core.eval.explore import store_default_umaps
    from core.vision.token_maps import MAPPED_KINDS, write_token_maps

    t0 = time.perf_counter()
    lines = []
    if run["kind"] in MAPPED_KINDS:
        lines.append(f"token maps of every photo for Explore → {write_token_maps(ws, run['id'], progress=True)}")
    store_default_umaps(ws, run["id"])
    return "\n".join([*lines, f"Explore's map (UMAP) and token maps stored in {time.perf_counter() - t0:.1f}s"])


def main(argv: list[str] | None = None) -> int:
    """Embed a workspace in the ``--mode`` it asks for, compare with the baseline and print the agreement report."""
    parser = build_parser()
    args = cli.parse_args(parser, argv)
    if args.mode != "auto":
        configs = configs_of(parser, args, args.mode)  # every option checked before the workspace is touched
    else:
        check_values(parser, args)
    # torch, torchvision and scikit-learn: after the arguments (a fast --help)
    from core.vision.backbones import BackboneUnavailable, load_backbone
    from core.vision.baseline import embed_baseline
    from core.vision.finetune import train_finetuned
    from core.vision.triderm import auto_mode, baseline_run, check_workspace, compare_with_baseline, describe, train

    ws = open_workspace(args.workspace, parser, require_wounds=True)
    mode, why = (args.mode, "asked") if args.mode != "auto" else auto_mode(ws)
    if args.mode == "auto":
        configs = configs_of(parser, args, mode, chose=f"--mode auto chose {mode} ({why}). ")
    tuned = configs.get(FineTuneConfig)
    cfg = configs[TriDermConfig] if tuned is None else replace(configs[TriDermConfig], seed=tuned.seed)
    with user_errors(parser, BackboneUnavailable, ValueError, FileNotFoundError):
        backbone = load_backbone(cfg.backbone, layer=cfg.layer)
        check_workspace(ws, cfg)
    print(f"mode: {mode} ({why}) — {MODES[mode]}")
    if mode == "frozen":
        run_id = embed_baseline(ws, backbone, normalize="center-l2")
    elif tuned is not None:
        with user_errors(parser, ValueError):
            run_id = train_finetuned(ws, cfg.views, cfg.cv, cfg.cv_repeats, tuned, frozen=backbone)
    else:
        print(f"recipe: {'paper' if args.paper_recipe else 'real-data default'} — {describe(cfg, backbone.name)}")
        run_id = train(ws, cfg, backbone=backbone)
    run = ws.store.run(run_id)
    assert run is not None, run_id  # just recorded
    print(store_for_explore(ws, run))
    if mode not in ("frozen", "fine-tune"):
        t = run["metrics"]["timing"]
        print(f"features {t['features_s']:.1f}s, training {t['train_s']:.1f}s; run {run_id} → {ws.run_dir(run_id)}")
    if not ws.store.expert_triplets():
        print(f"run {run_id} recorded. No expert triplets yet: nothing to score the embedding against (the Triplets "
              "page collects them; the Report page then evaluates every run).")
        print(next_steps(ws))
        return 0
    if mode in ("frozen", "fine-tune"):
        base_id = baseline_run(ws, backbone)
        if base_id > run_id:  # made just now: in frozen mode the newest untrained run, the one Explore opens on
            print(store_for_explore(ws, ws.store.run(base_id) or run))
        rows = [(f"frozen {backbone.name} mean-pool (run {base_id})", base_id),
                (f"frozen {backbone.name}, centred unit length (run {run_id})" if mode == "frozen" else
                 f"last stage + head fine-tuned on the triplets (run {run_id})", run_id)]
    else:
        rows = [(label, rid) for label, rid, _ in compare_with_baseline(ws, run_id, backbone, cfg)]
    print("\n".join(agreement_lines(ws, run, rows, cfg)))
    print(next_steps(ws))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
