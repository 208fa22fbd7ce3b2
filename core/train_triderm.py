"""Train TriDerm-V: wound attention pooling + predictor on a frozen backbone (TriDerm §2.2, §3.2).

Each step takes a batch of wounds, two different augmented views of each wound's photo,
pools each wound's tokens (attention or mean), maps them with the predictor (Linear +
LayerNorm, dim 512) and applies VICReg (default), InfoNCE or a triplet loss to the pair.
AdamW, cosine learning-rate schedule over all steps. With the feature cache (default) the
K views per photo are computed once by the frozen backbone and a step is a tensor gather;
``--no-cache`` augments and runs the backbone at every step (the naive baseline).

Inference: photos resized to the backbone's input size, no augmentation; a wound's
embedding is the head's output, an image's the mean of its wounds. The run (kind
``vision-triderm``) stores the loss per epoch, wound and image embeddings and, per wound
token, its attention weight and grid position (``token_wound``, ``token_pos``,
``token_weight``, ``grid``), then the command prints frozen baseline vs trained agreement.

    python -m core.train_triderm [--workspace W] [--backbone efficientnet-lite0] ...
"""
from __future__ import annotations

import argparse
from typing import Any

from core.runtime import open_workspace, user_errors
from core.vision.backbones import BackboneUnavailable, load_backbone
from core.vision.triderm import DEFAULTS, LOSSES, baseline_run, check_config, run_agreement, train


def agreement_table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """Plain-text table: balanced / micro / macro-F1 (%) and κ per labelled result."""
    width = max(len(label) for label, _ in rows)
    lines = [f"{'':{width}}  {'bal.':>6} {'micro':>6} {'mF1':>6} {'kappa':>6} {'n':>5}"]
    for label, m in rows:
        lines.append(f"{label:{width}}  {100 * m['balanced']:6.1f} {100 * m['micro']:6.1f} "
                     f"{100 * m['macro_f1']:6.1f} {m['kappa']:6.3f} {m['n']:5d}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.train_triderm", description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", default=None, help="workspace folder (default $TRIDERM_WORKSPACE or ./workspace)")
    parser.add_argument("--backbone", default=DEFAULTS["backbone"])
    parser.add_argument("--pooling", choices=["attention", "mean"], default=DEFAULTS["pooling"])
    parser.add_argument("--loss", choices=sorted(LOSSES), default=DEFAULTS["loss"])
    parser.add_argument("--epochs", type=int, default=DEFAULTS["epochs"])
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    parser.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    parser.add_argument("--weight-decay", type=float, default=DEFAULTS["weight_decay"])
    parser.add_argument("--views", type=int, default=DEFAULTS["views"], help="cached augmented views per photo")
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    parser.add_argument("--no-cache", action="store_true", help="augment + run the backbone every step (slow)")
    parser.add_argument("--dim", type=int, default=DEFAULTS["dim"])
    args = parser.parse_args(argv)
    options = dict(pooling=args.pooling, loss=args.loss, epochs=args.epochs, batch_size=args.batch_size,
                   lr=args.lr, weight_decay=args.weight_decay, views=args.views, seed=args.seed,
                   no_cache=args.no_cache, dim=args.dim)
    try:
        check_config({**DEFAULTS, **options})
    except ValueError as e:
        parser.error(str(e).replace("_", "-"))
    ws = open_workspace(args.workspace, parser, require_wounds=True)
    with user_errors(parser, BackboneUnavailable, ValueError, FileNotFoundError):
        backbone = load_backbone(args.backbone)
    run_id = train(ws, backbone=backbone, **options)
    run = ws.store.run(run_id)
    base_id = baseline_run(ws, backbone)
    rows = [(f"frozen {run['config']['backbone']} mean-pool (run {base_id})", run_agreement(ws, base_id)),
            (f"TriDerm-V {args.pooling}/{args.loss} (run {run_id})", run_agreement(ws, run_id))]
    ws.store.update_run(run_id, metrics={"agreement": rows[1][1], "baseline": {"run": base_id, **rows[0][1]}})
    tag = " [SYNTHETIC phantom data]" if ws.is_synthetic else ""
    print(f"\nAgreement with {len(ws.store.expert_triplets())} expert triplets{tag}:")
    print(agreement_table(rows))
    t = run["metrics"]["timing"]
    print(f"features {t['features_s']:.1f}s, training {t['train_s']:.1f}s; run {run_id} → {ws.run_dir(run_id)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

