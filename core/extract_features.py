"""Fill a workspace's feature cache ahead of training, on one process or sharded over many.

    python -m core.extract_features --workspace WS [--backbone NAME] [--layer L] [--views K] [--seed S]
    torchrun --nproc_per_node 2 -m core.extract_features --workspace WS ...

TriDerm-V trains on K augmented views per photo computed once by the frozen backbone
(:mod:`core.vision.features`). This job computes them into the folder that
``python -m core.train_triderm`` with the same backbone, layer, views and seed reads. Under
``torchrun`` every rank takes every WORLD_SIZE-th photo (on ``cuda:LOCAL_RANK`` when CUDA is
present, else the CPU with gloo) and writes its own shards into that one folder; after a barrier
rank 0 writes the merged index and finishes the run record (kind ``features``). A killed run
resumes: photos in finished shards are not computed again.
"""
from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

from annotations.infra.workspace import Workspace
from annotations.store import runs
from core import cli
from core.runtime import init_distributed, open_workspace, user_errors
from core.vision.recipe import LITE0_DEFAULT_LAYER, LITE0_LAYERS, OFFLINE_DEFAULT, SHARD_PHOTOS
from core.vision.triderm_config import DEFAULT


def build_parser() -> argparse.ArgumentParser:
    """The job's argument parser."""
    parser = argparse.ArgumentParser(prog="python -m core.extract_features", description=__doc__.splitlines()[0])
    cli.add_workspace(parser)
    cli.add_device(parser, help="auto (CUDA when available), cpu or cuda (default: auto); under torchrun every "
                                "process uses its own cuda:LOCAL_RANK")
    cli.add_seed(parser, help="augmentation seed of the cached views (as core.train_triderm's --seed)")
    parser.add_argument("--backbone", default=DEFAULT.backbone, help="backbone registry name (default %(default)s)")
    parser.add_argument("--layer", default=None,
                        help=f"backbone layer ({OFFLINE_DEFAULT}: {', '.join(LITE0_LAYERS)}; default {LITE0_DEFAULT_LAYER})")
    parser.add_argument("--views", type=int, default=DEFAULT.views,
                        help="augmented views per photo (default %(default)s, as core.train_triderm)")
    parser.add_argument("--shard-size", type=int, default=SHARD_PHOTOS, help="photos per shard file (default %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.extract_features`` job; returns the exit status."""
    parser = build_parser()
    args = cli.parse_args(parser, argv)
    import torch.distributed as dist  # torch: after the arguments (a fast --help)

    from core.vision.backbones import BackboneUnavailable, load_backbone
    from core.vision.features import FeatureCache, workspace_wounds

    if args.views < 0 or args.shard_size < 1:
        parser.error(f"--views must be ≥ 0 and --shard-size ≥ 1, got {args.views} and {args.shard_size}")
    rank, world, device = init_distributed()
    distributed = dist.is_initialized()  # under torchrun, one process or many
    if rank == 0:
        open_workspace(args.workspace, parser, require_wounds=True)  # imports the demo into an empty one, once
    if distributed:
        dist.barrier()
    ws = Workspace(args.workspace)
    with user_errors(parser, BackboneUnavailable, ValueError):
        backbone = load_backbone(args.backbone, device=device, layer=args.layer)
    cache = FeatureCache(ws, backbone, seed=args.seed, shard_size=args.shard_size)
    image_ids, _ = workspace_wounds(ws)
    config = {"backbone": backbone.name, "layer": backbone.layer, "views": args.views, "shard_size": args.shard_size,
              "world_size": world, "backend": dist.get_backend() if distributed else None, "device": str(device),
              "n_images": len(image_ids), "cache": str(cache.root), "synthetic": ws.is_synthetic}
    # rank 0 records the run; the other ranks only compute their shards
    with (runs.recording(ws, runs.FEATURES, config, seed=args.seed) if rank == 0 else nullcontext()) as rec:
        t0 = time.perf_counter()
        computed = len(cache.extract(image_ids, args.views, rank=rank, world_size=world))
        seconds = time.perf_counter() - t0
        per_rank = [computed]
        if distributed:
            per_rank = [0] * world  # filled by all_gather_object
            dist.all_gather_object(per_rank, computed)
        if rec is not None:
            cache.write_index()  # every rank's shards, now that all are written
            disk = sum(p.stat().st_size for p in cache.shard_files())
            total = sum(per_rank)
            rec.metrics = {"computed": total, "computed_per_rank": per_rank, "cached_before": len(image_ids) - total,
                           "seconds": seconds, "disk_mib": disk / 2**20}
    if rec is not None:
        print(f"{len(image_ids)} photos × {args.views} views of {backbone.name}: computed {total} "
              f"(per rank {per_rank}), {len(image_ids) - total} already cached; {seconds:.1f}s; "
              f"{disk / 2**20:.1f} MiB in {cache.root} (run {rec.id})")
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
