"""The workspace's own result in words: the newest trained vision embedding against the untrained one on
the SAME held-out triplets, paired over patients, with what to do next.

A run trained on the expert's triplets is scored only on the triplets its folds held out strictly (all
three photos unseen: ``metrics["cv"]["per_triplet"]``); a run that used no expert labels is scored on every
triplet. Both runs are restricted to the triplets they share, so the two figures and their difference are
measured on one set; the difference is judged by the paired t-test over patients
(:func:`core.eval.protocol.patient_paired_test`; its signed-rank test when every patient differs alike),
its interval by the patient bootstrap
(:func:`core.eval.protocol.patient_bootstrap_ci`). The Report page and ``python -m core.train_triderm``
(``make demo``) state the same :func:`verdict`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from annotations.infra.workspace import Workspace
from annotations.store.runs import TEXT_BASELINE, VISION_BASELINE
from core.eval.formatting import agreement_text
from core.eval.protocol import oriented_triplets, patient_bootstrap_ci, patient_of, patient_paired_test
from core.eval.retrieval import run_image_distances

#: a run of one of these kinds learnt nothing (a frozen backbone or sentence model): the comparison's reference
UNTRAINED_KINDS = (VISION_BASELINE, TEXT_BASELINE)
#: the paired test's level: a difference is beyond chance when p < ALPHA
ALPHA = 0.05
#: the gain (balanced agreement, trained − untrained) the next step sizes more judgments for when the trained run
#: did not do better: a goal the sentence names, never the observed (negative or null) difference
GAIN = 0.05
#: The default mode's learning curve in judgments on real wounds (``python -m benchmarks.active_real --data
#: ../shared/data/azh-dev --learner finetune --seeds 0 1 2``, results/learning_curve.json, docs/RESULTS.md):
#: training triplets (sampled uniformly) → strict balanced agreement (%, mean over 3 seeds) on new patients; 0 is
#: the frozen centred embedding. Specialist wound-type labels turned into triplets, not an expert's judgments.
REAL_CURVE = ((0, 63.3), (100, 70.1), (250, 73.1), (500, 73.9))
#: the first budget of that curve within 1 pp of a fold's whole pool (73.4 % on about 576 triplets)
REAL_PLATEAU = 250
#: Triplet (anchor, chosen, other) → (times the run put ``chosen`` strictly closer, times it was scored).
Tallies = dict[tuple[str, str, str], tuple[int, int]]


def scored_triplets(ids: Sequence[str], D: np.ndarray, expert: Sequence[Mapping[str, Any]]) -> Tallies:
    """Every non-skip expert triplet over ``ids`` scored with the distances ``D`` (a run that used no labels:
    all of them are held out)."""
    out: Tallies = {}
    for i, j, k in oriented_triplets(expert, {image_id: n for n, image_id in enumerate(ids)}):
        key = (ids[i], ids[j], ids[k])
        c, n = out.get(key, (0, 0))
        out[key] = (c + int(D[i, j] < D[i, k]), n + 1)
    return out


def stored_triplets(run: Mapping[str, Any]) -> Tallies | None:
    """A run's strict held-out triplets as its training stored them, or None when it has none."""
    rows = (run["metrics"].get("cv") or {}).get("per_triplet")
    if not rows:
        return None
    out: Tallies = {}
    for a, j, k, c, n in rows:
        c0, n0 = out.get((a, j, k), (0, 0))
        out[(a, j, k)] = (c0 + int(c), n0 + int(n))
    return out


def per_anchor(tallies: Tallies, keys: Sequence[tuple[str, str, str]]) -> dict[str, float]:
    """Anchor → accuracy over the triplets ``keys`` (an anchor pools its triplets' counts)."""
    hits: dict[str, list[int]] = {}
    for key in keys:
        c, n = tallies[key]
        h = hits.setdefault(key[0], [0, 0])
        h[0] += c
        h[1] += n
    return {a: c / n for a, (c, n) in hits.items()}


