"""The paper's three orderings on SYNTHETIC phantom v2, several seeds, paired tests.

TriDerm (METHODS.md §1) claims (a) attention > mean pooling (TriDerm-V), (b) VICReg > triplet >
contrastive loss (TriDerm-V), (c) uncertainty fusion > each modality (SOE text on phantom text-oracle
triplets, TriDerm-V vision). For every seed s a fresh phantom world (``core.phantoms.build`` seed s)
is imported into a workspace; TriDerm-V is trained with seed s in four configurations; the phantom
text oracle (descriptions only) answers every question and SOE (dim 4) embeds its answers;
uncertainty and similarity fusion combine TriDerm-V (attention/VICReg) with SOE. All are scored
by balanced agreement with the phantom expert's triplets, beside the planted ceilings and a
diagnostic of the planted pooling advantage (frozen features mean-pooled with and without the
distractor tokens, from the planted masks).

A claim "a > b" is tested with a one-sided paired t-test over seeds (scipy ``ttest_rel``,
``alternative="greater"``) and holds only when p < 0.05. The losses run at the paper's best
settings (METHODS.md §1: contrastive batch 128 / lr 1e-3, triplet batch 8), everything else at
TriDerm-V's defaults. Writes ``results/orderings.json`` (atomically).

    python -m benchmarks.orderings [--quick] [--seeds 0 1 2 3 4] [--out results/orderings.json]
"""
from __future__ import annotations

import argparse
import datetime as dt
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from scipy import stats

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from benchmarks.results import machine, write_result
from core import cli
from core.eval.distances import pairwise_euclidean
from core.eval.fusion import fuse
from core.eval.metrics import evaluate
from core.phantoms import CEILINGS, build, load_ceilings
from core.runtime import git_sha, load_embeddings
from core.text.llm import PhantomOracle, Question
from core.text.queries import photo_texts
from core.text.sampling import resolve_budget, uniform_order
from core.text.soe import SOE
from core.vision.backbones import OFFLINE_DEFAULT, Backbone, load_backbone
from core.vision.baseline import image_means
from core.vision.features import FeatureCache, TokenBank, workspace_wounds, wound_fractions
from core.vision.triderm import train

ROOT = Path(__file__).resolve().parents[1]
VISION = {  # label → TriDerm-V options beyond the seed
    "attention / VICReg": {"pooling": "attention", "loss": "vicreg"},
    "mean / VICReg": {"pooling": "mean", "loss": "vicreg"},
    "attention / triplet": {"pooling": "attention", "loss": "triplet", "batch_size": 8},
    "attention / contrastive": {"pooling": "attention", "loss": "contrastive", "batch_size": 128, "lr": 1e-3},
}
FROZEN = ("frozen backbone, mean pooling", "frozen backbone, mean pooling without distractor tokens (planted masks)")
MODALITIES = ("text: SOE on phantom-oracle triplets", "vision: TriDerm-V attention / VICReg",
              "fusion: uncertainty (α = 0.7)", "fusion: similarity")
CLAIMS = (  # (claim, better row, worse row)
    ("attention > mean pooling (TriDerm-V, VICReg)", "attention / VICReg", "mean / VICReg"),
    ("VICReg > triplet loss (TriDerm-V, attention)", "attention / VICReg", "attention / triplet"),
    ("triplet > contrastive loss (TriDerm-V, attention)", "attention / triplet", "attention / contrastive"),
    ("uncertainty fusion > vision (TriDerm-V)", MODALITIES[2], MODALITIES[1]),
    ("uncertainty fusion > text (SOE)", MODALITIES[2], MODALITIES[0]),
)
FULL = {"seeds": [0, 1, 2, 3, 4], "phantom": {}, "epochs": 50, "views": 16, "budget": 1.0}
QUICK = {"seeds": [0, 1], "phantom": {"photos": 16, "patients": 6, "wounds": 30, "triplets": 150},
         "epochs": 5, "views": 4, "budget": 0.3}


