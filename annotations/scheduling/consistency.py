"""Annotator reliability: self-consistency on planned repeats and Cohen's κ on shared triplets.

A judgment is keyed by its anchor and the *unordered* pair of references, and its answer is
the reference that was chosen, so a repeat shown with the sides swapped is compared correctly.
Skips carry no answer and are left out. Pure Python/NumPy: no store access, no UI.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

Key = tuple[str, str, str]  # (anchor, smaller reference id, larger reference id)


def annotator_of(source: str) -> str | None:
    """Annotator name of an ``expert:<name>`` source, else None."""
    return source.split(":", 1)[1] if source.startswith("expert:") else None


def triplet_key(anchor: str, ref_j: str, ref_k: str) -> Key:
    """Orientation-free identity of a triplet: anchor plus the sorted reference pair."""
    a, b = sorted((ref_j, ref_k))
    return (anchor, a, b)


def chosen_reference(row: Mapping[str, Any]) -> str | None:
    """Id of the reference judged closer to the anchor, or None for a skip."""
    if row["choice"] == "j":
        return row["ref_j"]
    if row["choice"] == "k":
        return row["ref_k"]
    return None


def _answers(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[Key, dict[int, str]]]:
    """Annotator → key → rep → chosen reference id (skips dropped)."""
    out: dict[str, dict[Key, dict[int, str]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        who = annotator_of(row["source"])
        chosen = chosen_reference(row)
        if who is None or chosen is None:
            continue
        out[who][triplet_key(row["anchor"], row["ref_j"], row["ref_k"])][int(row.get("rep") or 0)] = chosen
    return out


def self_consistency(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Per annotator: how often a repeated triplet got the same answer as its first showing.

    Returns ``{annotator: {"n": repeats compared, "agree": count, "rate": agree / n (nan if n == 0)}}``
    for every annotator with at least one non-skip judgment.
    """
    result: dict[str, dict[str, float | int]] = {}
    for who, keyed in _answers(rows).items():
        n = agree = 0
        for reps in keyed.values():
            if 0 not in reps:
                continue
            for rep, chosen in reps.items():
                if rep == 0:
                    continue
                n += 1
                agree += chosen == reps[0]
        result[who] = {"n": n, "agree": agree, "rate": agree / n if n else math.nan}
    return result


def cohen_kappa(labels_a: list[Any], labels_b: list[Any]) -> float:
    """Cohen's κ = (p_o − p_e) / (1 − p_e) for two raters over the same items.

    Returns nan for no items or when chance agreement is 1 (both raters constant on one label).
    """
    if len(labels_a) != len(labels_b):
        raise ValueError(f"rater label lists differ in length: {len(labels_a)} vs {len(labels_b)}")
    n = len(labels_a)
    if n == 0:
        return math.nan
    cats = sorted(set(labels_a) | set(labels_b), key=str)
    p_o = sum(x == y for x, y in zip(labels_a, labels_b)) / n
    p_e = sum((labels_a.count(c) / n) * (labels_b.count(c) / n) for c in cats)
    if math.isclose(p_e, 1.0):
        return math.nan
    return (p_o - p_e) / (1.0 - p_e)


def inter_annotator_kappa(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Cohen's κ between every pair of annotators on the triplets both answered (first showing).

    The binary label of a shared triplet is whether the smaller-id reference was chosen.
    Returns ``{"pairs": [{"a", "b", "n", "agreement", "kappa"}...], "mean_kappa": float}``
    where the mean is over pairs with a defined κ (nan if none).
    """
    answers = _answers(rows)
    pairs: list[dict[str, Any]] = []
    for a, b in itertools.combinations(sorted(answers), 2):
        shared = sorted(
            k for k in answers[a].keys() & answers[b].keys() if 0 in answers[a][k] and 0 in answers[b][k]
        )
        if not shared:
            continue
        la = [answers[a][k][0] == k[1] for k in shared]
        lb = [answers[b][k][0] == k[1] for k in shared]
        pairs.append({
            "a": a,
            "b": b,
            "n": len(shared),
            "agreement": sum(x == y for x, y in zip(la, lb)) / len(shared),
            "kappa": cohen_kappa(la, lb),
        })
    defined = [p["kappa"] for p in pairs if not math.isnan(p["kappa"])]
    return {"pairs": pairs, "mean_kappa": sum(defined) / len(defined) if defined else math.nan}


def progress(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per annotator: judgments stored, skips, planned repeats, median latency (ms), last answer time."""
    out: dict[str, dict[str, Any]] = {}
    latencies: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        who = annotator_of(row["source"])
        if who is None:
            continue
        entry = out.setdefault(who, {"answered": 0, "skips": 0, "repeats": 0, "last": ""})
        entry["answered"] += 1
        entry["skips"] += row["choice"] == "skip"
        entry["repeats"] += int(row.get("rep") or 0) > 0
        entry["last"] = max(entry["last"], str(row.get("created") or ""))
        if row.get("latency_ms") is not None:
            latencies[who].append(float(row["latency_ms"]))
    for who, entry in out.items():
        values = sorted(latencies[who])
        entry["median_ms"] = values[len(values) // 2] if values else math.nan
    return out


def disagreements(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Triplets (first showing) that two or more annotators answered differently.

    Returns ``[{"anchor", "refs": (a, b), "answers": {annotator: (row id, chosen reference)}}]``,
    the most divided first (then by anchor).
    """
    by_key: dict[Key, dict[str, tuple[int, str]]] = defaultdict(dict)
    for row in rows:
        who = annotator_of(row["source"])
        chosen = chosen_reference(row)
        if who is None or chosen is None or int(row.get("rep") or 0) != 0:
            continue
        by_key[triplet_key(row["anchor"], row["ref_j"], row["ref_k"])][who] = (int(row["id"]), chosen)
    out: list[dict[str, Any]] = []
    for key, answers in by_key.items():
        picks = [c for _, c in answers.values()]
        if len(set(picks)) > 1:
            minority = min(picks.count(key[1]), picks.count(key[2]))
            out.append({"anchor": key[0], "refs": (key[1], key[2]), "answers": answers, "_m": minority})
    out.sort(key=lambda d: (-d["_m"] / len(d["answers"]), d["anchor"], d["refs"]))
    for d in out:
        del d["_m"]
    return out


def rounded(value: float | None, digits: int = 3) -> float | None:
    """``value`` rounded for a table; ``None`` (an empty cell) for a missing or NaN figure."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else round(value, digits)


def annotator_rows(names: Iterable[str], progress_of: Mapping[str, Mapping[str, Any]],
                   consistency_of: Mapping[str, Mapping[str, Any]], roles: Mapping[str, str],
                   excluded: Iterable[str]) -> list[dict[str, Any]]:
    """The Review page's annotator table: account, judgments, skips, planned repeats, self-consistency,
    median seconds per answer, last answer and whether the annotator counts in evaluation."""
    left_out = set(excluded)
    rows = []
    for n in names:
        p = progress_of.get(n, {})
        rows.append({"annotator": n, "account": roles.get(n, "no account (free-text name)"),
                     "judgments": p.get("answered", 0), "skips": p.get("skips", 0),
                     "planned repeats": p.get("repeats", 0),
                     "self-consistency": rounded(consistency_of.get(n, {}).get("rate", math.nan)),
                     "median seconds": rounded(p.get("median_ms", math.nan) / 1000, 1),
                     "last answer": str(p.get("last", ""))[:16].replace("T", " "),
                     "in evaluation": n not in left_out})
    return rows
