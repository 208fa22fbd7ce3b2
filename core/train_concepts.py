"""Train the image–text model on wound crops + descriptions: CLIP, SigLIP, MAKE or ConceptCLIP.

``python -m core.train_concepts --objective make|conceptclip|clip|siglip`` fits the
projection heads (and the top ``--unlock-image``/``--unlock-text`` tower blocks) on a
patient-grouped training split, evaluates on the held-out wounds and stores a ``concepts``
run: embeddings.npz (wound and photo embeddings, per-wound concept scores global/local/
fused, patch heatmaps, crop boxes, split) and metrics (loss curve, held-out concept AUROC).

Frozen tower levels are computed once and cached (LiT); only the unlocked top blocks run
at every step. Concept labels for AUROC: the phantom truth (``truth/concepts.csv``) when the
workspace has it, else the description tagger on the held-out wounds.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from annotations.fileio import atomic_write
from core import cli
from core.concepts.defaults import OBJECTIVES, OFFLINE_DEFAULT


# ----------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.train_concepts", description=__doc__.split("\n\n")[0])
    cli.add_workspace(p)
    cli.add_device(p)
    p.add_argument("--objective", choices=OBJECTIVES, default="make")
    p.add_argument("--model", default=OFFLINE_DEFAULT, help=f"image–text model ({OFFLINE_DEFAULT} offline, dermlip online)")
    cli.add_epochs(p, 30)
    cli.deprecated(p, "--batch", cli.add_batch_size(p, 32))
    cli.add_lr(p, 1e-3, help="learning rate of the projection heads (default 1e-3)")
    p.add_argument("--tower-lr", type=float, default=1e-4)
    p.add_argument("--unlock", type=int, default=0, help="unlock the top N blocks of both towers (−1 = all)")
    p.add_argument("--unlock-image", type=int, default=None, help="override --unlock for the image tower")
    p.add_argument("--unlock-text", type=int, default=None, help="override --unlock for the text tower")
    cli.deprecated(p, "--size", cli.add_crop_size(p, 160))
    p.add_argument("--holdout", type=float, default=0.3, help="held-out fraction (patient-grouped)")
    p.add_argument("--groups", default="wound", help="concept vocabulary groups, comma-separated")
    p.add_argument("--target", default="body_region", help="metadata column for the concept bottleneck")
    p.add_argument("--beta", type=float, default=0.5, help="local/global fusion weight")
    cli.add_seed(p)
    p.add_argument("--untrained", action="store_true", help="evaluate the untrained heads (epochs ignored)")
    return p


class UsageError(ValueError):
    """A flag combination that cannot give any result (reported as a parser error, exit 2)."""


def run(args: argparse.Namespace, progress: bool = True) -> dict[str, Any]:
    """Train + evaluate + store; returns the run's metrics."""
    # torch and the models: here, not at import (a fast --help)
    import torch

    from core.concepts.dual_encoder import load_vlm
    from core.concepts.scores import ConceptBottleneck, ConceptScorer
    from core.concepts.training import (
        SIGMOID_OBJECTIVES,
        TrainConfig,
        Trainer,
        build_text_inputs,
        concept_auroc,
        concept_labels,
        load_pairs,
        split_holdout,
        target_values,
    )
    from core.concepts.vocabulary import ConceptTagger, load_vocab
    from core.runtime import open_workspace, save_embeddings

    ws = open_workspace(args.workspace)
    try:
        concepts = load_vocab(groups=[g.strip() for g in args.groups.split(",") if g.strip()])
    except ValueError as e:
        raise UsageError(f"--groups {args.groups!r}: {e}") from None
    tagger = ConceptTagger(load_vocab(groups=("wound",)))
    pairs = load_pairs(ws, size=args.crop_size)
    names, labels, source = concept_labels(ws, pairs, tagger)
    if not {c.name for c in concepts} & set(names):
        raise UsageError(f"--groups {args.groups!r}: none of its concepts has labels in this workspace "
                         f"({source}: {', '.join(names)}), so there is no AUROC to report; use --groups wound")
    held = split_holdout(pairs.patient_ids, args.holdout, args.seed)
    cfg = TrainConfig(objective=args.objective, epochs=args.epochs, batch=args.batch_size, lr=args.lr,
                      tower_lr=args.tower_lr,
                      image_unlock=args.unlock if args.unlock_image is None else args.unlock_image,
                      text_unlock=args.unlock if args.unlock_text is None else args.unlock_text, seed=args.seed)
    try:
        cfg.validate()
    except ValueError as e:
        raise SystemExit(str(e)) from None
    config = {**vars(args), "modality": "concept", "n_wounds": len(pairs), "n_heldout": int(held.sum()),
              "synthetic": ws.is_synthetic}
    run_id = ws.store.start_run("concepts", config, seed=args.seed, name=f"{args.objective}{' (untrained)' if args.untrained else ''}")
    try:
        t0 = time.perf_counter()
        model = load_vlm(args.model, seed=args.seed)
        texts = build_text_inputs(pairs, tagger)
        try:
            trainer = Trainer(model, pairs, texts, cfg)
        except ValueError as e:
            raise UsageError(f"--objective {args.objective} --model {args.model}: {e}") from None
        history: list[float] = []
        stamps = [time.perf_counter()]

        def on_epoch(epoch: int, losses: list[float]) -> None:
            stamps.append(time.perf_counter())
            ws.store.update_run(run_id, progress=(epoch + 1) / cfg.epochs, metrics={"loss": losses})

        if not args.untrained:
            history = trainer.fit(np.flatnonzero(~held), progress=progress, on_epoch=on_epoch)
        g, patches, grid = trainer.embed()
        scorer = ConceptScorer(model, concepts, beta=args.beta, sigmoid=args.objective in SIGMOID_OBJECTIVES)
        sc = scorer.scores(g, patches)
        heat = scorer.heatmaps(patches, grid)
        col = {n: i for i, n in enumerate(scorer.names)}
        common = [n for n in names if n in col]
        metrics: dict[str, Any] = {"loss": history, "auroc_source": source, "seconds": round(time.perf_counter() - t0, 1),
                                   "epoch_seconds": [round(b - a, 4) for a, b in zip(stamps, stamps[1:])]}
        for kind in ("global", "local", "fused"):
            s = sc[kind][held][:, [col[n] for n in common]]
            metrics[f"auroc_{kind}"] = concept_auroc(s, labels[held][:, [names.index(n) for n in common]], common)
        ys = target_values(pairs, args.target)
        known = np.array([y is not None for y in ys])
        if known.sum() >= 4 and len({y for y in ys if y}) >= 2:
            cbm = ConceptBottleneck(scorer.names, random_state=args.seed)
            tr, te = known & ~held, known & held
            cbm.fit(sc["fused"][tr], [ys[i] for i in np.flatnonzero(tr)])
            metrics["bottleneck"] = {"target": args.target, "top3": cbm.top_concepts(3),
                                     "heldout_accuracy": cbm.score(sc["fused"][te], [ys[i] for i in np.flatnonzero(te)])
                                     if te.any() else None}
        photo_ids = sorted(set(pairs.image_ids))
        gi = g.numpy()
        photo_emb = np.stack([gi[[i for i, p in enumerate(pairs.image_ids) if p == pid]].mean(0) for pid in photo_ids])
        save_embeddings(ws, run_id, photo_ids, image_emb=photo_emb, wound_keys=pairs.keys, wound_emb=gi,
                        concept_names=np.asarray(scorer.names), concept_global=sc["global"],
                        concept_local=sc["local"], concept_fused=sc["fused"],
                        concept_heatmaps=heat.astype(np.float16), crop_boxes=pairs.boxes, heldout=held)
        with atomic_write(ws.run_dir(run_id) / "heads.pt", "wb", suffix=".pt") as fh:
            torch.save(model.extra_state_dict(), fh)
        ws.store.finish_run(run_id, metrics=metrics, artifacts={"heads": str(ws.run_dir(run_id) / "heads.pt")})
        metrics["run_id"] = run_id
        return metrics
    except BaseException as e:
        ws.store.finish_run(run_id, status="stopped" if isinstance(e, KeyboardInterrupt) else "failed",
                            metrics={"error": str(e)})
        raise


def _print(metrics: dict[str, Any]) -> None:
    print(f"run {metrics['run_id']}  concept AUROC on held-out wounds ({metrics['auroc_source']})")
    fused = metrics["auroc_fused"]
    for name in fused:
        print(f"  {name:24s} global {metrics['auroc_global'].get(name, float('nan')):.3f}  "
              f"local {metrics['auroc_local'].get(name, float('nan')):.3f}  fused {fused[name]:.3f}")
    if "bottleneck" in metrics:
        b = metrics["bottleneck"]
        print(f"concept bottleneck → {b['target']} (held-out accuracy {b['heldout_accuracy']})")
        for cls, top in b["top3"].items():
            print(f"  {cls:16s} " + ", ".join(f"{n} ({w:+.2f})" for n, w in top))


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = cli.parse_args(parser, argv)
    if not 0 < args.holdout < 1:
        parser.error("--holdout must be in (0, 1)")
    if not 0 <= args.beta <= 1:
        parser.error("--beta must be in [0, 1]")
    from core.concepts.dual_encoder import VLMUnavailable

    try:
        metrics = run(args)
    except VLMUnavailable as e:
        parser.exit(2, f"error: {e}\n")
    except UsageError as e:
        parser.error(str(e))
    _print(metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())