def triplets_needed(n: int, n_patients: int, t_p: float, mean_diff: float) -> int | None:
    """About how many triplets in all would make the observed difference beyond chance, if the
    difference and its spread over patients stayed as they are and new triplets came from new patients at
    today's rate (an estimate: the paired t statistic grows with the square root of the patients). None
    when no difference was observed or the test is undefined."""
    from scipy import stats

    if mean_diff == 0 or not math.isfinite(t_p) or t_p >= 1 or n_patients < 2:
        return None
    t_now = float(stats.t.isf(t_p / 2, n_patients - 1))
    for patients in range(n_patients, 1000 * n_patients):
        if t_now * math.sqrt(patients / n_patients) >= stats.t.isf(ALPHA / 2, patients - 1):
            return math.ceil(n * patients / n_patients)
    return None


def triplets_for_gain(n: int, n_patients: int, sd: float, gain: float = GAIN) -> int | None:
    """About how many triplets in all would make a difference of ``gain`` beyond chance (the paired t-test
    at :data:`ALPHA`, a coin-flip's power) if the per-patient differences kept their standard deviation
    ``sd`` and new triplets came from new patients at today's rate. None without a spread (fewer than two
    patients, or every patient alike) or a positive gain."""
    from scipy import stats

    if gain <= 0 or n_patients < 2 or not math.isfinite(sd) or sd <= 0:
        return None
    for patients in range(max(n_patients, 2), 1000 * n_patients):
        if gain / (sd / math.sqrt(patients)) >= stats.t.isf(ALPHA / 2, patients - 1):
            return math.ceil(n * patients / n_patients)
    return None


def compare(trained: Tallies, untrained: Tallies, patients: dict[str, str], n_boot: int = 1000,
            seed: int = 0) -> dict[str, Any]:
    """The two runs on their common triplets: each one's balanced agreement with its patient-bootstrap 95 %
    CI, the per-patient paired difference (trained − untrained) with its CI and paired t-test, and whether it
    is beyond chance (p < :data:`ALPHA`). Raises ValueError when they share no triplet."""
    common = sorted(trained.keys() & untrained.keys())
    if not common:
        raise ValueError("the two runs share no held-out triplet")
    a, b = per_anchor(trained, common), per_anchor(untrained, common)
    diff = {k: a[k] - b[k] for k in a}
    n_patients = len({patients[k] for k in a})
    out: dict[str, Any] = {
        "n": len(common), "n_anchors": len(a), "n_patients": n_patients,
        "n_trained_only": len(trained.keys() - untrained.keys()),
        "n_untrained_only": len(untrained.keys() - trained.keys()),
        "trained": {"balanced": float(np.mean(list(a.values()))),
                    "ci": patient_bootstrap_ci(a, patients, n_boot, seed)},
        "untrained": {"balanced": float(np.mean(list(b.values()))),
                      "ci": patient_bootstrap_ci(b, patients, n_boot, seed)},
        "difference": float(np.mean(list(diff.values()))), "difference_ci": patient_bootstrap_ci(diff, patients,
                                                                                              n_boot, seed)}
    if n_patients >= 2:
        test = patient_paired_test([{"anchor": k, "accuracy": v} for k, v in a.items()],
                                   [{"anchor": k, "accuracy": v} for k, v in b.items()], patients)
        # the same difference for every patient leaves the t statistic undefined: the signed-rank test judges it
        by_patient: dict[str, list[float]] = {}
        for k, v in diff.items():
            by_patient.setdefault(patients[k], []).append(v)
        patient_diffs = [float(np.mean(v)) for v in by_patient.values()]
        spread = np.ptp(patient_diffs)
        t_defined = math.isfinite(test["t_p"]) and spread > 1e-12
        p = test["t_p"] if t_defined else test["wilcoxon_p"]
        name = "paired t-test" if t_defined else "Wilcoxon signed-rank test"
        out.update(p=p, test=f"{name} over {n_patients} patients", beyond_chance=bool(p < ALPHA),
                   needed=None if p < ALPHA else triplets_needed(len(common), n_patients, p, test["mean_diff"]),
                   patient_sd=float(np.std(patient_diffs, ddof=1)))
    else:
        out.update(p=None, test="no paired test: the triplets come from one patient", beyond_chance=False,
                   needed=None, patient_sd=None)
    return out


