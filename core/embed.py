"""Frozen vision baseline: mean of each wound's backbone tokens (TriDerm §3.3 baselines).

The photo is resized to the backbone's own input size (no augmentation); a wound's
embedding is the mean of its tokens (:mod:`core.features`), an image's embedding the mean
of its wounds. Recorded as a ``vision-baseline`` run.

    python -m core.embed --backbone efficientnet-lite0 [--workspace W]
"""
from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch

from annotations.workspace import Workspace
from core.backbones import OFFLINE_DEFAULT, Backbone, BackboneUnavailable, load_backbone
from core.features import FeatureCache, TokenBank, workspace_wounds
from core.pooling import MeanPooling
from core.runs import save_embeddings

DEMO_SEED = 0


def ensure_images(ws: Workspace, progress: bool = True) -> dict | None:
    """Build and import the phantom demo when the workspace has no photos; its summary or None."""
    if ws.store.images():
        return None
    from annotations.dataset import import_dataset
    from core.phantoms import build

    with tempfile.TemporaryDirectory(prefix="triderm-demo-") as tmp:
        build(tmp, seed=DEMO_SEED, progress=progress)
        return import_dataset(ws, tmp)


def open_workspace(workspace: str | None) -> Workspace:
    """Open a workspace for a CLI, importing the SYNTHETIC phantom demo into an empty one."""
    ws = Workspace(workspace)
    demo = ensure_images(ws)
    if demo:
        print(f"empty workspace: imported the SYNTHETIC phantom demo ({demo['images']} photos, "
              f"{demo['wounds']} wounds, {demo['triplets']} expert triplets)")
    return ws


def image_means(wound_keys: list[tuple[str, int]], wound_emb: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Image ids (sorted) and the mean of each image's wound embeddings."""
    ids = sorted({k[0] for k in wound_keys})
    row = {i: n for n, i in enumerate(ids)}
    index = np.array([row[k[0]] for k in wound_keys])
    sums = np.zeros((len(ids), wound_emb.shape[1]))
    np.add.at(sums, index, wound_emb)
    return ids, sums / np.bincount(index, minlength=len(ids))[:, None]


def embed_baseline(ws: Workspace, backbone: Backbone, bank: TokenBank | None = None, progress: bool = True) -> int:
    """Record the frozen mean-pool baseline of ``backbone`` as a run; returns its id."""
    run_id = ws.store.start_run("vision-baseline", {
        "modality": "vision", "backbone": backbone.name, "pooling": "mean", "input_size": backbone.input_size,
        "token_rule": "cell area fraction >= 0.5, else the wound's best cell", "synthetic": ws.is_synthetic})
    try:
        if bank is None:
            image_ids, keys = workspace_wounds(ws)
            bank = TokenBank(FeatureCache(ws, backbone).build(image_ids, 0, progress), keys)
        with torch.no_grad():
            wound_emb, _ = MeanPooling()(bank.eval_tokens, bank.eval_segment, len(bank))
        wound_emb = wound_emb.numpy()
        ids, image_emb = image_means(bank.wound_keys, wound_emb)
        save_embeddings(ws, run_id, ids, image_emb=image_emb, wound_keys=bank.wound_keys, wound_emb=wound_emb)
        ws.store.finish_run(run_id, metrics={"n_images": len(ids), "n_wounds": len(bank)})
    except BaseException as e:
        ws.store.finish_run(run_id, status="stopped" if isinstance(e, KeyboardInterrupt) else "failed",
                            metrics={"error": str(e)})
        raise
    return run_id


def open_for_cli(parser: argparse.ArgumentParser, workspace: str | None,
                 backbone_name: str) -> tuple[Workspace, Backbone]:
    """The CLIs' common start: open the workspace (importing the demo into an empty one),
    require outlined wounds and load the backbone — user errors exit through ``parser``."""
    ws = open_workspace(workspace)
    if not ws.store.wounds():
        parser.error(f"{ws.root}: no wounds outlined yet — draw wound masks first")
    try:
        return ws, load_backbone(backbone_name)
    except (BackboneUnavailable, ValueError, FileNotFoundError) as e:
        parser.error(str(e))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.embed", description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", default=None, help="workspace folder (default $TRIDERM_WORKSPACE or ./workspace)")
    parser.add_argument("--backbone", default=OFFLINE_DEFAULT, help=f"backbone name (default {OFFLINE_DEFAULT})")
    args = parser.parse_args(argv)
    ws, backbone = open_for_cli(parser, args.workspace, args.backbone)
    run_id = embed_baseline(ws, backbone)
    print(f"run {run_id}: frozen {backbone.name} mean-pool baseline → {ws.run_dir(run_id)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
