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
from typing import TYPE_CHECKING, Any

from core import cli

if TYPE_CHECKING:  # torch: loaded once the arguments are read (a fast --help)
    from annotations.workspace import Workspace
    from core.nested.model import NestedData
    from core.nested.tabular import TabularSchema
    from core.nested.training import EpochLoop


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m core.train_slimp``."""
    p = argparse.ArgumentParser(prog="python -m core.train_slimp", description=__doc__.split("\n\n")[0])
    cli.add_workspace(p)
    cli.add_device(p, help="auto (CUDA when available), cpu or cuda (default: auto); under torchrun every process "
                   "uses the same kind")
    p.add_argument("--backbone", default="efficientnet-lite0@stage5",
                   help="backbone registry name with its layer (core.vision.backbones)")
    cli.add_epochs(p, 30)
    cli.deprecated(p, "--batch-patients", cli.add_batch_size(p, 8, help="B: patients per global batch (default 8)"))
    p.add_argument("--max-wounds", type=int, default=8, help="N_max: wounds sampled per patient and epoch")
    cli.add_lr(p, 1e-4)
    cli.add_lambda(p, 0.9, help="λ, weight of the inner loss (default 0.9)")
    p.add_argument("--temperature", type=float, default=0.07, help="initial temperature (learnable)")
    p.add_argument("--dim", type=int, default=128, help="embedding dimension")
    cli.add_crop_size(p, None, help="crop side in px (default: backbone size; 128 with --continual)")
    cli.add_seed(p)
    p.add_argument("--continual", action="store_true", help="train only the image stem and the tabular input embeddings")
    p.add_argument("--init", default=None, help="SLIMP checkpoint (path or run id) to start from")
    p.add_argument("--resume", type=int, default=None, metavar="RUN_ID", help="continue run RUN_ID from its checkpoint")
    p.add_argument("--target", default=None, help="categorical wound/photo/patient column for the linear probe and kNN")
    p.add_argument("--no-wound-meta", action="store_true", help="ablation: no wound-metadata encoder")
    p.add_argument("--no-patient-meta", action="store_true", help="ablation: no patient encoder (flat SLIMP)")
    p.add_argument("--ablation", action="store_true", help="probe w / w+h / w+h+x (paper Table 4 pattern); needs --target")
    p.add_argument("--permutations", type=int, default=100,
                   help="label permutations (within the same folds) for the probes' chance level (≥ 100)")
    p.add_argument("--name", default=None, help="run name")
    return p


def _validate(parser: argparse.ArgumentParser, args: argparse.Namespace, world: int) -> None:
    if args.epochs < 1:
        parser.error(f"--epochs must be ≥ 1, got {args.epochs}")
    if args.batch_size < 2 * world:
        parser.error(f"--batch-size must be ≥ 2 × processes ({2 * world}), got {args.batch_size}")
    if args.max_wounds < 1:
        parser.error(f"--max-wounds must be ≥ 1, got {args.max_wounds}")
    if not 0.0 <= args.lam <= 1.0:
        parser.error(f"--lambda must be in [0, 1], got {args.lam}")
    if args.lr <= 0 or args.temperature <= 0:
        parser.error("--lr and --temperature must be > 0")
    if args.permutations < 100:
        parser.error(f"--permutations must be ≥ 100 for a permutation chance level, got {args.permutations}")
    if args.no_wound_meta and args.no_patient_meta:
        parser.error("--no-wound-meta and --no-patient-meta together leave nothing to contrast the images with")


def _schemas(parser: argparse.ArgumentParser, data: NestedData, args: argparse.Namespace
             ) -> tuple[TabularSchema | None, TabularSchema | None]:
    from core.nested.tabular import TabularSchema

    exclude = [args.target] if args.target else []
    wound = None if args.no_wound_meta else TabularSchema.infer(data.wound_records, exclude=exclude)
    patient = None if args.no_patient_meta else TabularSchema.infer(data.patient_records, exclude=exclude)
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
          ) -> tuple[Workspace, NestedData, dict[str, Any] | None]:
    """The workspace (the demo imported once, by rank 0), its nested data and a ``--resume`` run's
    checkpoint, whose training settings replace those of ``args``; bad input exits through ``parser``."""
    import torch.distributed as dist

    from annotations.workspace import Workspace
    from core.nested.model import epoch_batches, load_nested_data
    from core.nested.training import read_resume
    from core.runtime import open_workspace, user_errors

    if rank == 0:
        open_workspace(args.workspace)  # imports the demo into an empty workspace, once
    if dist.is_initialized():
        dist.barrier()
    ws = Workspace(args.workspace)
    with user_errors(parser, ValueError):
        data = load_nested_data(ws)
        resume = None if args.resume is None else read_resume(ws, args.resume)
    if resume is not None:
        vars(args).update(resume["args"])
    if args.ablation and not args.target:
        columns = sorted({k for r in data.wound_records + data.patient_records for k in r})
        parser.error("--ablation compares linear probes of a target column: give --target COLUMN "
                     f"(columns: {', '.join(columns) or 'none'})"
                     + (f"; run {args.resume} was trained without --target" if args.resume is not None else ""))
    if args.target:
        try:
            data.labels(args.target)
        except KeyError as e:
            parser.error(e.args[0])
    smallest = min(map(len, epoch_batches(data.patient_wounds, args.batch_size, args.max_wounds, args.seed, 0)))
    if smallest < world:  # the same in every epoch: only the patients' order is resampled
        parser.error(f"a batch of {smallest} patients cannot be split over {world} processes")
    return ws, data, resume


def _config(args: argparse.Namespace, world: int, bb: Any, schemas: tuple[TabularSchema | None, TabularSchema | None],
            synthetic: bool) -> dict[str, Any]:
    """The run record's config."""
    import torch.distributed as dist

    from core.nested.training import TRAIN_KEYS

    return {"modality": "nested", **{k: getattr(args, k) for k in TRAIN_KEYS}, "epochs": args.epochs,
            "world_size": world, "backend": dist.get_backend() if dist.is_initialized() else None,
            "backbone_name": bb.name, "feat_dim": bb.channels,
            "trainable": "stem + tabular input embeddings" if args.continual
            else "projection + tabular encoders + phenotype + temperature (frozen backbone, cached features)",
            "wound_fields": None if schemas[0] is None else schemas[0].names,
            "patient_fields": None if schemas[1] is None else schemas[1].names,
            "synthetic": synthetic}