def words(c: Mapping[str, Any], trained_label: str, untrained_label: str) -> dict[str, str]:
    """The comparison ``c`` (:func:`compare`) as a one-line ``line`` and a ``next_step``."""
    t, u = c["trained"], c["untrained"]
    d = c["difference"]
    tested = f"{c['test']}" + (f", p = {c['p']:.2g}" if c["p"] is not None else "")
    if c["beyond_chance"] or d > 0:
        judged = (f"the difference, {agreement_text(d, c['difference_ci'], unit=' pp', sign=True)}, "
                  f"{'is' if c['beyond_chance'] else 'is not'} beyond chance on these {c['n']} triplets ({tested})")
    else:  # no gain observed: said plainly
        judged = (f"the trained embedding is not better than the untrained one on these {c['n']} triplets "
                  f"(difference {agreement_text(d, c['difference_ci'], unit=' pp', sign=True)}; {tested})")
    line = (f"The trained embedding ({trained_label}) agrees with the expert on {agreement_text(t['balanced'], t['ci'], unit=' %')} "
            f"of the {c['n']} held-out triplets both runs were scored on; the untrained one ({untrained_label}) "
            f"{agreement_text(u['balanced'], u['ci'], unit=' %')}; {judged}.")
    if c["beyond_chance"] and d > 0:
        step = ("Use the trained embedding: Explore opens on it. More judgments would narrow the interval; "
                "retrain after adding them.")
    elif c["beyond_chance"]:
        step = ("Training made agreement worse on these triplets: keep the untrained embedding and check the "
                "judgments' reliability on the Review page before training again.")
    elif d <= 0:  # no gain to grow: check the inputs, and size more judgments for a gain worth having
        step = ("Keep the untrained embedding for now. Check the outlines (Wound masks page) and the judgments' "
                "reliability (Review page), then retrain.")
        needed = triplets_for_gain(c["n"], c["n_patients"], c.get("patient_sd") or math.nan)
        if needed is not None and needed <= c["n"]:
            step += (f" These {c['n']} triplets would already show a gain of +{100 * GAIN:.0f} pp beyond chance "
                     "(today's spread over patients): more judgments alone are unlikely to change the verdict.")
        elif needed is not None:
            step += (f" To show a gain of +{100 * GAIN:.0f} pp beyond chance, about {needed} held-out triplets "
                     f"would be needed ({needed - c['n']} more judgments; an estimate from today's spread over "
                     "patients, assuming new judgments come from new patients at today's rate).")
        else:
            step += " More judgments from more patients would show whether training can help."
    elif c["needed"] is not None:
        more = max(1, c["needed"] - c["n"])
        step = (f"Collect about {more} more judgments (an estimate: at {c['needed']} held-out triplets a "
                f"difference of {100 * d:+.1f} pp with today's spread over patients would be beyond chance; it "
                f"assumes new judgments come from new patients at today's rate), then retrain.")
    else:
        step = ("Collect more judgments from more patients, then retrain: with no difference observed (or a "
                "single patient) no number of triplets can be estimated.")
    return {"line": line, "next_step": step}


def answered_count(expert: Sequence[Mapping[str, Any]]) -> int:
    """The judgments of ``expert`` that chose a reference (skips left out)."""
    return sum(row["choice"] in ("j", "k") for row in expert)


