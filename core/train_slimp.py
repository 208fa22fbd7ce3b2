"""Train and evaluate SLIMP (nested contrastive: wound images + wound + patient metadata).

    python -m core.train_slimp --workspace WS --epochs 30 --target rdeb_subtype --ablation
    torchrun --nproc_per_node 2 -m core.train_slimp --workspace WS ...

SLIMP: papers/slimp_*.txt §3, appendix C–D; METHODS.md §2.

Modes
- full (default): the backbone stays frozen, so its pooled wound-crop features are computed
  once and cached (``cache/slimp/``); training updates the image projection, both tabular
  encoders, the phenotype Linear and the temperature on the cached features. (The paper
  also fine-tunes its ViT in this stage; on CPU that is out of reach, hence the cache.)
- ``--continual``: SLIMP's continual pre-training (§3.2) — ONLY the backbone's stem/patch
  embedding (``Backbone.stem_parameters()``) and the tabular input embeddings are trained;
  the backbone runs on every step (crops of ``--crop-size`` px, default 128) and everything
  else, including the temperature, is frozen. ``--init`` loads a pre-trained SLIMP
  checkpoint (tensors whose shape changed, e.g. new metadata fields, stay freshly initialised).

Distributed (torchrun; gloo on CPU, nccl on GPU): the global batches are identical on every
process (deterministic in seed and epoch); each process takes a contiguous shard of the
batch's patients. The inner loss is local. For the outer loss, z and x are gathered with
``torch.distributed.nn.functional.all_gather`` (differentiable; on a separate process group
so its backward collectives never interleave with DDP's gradient all-reduce). Its backward
sums the gradient of every process's copy of L_outer, i.e. W × ∂L_outer/∂(own rows), and
DDP then averages over the W processes, which restores ∂L_outer; the local inner sum is
scaled by W for the same averaging, so the gradient equals the single-process gradient of
λ · mean_p L_inner^p + (1 − λ) · L_outer over the global batch.
"""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from typing import TYPE_CHECKING, Any

from core import cli
from core.nested.config import TRAIN_KEYS, SlimpConfig
from core.runtime import user_errors

if TYPE_CHECKING:  # torch: loaded once the arguments are read (a fast --help)
    from annotations.infra.workspace import Workspace
    from core.nested.model import NestedData
    from core.nested.tabular import TabularSchema
    from core.nested.training import EpochLoop