def text_embedding(ws: Workspace, seed: int, budget: float) -> tuple[list[str], np.ndarray, int]:
    """(ids, SOE embedding, triplets used): the phantom text oracle answers a uniform share
    ``budget`` of all questions over the photos' description texts; SOE (dim 4) embeds them."""
    texts = photo_texts(ws)
    ids = list(texts)
    oracle = PhantomOracle(ws.truth_dir, seed=seed, skips=False)
    order = uniform_order(len(ids), seed)
    questions = order[:resolve_budget(budget, len(order))]
    oriented = questions.copy()
    for row, (a, j, k) in enumerate(questions):
        q = Question(ids[a], ids[j], ids[k], texts[ids[a]], texts[ids[j]], texts[ids[k]])
        if oracle.answer_question(q).choice == "k":
            oriented[row, 1], oriented[row, 2] = k, j
    soe = SOE(n_components=4, n_objects=len(ids), random_state=seed).fit(oriented)
    return ids, soe.embedding_, len(oriented)


def frozen_pooling(ws: Workspace, backbone: Backbone, views: int) -> dict[str, dict[str, Any]]:
    """Diagnostic of the planted pooling advantage: the frozen backbone's inference-view wound tokens,
    mean-pooled over all tokens, and over the tokens whose grid cell is mostly *not* a distractor
    (truth/planted; a wound keeps all its tokens if none is left) — what ignoring the distractors
    perfectly would give without any training."""
    ids, keys = workspace_wounds(ws)
    bank = TokenBank(FeatureCache(ws, backbone).build(ids, views, progress=False), keys)
    seg, pos = bank.eval_segment.numpy(), bank.eval_pos.numpy()
    planted = {im: np.asarray(Image.open(ws.truth_dir / "planted" / f"{im}.png")) for im in ids}
    share = {im: wound_fractions((p >= 2).astype(np.int64), [1], bank.grid)[0].numpy() for im, p in planted.items()}
    distractor = np.array([share[bank.wound_keys[s][0]][r, c] for s, (r, c) in zip(seg, pos)])
    keep = (distractor < 0.5).astype(float)
    keep = np.where(np.bincount(seg, keep, len(keys))[seg] > 0, keep, 1.0)
    tokens, expert, out = bank.eval_tokens.numpy().astype(np.float64), ws.store.expert_triplets(), {}
    for label, w in zip(FROZEN, (np.ones_like(keep), keep)):
        pooled = np.zeros((len(keys), tokens.shape[1]))
        np.add.at(pooled, seg, tokens * w[:, None])
        pooled /= np.bincount(seg, w, len(keys))[:, None]
        image_ids, emb = image_means(bank.wound_keys, pooled)
        out[label] = evaluate(image_ids, pairwise_euclidean(emb), expert)
    return out


def run_seed(seed: int, cfg: dict[str, Any], tmp: Path, backbone: Backbone) -> dict[str, Any]:
    """Every row's metrics and the planted ceilings for one phantom world and seed."""
    data = tmp / f"phantom-{seed}"
    build(data, seed=seed, **cfg["phantom"])
    ws = Workspace(tmp / f"ws-{seed}")
    import_dataset(ws, data)
    expert = ws.store.expert_triplets()
    rows: dict[str, dict[str, float]] = {}
    vision_D: tuple[list[str], np.ndarray] | None = None
    for label, options in VISION.items():
        run_id = train(ws, progress=False, seed=seed, epochs=cfg["epochs"], views=cfg["views"], backbone=backbone,
                       **options)
        emb = load_embeddings(ws, run_id)
        D = pairwise_euclidean(emb["image_emb"])
        rows[label] = evaluate(emb["image_ids"], D, expert)
        if label == "attention / VICReg":
            vision_D = (emb["image_ids"], D)
    rows.update(frozen_pooling(ws, backbone, cfg["views"]))
    ids, text_emb, n_text = text_embedding(ws, seed, cfg["budget"])
    text_D = (ids, pairwise_euclidean(text_emb))
    rows[MODALITIES[0]] = evaluate(ids, text_D[1], expert)
    rows[MODALITIES[1]] = rows["attention / VICReg"]
    for label, method in ((MODALITIES[2], "uncertainty"), (MODALITIES[3], "similarity")):
        fused = fuse([vision_D, text_D], method=method)
        rows[label] = evaluate(fused.ids, fused.D, expert)
    ceilings = load_ceilings(data)
    ws.store.close()
    return {"seed": seed, "rows": rows, "ceilings": {k: ceilings[k] for k in CEILINGS}, "text_triplets": n_text,
            "expert_triplets": len(expert)}