def _loop(parser: argparse.ArgumentParser, args: argparse.Namespace, ws: Workspace, data: NestedData,
          resume: dict[str, Any] | None, rank: int, world: int, device: Any) -> tuple[EpochLoop, list[str]]:
    """Backbone, image and metadata inputs, model, optimizer and run record of this process: its
    epoch loop and the tensors ``--init`` left freshly initialised."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from core.nested.model import SLIMP
    from core.nested.training import (
        TRAIN_KEYS,
        EpochLoop,
        checkpoint_path,
        image_inputs,
        load_init,
        make_optimizer,
        open_run,
        resumed_schemas,
    )
    from core.runtime import user_errors
    from core.vision.backbones import BackboneUnavailable, load_backbone

    with user_errors(parser, BackboneUnavailable, ValueError, FileNotFoundError):
        bb = load_backbone(args.backbone, device=device)
    args.crop_size = args.crop_size or (128 if args.continual else bb.input_size)
    schemas = resumed_schemas(resume) if resume is not None else _schemas(parser, data, args)
    wound_tab, patient_tab = (None if s is None else s.encode(r)
                              for s, r in zip(schemas, (data.wound_records, data.patient_records)))
    images, masks, trunk, stem = image_inputs(ws, data, bb, args.crop_size, args.continual, rank)
    torch.manual_seed(args.seed)
    model = SLIMP(bb.channels, *schemas, dim=args.dim, lam=args.lam, temperature=args.temperature,
                  trunk=trunk).to(device)
    skipped: list[str] = []
    if args.init and resume is None:
        init_path = checkpoint_path(ws, args.init)
        if not init_path.exists():
            parser.error(f"--init {args.init}: no checkpoint at {init_path}")
        with user_errors(parser, ValueError):
            skipped = load_init(model, init_path)
    optimizer = make_optimizer(model, args.continual, stem, args.lr, resume)
    distributed = dist.is_initialized()
    net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if distributed else model
    loop = EpochLoop(ws, model, net, optimizer, (images, masks, wound_tab, patient_tab),
                     {k: getattr(args, k) for k in TRAIN_KEYS}, device, args.resume,
                     dist.new_group() if distributed else None, rank, world)
    if resume is not None:
        loop.losses = resume["losses"]
        loop.history = {k: list(resume.get("history", {}).get(k, [])) for k in ("inner", "outer")}
    if rank == 0:
        loop.run_id = open_run(ws, args.resume, _config(args, world, bb, schemas, ws.is_synthetic), args.seed,
                               args.name, 0 if resume is None else resume["epoch"], schemas)
    return loop, skipped


def main(argv: list[str] | None = None) -> int:
    """Train SLIMP on a workspace (one process of a torchrun group, or alone), evaluate it and print
    the report on rank 0; 0 on success, 130 when interrupted."""
    parser = build_parser()
    args = cli.parse_args(parser, argv)
    import torch.distributed as dist  # torch: after the arguments (a fast --help)

    from core.runtime import init_distributed

    rank, world, device = init_distributed()
    _validate(parser, args, world)
    ws, data, resume = _open(parser, args, rank, world)
    loop, skipped = _loop(parser, args, ws, data, resume, rank, world, device)
    if skipped and rank == 0:
        print(f"--init: kept fresh initialisation for {len(skipped)} tensors whose shape changed: {skipped}")
    try:
        loop.run(data.patient_wounds, 0 if resume is None else resume["epoch"], args.epochs)
        if rank == 0:
            print(report(loop.finish(data, args), ws.is_synthetic, loop.opened_run))
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