#: each :class:`~core.nested.config.SlimpConfig` field's option (``lam``: ``--lambda``), in ``--help`` order
FLAGS = {f.name: cli.option_flag(f) for f in fields(SlimpConfig)}


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m core.train_slimp``: workspace, device, one option per
    :class:`~core.nested.config.SlimpConfig` field, ``--resume`` and ``--name``."""
    p = argparse.ArgumentParser(prog="python -m core.train_slimp", description=__doc__.split("\n\n")[0],
                                epilog="With --resume the run trains on its checkpoint's settings: giving one of "
                                       f"{', '.join(FLAGS[k] for k in TRAIN_KEYS)} is an error.")
    cli.add_workspace(p)
    cli.add_device(p, help="auto (CUDA when available), cpu or cuda (default: auto); under torchrun every process "
                   "uses the same kind")
    cli.add_config_options(p, {"": {"default": SlimpConfig()}})
    cli.deprecated(p, "--batch-patients", p._option_string_actions["--batch-size"])
    p.add_argument("--resume", type=int, default=None, metavar="RUN_ID", help="continue run RUN_ID from its checkpoint")
    p.add_argument("--name", default=None, help="run name")
    return p


def config_of(parser: argparse.ArgumentParser, args: argparse.Namespace, resumed: Mapping[str, Any] | None = None
              ) -> SlimpConfig:
    """The run's config: the defaults with the options given; ``resumed``: a ``--resume`` checkpoint's
    :data:`~core.nested.config.TRAIN_KEYS` settings, which replace the defaults (giving one of them is an error:
    it would be ignored). ``--permutations`` without a target is an error too (with ``--resume``, once ``resumed``
    gives the checkpoint's target); a bad value exits through ``parser.error`` naming the option."""
    cfg = cli.config_from_args(parser, args, SlimpConfig())
    if resumed is not None:
        given = [FLAGS[k] for k in cli.given_options(args, TRAIN_KEYS)]
        if given:
            parser.error(f"{', '.join(given)}: not read with --resume {args.resume}, which trains on the settings of "
                         f"its checkpoint; leave {'it' if len(given) == 1 else 'them'} out")
        with user_errors(parser, ValueError):
            cfg = replace(cfg, **resumed)
    target_known = args.resume is None or resumed is not None
    if args.permutations is not None and not cfg.target and target_known:
        parser.error("--permutations: read only with --target (the probes' chance level); leave it out")
    return cfg


def _validate(parser: argparse.ArgumentParser, cfg: SlimpConfig, world: int) -> None:
    if cfg.batch_size < 2 * world:
        parser.error(f"--batch-size must be ≥ 2 × processes ({2 * world}), got {cfg.batch_size}")


def _schemas(parser: argparse.ArgumentParser, data: NestedData, cfg: SlimpConfig
             ) -> tuple[TabularSchema | None, TabularSchema | None]:
    from core.nested.tabular import TabularSchema

    exclude = [cfg.target] if cfg.target else []
    wound = None if cfg.no_wound_meta else TabularSchema.infer(data.wound_records, exclude=exclude)
    patient = None if cfg.no_patient_meta else TabularSchema.infer(data.patient_records, exclude=exclude)
    if wound is not None and len(wound) == 0:
        parser.error("no usable wound/photo metadata column in the workspace; use --no-wound-meta")
    if patient is not None and len(patient) == 0:
        parser.error("no usable patient metadata column in the workspace; use --no-patient-meta")
    return wound, patient


def _fmt(v: float) -> str:
    return "  n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:5.1f}"


def report(metrics: dict[str, Any], synthetic: bool, run_id: int) -> str:
    """Human-readable summary of :func:`evaluate_model` figures."""
    from core.nested.model import MIN_PATIENTS_PER_FOLD

    lines = [f"SLIMP run {run_id}" + ("  [SYNTHETIC phantom data]" if synthetic else ""),
             f"  {metrics['n_wounds']} wounds, {metrics['n_patients']} patients, {metrics['n_photos']} photos"]
    if "triplets" in metrics:
        t = metrics["triplets"]
        lines.append(f"  triplet agreement (photo = mean of its wounds' [w,h]): balanced {_fmt(t['balanced'])}%  "
                     f"micro {_fmt(t['micro'])}%  kappa {t['kappa']:.3f}  (n={t['n']})")
    if "retrieval" in metrics:
        r = metrics["retrieval"]
        lines.append(f"  image→wound-metadata retrieval: R@1 {_fmt(r['R@1'])}%  R@5 {_fmt(r['R@5'])}%  "
                     f"R@10 {_fmt(r['R@10'])}%  (chance R@1 {_fmt(r['chance@1'])}%)")
    if "probe" in metrics:
        pr = metrics["probe"]
        classes = pr["classes"] if len(pr["classes"]) <= 6 else f"{len(pr['classes'])} classes"
        lines.append(f"  probe target {pr['target']!r} ({pr['level']} level, {pr['n']} {pr['rows']} rows, {classes}, "
                     f"majority {_fmt(pr['majority'])}%; {pr['folds']} patient-disjoint folds, ≥ {pr['patients_per_fold']} "
                     f"patients each; chance = mean over {pr['permutations']} label permutations within the same folds, "
                     f"p = permutation p-value)")
        if pr["patients_per_fold"] < MIN_PATIENTS_PER_FOLD:
            lines.append(f"  WARNING: fewer than {MIN_PATIENTS_PER_FOLD} patients per held-out fold — probe figures are noisy")
        lines.append(_probe_line("concat(w,h,x)", pr))
    if "ablation" in metrics:
        lines.append("  ablation (paper Table 4 pattern; same trained model, features given to the probe):")
        lines.extend(_probe_line(name, pr) for name, pr in metrics["ablation"].items())
    return "\n".join(lines)


def _vs_chance(value: float, chance: float, p: float) -> str:
    """A probe figure beside its permutation chance level; "not above chance" unless p < 0.05."""
    verdict = "" if p < 0.05 else ", not above chance"
    return f"{_fmt(value)} (chance {_fmt(chance).strip()}, p {p:.2f}{verdict})"


def _probe_line(name: str, pr: dict[str, Any]) -> str:
    def cells(fig: dict, chance: dict, p: dict) -> str:
        return "  ".join(f"{label} {_vs_chance(fig[m], chance[m], p[m])}" for m, label in (("acc", "acc"), ("bacc", "BA")))

    rows = [f"LP{float(f) * 100:g}%".ljust(7) + cells(pr["linear"][f], pr["chance"]["linear"][f], pr["p"]["linear"][f])
            for f in pr["linear"]]
    rows.append("kNN".ljust(7) + cells(pr["knn"], pr["chance"]["knn"], pr["p"]["knn"]))
    return f"    {name}\n" + "\n".join(f"      {r}" for r in rows)


def _open(parser: argparse.ArgumentParser, args: argparse.Namespace, rank: int, world: int
          ) -> tuple[Workspace, NestedData, dict[str, Any] | None, SlimpConfig]:
    """The workspace (the demo imported once, by rank 0), its nested data, a ``--resume`` run's checkpoint and
    the run's config (:func:`config_of`: the checkpoint's training settings); bad input exits through ``parser``."""
    import torch.distributed as dist

    from annotations.infra.workspace import Workspace
    from core.nested.model import epoch_batches, load_nested_data
    from core.nested.training import read_resume
    from core.runtime import open_workspace

    if rank == 0:
        open_workspace(args.workspace)  # imports the demo into an empty workspace, once
    if dist.is_initialized():
        dist.barrier()
    ws = Workspace(args.workspace)
    with user_errors(parser, ValueError):
        data = load_nested_data(ws)
        resume = None if args.resume is None else read_resume(ws, args.resume)
    cfg = config_of(parser, args, None if resume is None else resume["args"])
    if cfg.ablation and not cfg.target:
        columns = sorted({k for r in data.wound_records + data.patient_records for k in r})
        parser.error("--ablation compares linear probes of a target column: give --target COLUMN "
                     f"(columns: {', '.join(columns) or 'none'})"
                     + (f"; run {args.resume} was trained without --target" if args.resume is not None else ""))
    if cfg.target:
        try:
            data.labels(cfg.target)
        except KeyError as e:
            parser.error(e.args[0])
    _validate(parser, cfg, world)
    smallest = min(map(len, epoch_batches(data.patient_wounds, cfg.batch_size, cfg.max_wounds, cfg.seed, 0)))
    if smallest < world:  # the same in every epoch: only the patients' order is resampled
        parser.error(f"a batch of {smallest} patients cannot be split over {world} processes")
    return ws, data, resume, cfg


def _config(cfg: SlimpConfig, world: int, bb: Any, schemas: tuple[TabularSchema | None, TabularSchema | None],
            synthetic: bool) -> dict[str, Any]:
    """The run record's config: every :class:`~core.nested.config.SlimpConfig` field (its crop size resolved)
    and what the run was trained on."""
    import torch.distributed as dist

    return {"modality": "nested", **asdict(cfg), "world_size": world, "backend": dist.get_backend() if dist.is_initialized() else None,
            "backbone_name": bb.name, "feat_dim": bb.channels,
            "trainable": "stem + tabular input embeddings" if cfg.continual
            else "projection + tabular encoders + phenotype + temperature (frozen backbone, cached features)",
            "wound_fields": None if schemas[0] is None else schemas[0].names,
            "patient_fields": None if schemas[1] is None else schemas[1].names,
            "synthetic": synthetic}


def _loop(parser: argparse.ArgumentParser, cfg: SlimpConfig, ws: Workspace, data: NestedData,
          resume: dict[str, Any] | None, run: tuple[int | None, str | None], rank: int, world: int, device: Any
          ) -> tuple[EpochLoop, list[str]]:
    """Backbone, image and metadata inputs, model, optimizer and run record of this process (``run``: the
    ``--resume`` run id and the ``--name``): its epoch loop and the tensors ``--init`` left freshly initialised."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from core.nested.model import SLIMP
    from core.nested.training import (
        EpochLoop,
        checkpoint_path,
        image_inputs,
        load_init,
        make_optimizer,
        open_run,
        resumed_schemas,
    )
    from core.vision.backbones import BackboneUnavailable, load_backbone

    with user_errors(parser, BackboneUnavailable, ValueError, FileNotFoundError):
        bb = load_backbone(cfg.backbone, device=device)
    cfg = replace(cfg, crop_size=cfg.crop_size or (128 if cfg.continual else bb.input_size))
    schemas = resumed_schemas(resume) if resume is not None else _schemas(parser, data, cfg)
    wound_tab, patient_tab = (None if s is None else s.encode(r)
                              for s, r in zip(schemas, (data.wound_records, data.patient_records)))
    assert cfg.crop_size is not None, "resolved above"
    images, masks, trunk, stem = image_inputs(ws, data, bb, cfg.crop_size, cfg.continual, rank)
    torch.manual_seed(cfg.seed)
    model = SLIMP(bb.channels, *schemas, dim=cfg.dim, lam=cfg.lam, temperature=cfg.temperature,
                  trunk=trunk).to(device)
    skipped: list[str] = []
    if cfg.init and resume is None:
        init_path = checkpoint_path(ws, cfg.init)
        if not init_path.exists():
            parser.error(f"--init {cfg.init}: no checkpoint at {init_path}")
        with user_errors(parser, ValueError):
            skipped = load_init(model, init_path)
    optimizer = make_optimizer(model, cfg.continual, stem, cfg.lr, resume)
    distributed = dist.is_initialized()
    net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if distributed else model
    loop = EpochLoop(ws, model, net, optimizer, (images, masks, wound_tab, patient_tab), cfg, device, run[0],
                     dist.new_group() if distributed else None, rank, world)
    if resume is not None:
        loop.losses = resume["losses"]
        loop.history = {k: list(resume.get("history", {}).get(k, [])) for k in ("inner", "outer")}
    if rank == 0:
        loop.run_id = open_run(ws, run[0], _config(cfg, world, bb, schemas, ws.is_synthetic), cfg.seed, run[1],
                               0 if resume is None else resume["epoch"], schemas)
    return loop, skipped


def main(argv: list[str] | None = None) -> int:
    """Train SLIMP on a workspace (one process of a torchrun group, or alone), evaluate it and print
    the report on rank 0; 0 on success, 130 when interrupted."""
    parser = build_parser()
    args = cli.parse_args(parser, argv)
    import torch.distributed as dist  # torch: after the arguments (a fast --help)

    from core.runtime import init_distributed

    config_of(parser, args)  # every option checked before the workspace is touched
    rank, world, device = init_distributed()
    ws, data, resume, cfg = _open(parser, args, rank, world)
    loop, skipped = _loop(parser, cfg, ws, data, resume, (args.resume, args.name), rank, world, device)
    if skipped and rank == 0:
        print(f"--init: kept fresh initialisation for {len(skipped)} tensors whose shape changed: {skipped}")
    try:
        loop.run(data.patient_wounds, 0 if resume is None else resume["epoch"], cfg.epochs)
        if rank == 0:
            print(report(loop.finish(data), ws.is_synthetic, loop.opened_run))
    except KeyboardInterrupt:
        if rank == 0 and loop.run_id is not None:
            ws.store.finish_run(loop.run_id, status="stopped", message="interrupted")
        return 130
    except BaseException as e:
        if rank == 0 and loop.run_id is not None:
            ws.store.finish_run(loop.run_id, status="failed", message=f"{type(e).__name__}: {e}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