def cell(values: list[float]) -> dict[str, Any]:
    """Mean ± sd with a 95 % t-interval over seeds (percent, rounded to 0.01)."""
    v = 100 * np.asarray(values, dtype=float)
    m = float(v.mean())
    if len(v) < 2:
        return {"mean": round(m, 2), "sd": None, "ci": None}
    sd = float(v.std(ddof=1))
    half = float(stats.t.ppf(0.975, len(v) - 1) * sd / math.sqrt(len(v)))
    return {"mean": round(m, 2), "sd": round(sd, 2), "ci": [round(m - half, 2), round(m + half, 2)]}


def paired(better: list[float], worse: list[float]) -> float:
    """One-sided paired t-test p-value for mean(better − worse) > 0 (NaN when undefined)."""
    diff = np.asarray(better) - np.asarray(worse)
    if len(diff) < 2 or np.allclose(diff, diff[0]):
        return float("nan") if len(diff) < 2 or diff[0] == 0 else (0.0 if diff[0] > 0 else 1.0)
    return float(stats.ttest_rel(better, worse, alternative="greater").pvalue)


def summarise(per_seed: list[dict[str, Any]], cfg: dict[str, Any], seconds: float, command: str,
              commit: str) -> dict[str, Any]:
    """The result file's content (contract of results/*.json); ``commit``: the code's sha at the start."""
    seeds = [r["seed"] for r in per_seed]
    metric = {label: [r["rows"][label]["balanced"] for r in per_seed] for label in per_seed[0]["rows"]}
    cols = ["model", "balanced (%)", "micro (%)", "macro-F1 (%)", "kappa (×100)"]

    def row(label: str) -> list[Any]:
        return [label] + [cell([r["rows"][label][k] for r in per_seed]) for k in ("balanced", "micro", "macro_f1",
                                                                                 "kappa")]

    ceiling = {k: [r["ceilings"][k]["balanced"] for r in per_seed] for k in CEILINGS}
    expected = {k: [r["ceilings"][k]["expected"] for r in per_seed] for k in CEILINGS}
    claims = []
    for claim, hi, lo in CLAIMS:
        p = paired(metric[hi], metric[lo])
        diff = float(np.mean(metric[hi]) - np.mean(metric[lo]))
        claims.append({"claim": claim, "test": f"one-sided paired t-test over {len(seeds)} seeds (ttest_rel, "
                                               f"greater) on balanced agreement; mean difference {100 * diff:+.2f} pt",
                       "p": None if math.isnan(p) else p, "holds": bool(p < 0.05 and diff > 0)})
    for claim, parts in (("VICReg > triplet > contrastive (TriDerm-V)", claims[1:3]),
                         ("uncertainty fusion > each modality", claims[3:5])):
        ps = [c["p"] for c in parts]
        claims.append({"claim": claim, "test": "both component tests above (p = the larger)",
                       "p": None if None in ps else max(ps), "holds": all(c["holds"] for c in parts)})
    notes = [
        "SYNTHETIC: phantom v2 worlds (core.phantoms), one per seed; not patient data.",
        f"Each seed s builds phantom seed s ({per_seed[0]['expert_triplets']} expert triplets in seed "
        f"{seeds[0]}), trains TriDerm-V with seed s ({cfg['epochs']} epochs, {cfg['views']} cached views, "
        f"offline efficientnet-lite0 backbone) and asks the phantom text oracle {per_seed[0]['text_triplets']} "
        "questions (descriptions only, no skips) for SOE dim 4.",
        "Planted ceilings: best balanced agreement reachable from the photos (exact visible features), from the "
        "descriptions (as the text oracle reads them), from both (fusion) and the expert's own noise ceiling; "
        "mean over seeds " + ", ".join(f"{k} {100 * np.mean(ceiling[k]):.1f}%" for k in CEILINGS) + ".",
        "A claim holds only when its one-sided paired t-test over seeds gives p < 0.05 in the claimed direction.",
        "Pipeline row 'vision: TriDerm-V attention / VICReg' is the same run as 'attention / VICReg'.",
        "Diagnostic (not a paper claim): ignoring the planted distractors perfectly (frozen features, planted "
        f"masks) vs mean pooling: {100 * np.mean(metric[FROZEN[1]]):.1f}% vs {100 * np.mean(metric[FROZEN[0]]):.1f}%, "
        f"one-sided paired t-test p = {paired(metric[FROZEN[1]], metric[FROZEN[0]]):.3g}.",
    ]
    if {k: v for k, v in cfg.items() if k != "seeds"} != {k: v for k, v in FULL.items() if k != "seeds"}:
        notes.append(f"QUICK run ({len(seeds)} seeds, smaller phantom {cfg['phantom']}, {cfg['epochs']} epochs, "
                     f"{cfg['views']} views, {cfg['budget']:.0%} of the text questions): a smoke test, not the "
                     "published figures.")
    return {
        "section": "orderings",
        "title": "The paper's three orderings on phantom v2 (SYNTHETIC)",
        "command": command, "seeds": seeds,
        "machine": machine(),
        "commit": commit, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 1), "synthetic": True,
        "tables": [
            {"caption": "Planted ceilings of phantom v2 (SYNTHETIC): balanced agreement with the expert's "
                        "triplets (%), and expected agreement over all triplets and the expert's noise (%)",
             "columns": ["ceiling", "balanced (%)", "expected (%)"],
             "rows": [[k, cell(ceiling[k]), cell(expected[k])] for k in CEILINGS]},
            {"caption": "TriDerm-V pooling and loss on phantom v2 (SYNTHETIC), agreement with the expert's "
                        "triplets, mean ± sd over seeds",
             "columns": cols, "rows": [row(label) for label in (*VISION, *FROZEN)]},
            {"caption": "Modalities and fusion on phantom v2 (SYNTHETIC), agreement with the expert's triplets, "
                        "mean ± sd over seeds",
             "columns": cols, "rows": [row(label) for label in MODALITIES]},
            {"caption": "Paired tests of the orderings (one-sided paired t-test over seeds)",
             "columns": ["claim", "p", "holds"],
             "rows": [[c["claim"], c["p"], "yes" if c["holds"] else "no"] for c in claims]},
            {"caption": "Balanced agreement (%) per seed (the pairs behind the tests)",
             "columns": ["model"] + [f"seed {s}" for s in seeds],
             "rows": [[label] + [round(100 * v, 2) for v in metric[label]] for label in metric]
             + [[f"ceiling: {k}"] + [round(100 * v, 2) for v in ceiling[k]] for k in CEILINGS]},
        ],
        "claims": claims, "notes": notes,
    }