def missing_step(expert: Sequence[Mapping[str, Any]], has_untrained: bool, has_trained: bool) -> str:
    """What to do when the workspace lacks the judgments or one of the two runs: the judgments it holds
    counted, so that with judgments and no trained run the step is to train, not to collect."""
    answered = answered_count(expert)
    if not answered:
        return ("Collect expert judgments on the Triplets page"
                + (f" ({len(expert)} so far, all skipped)" if expert else "")
                + ", then start training on the Train page (mode auto): it records both runs.")
    held = f"The workspace holds {answered} answered expert judgments"
    if not has_trained:
        return (f"{held}: start training on the Train page (mode auto) to learn from them; the Report then "
                "compares the trained embedding with the untrained one on the triplets it held out.")
    return (f"{held} and a trained run: record the untrained reference on the Train page (mode frozen), "
            "then the Report compares the two.")


def curve_step(answered: int) -> str:
    """Where ``answered`` judgments stand on the default mode's learning curve on real wounds (:data:`REAL_CURVE`):
    how many more the curve says are worth collecting for a better embedding (not for a narrower interval)."""
    points = ", ".join(f"{pct:.1f} % at {n}" for n, pct in REAL_CURVE[1:])
    said = (f"On real wound crops (azh-dev, wound-type labels as triplets) the default mode's agreement on new "
            f"patients rose from {REAL_CURVE[0][1]:.1f} % untrained to {points} training triplets, levelling off "
            f"from about {REAL_PLATEAU}")
    if answered >= REAL_PLATEAU:
        return (f"{said}: this workspace's {answered} judgments are past that point, so more of them would mostly "
                "narrow the interval rather than improve the embedding.")
    return (f"{said}: about {REAL_PLATEAU - answered} more judgments (from {answered}) would bring this workspace "
            "there.")


def run_label(run: Mapping[str, Any]) -> str:
    """``run #ID, KIND``, for the verdict's sentences."""
    return f"run #{run['id']}, {run['kind']}"


def verdict(ws: Workspace, runs: Sequence[dict[str, Any]], n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The newest trained vision run of ``runs`` (finished runs with embeddings, newest first:
    :func:`core.eval.report.embedding_runs`) against the newest untrained one on their common held-out
    triplets (:func:`compare`), with ``line`` and ``next_step`` in words and the runs' ids; without such a
    pair, ``{"line": why, "next_step": what to do}`` only."""
    vision = [r for r in runs if r["config"].get("modality") == "vision"]
    untrained = next((r for r in vision if r["kind"] in UNTRAINED_KINDS), None)
    trained = [r for r in vision if r["kind"] not in UNTRAINED_KINDS]
    expert = ws.store.expert_triplets()
    if untrained is None or not trained or not expert:
        missing = ("expert triplets" if not expert else "untrained (frozen) vision run" if untrained is None
                   else "trained vision run")
        return {"line": f"No verdict yet: this workspace has no {missing} to compare.",
                "next_step": missing_step(expert, untrained is not None, bool(trained))}
    pair = run_image_distances(ws, untrained)
    assert pair is not None  # embedding_runs: finished runs with image embeddings
    reference = scored_triplets(*pair, expert)
    for run in trained:  # the newest with held-out triplets (one trained on the expert's: its strict ones)
        if run["config"].get("supervise"):
            held_out = stored_triplets(run)
        else:
            dist = run_image_distances(ws, run)
            held_out = None if dist is None else scored_triplets(*dist, expert)
        if held_out and held_out.keys() & reference.keys():
            break
    else:
        return {"line": "No verdict yet: no trained vision run has held-out triplets in common with the untrained "
                        "one (a run trained on the triplets before per-triplet records were kept has none).",
                "next_step": "Start training again on the Train page (mode auto): the new run keeps its held-out "
                             "triplets."}

    result = compare(held_out, reference, patient_of(ws.store.images()), n_boot, seed)
    said = words(result, run_label(run), run_label(untrained))
    return {**result, **said, "next_step": f"{said['next_step']} {curve_step(answered_count(expert))}", "trained_run": run["id"],
            "untrained_run": untrained["id"]}