def render_text(result: dict[str, Any]) -> str:
    """Plain-text tables for the terminal."""
    def fmt(x: Any) -> str:
        if isinstance(x, dict):
            return f"{x['mean']:.1f} ± {x['sd']:.1f}" if x["sd"] is not None else f"{x['mean']:.1f}"
        if isinstance(x, float):
            return f"{x:.3g}"
        return "—" if x is None else str(x)

    out = [f"{result['title']} — seeds {result['seeds']}, {result['seconds']:.0f} s"]
    for t in result["tables"]:
        cells = [t["columns"]] + [[fmt(x) for x in r] for r in t["rows"]]
        widths = [max(len(r[i]) for r in cells) for i in range(len(t["columns"]))]
        out += ["", t["caption"]] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(out + [""] + result["notes"])


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.orderings`` benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.orderings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, a small phantom, 5 epochs (smoke test)")
    cli.add_seeds(parser, None, help="override the seeds (a list)")
    cli.add_device(parser)
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="folder of the result file")
    args = cli.parse_args(parser, argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.seeds is not None:
        if len(set(args.seeds)) < 2:
            parser.error("--seeds needs at least two distinct seeds for a paired test")
        cfg["seeds"] = sorted(set(args.seeds))
    t0, commit = time.perf_counter(), git_sha()
    backbone = load_backbone(OFFLINE_DEFAULT)
    with tempfile.TemporaryDirectory(prefix="orderings-") as tmp:
        per_seed = []
        for seed in cfg["seeds"]:
            per_seed.append(run_seed(seed, cfg, Path(tmp), backbone))
            print(f"seed {seed}: " + ", ".join(f"{k} {100 * v['balanced']:.1f}"
                                               for k, v in per_seed[-1]["rows"].items()), flush=True)
    command = "python -m benchmarks.orderings" + (" --quick" if args.quick else "") + \
        (f" --seeds {' '.join(map(str, cfg['seeds']))}" if args.seeds is not None else "")
    result = summarise(per_seed, cfg, time.perf_counter() - t0, command, commit)
    target = write_result(results_dir=args.results, **{k: result[k] for k in (
        "section", "title", "command", "seeds", "tables", "claims", "notes", "synthetic", "seconds")})
    print(render_text(result))
    print(f"\nwrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
