"""Statistics of repeated runs: mean ± sd with a 95 % t interval over seeds, the note on how many claims
(:func:`core.eval.protocol.paired_claim`) hold by chance alone, and their Benjamini–Hochberg adjusted p-values.

What the writers of result files (:mod:`core.eval.result_files`: the benchmarks, ``python -m core.ablate``)
state beside each figure.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def mean_sd_ci(values: Iterable[float | None]) -> dict[str, Any] | None:
    """``{"mean", "sd", "ci", "n"}`` of the finite values (sd with ddof 1, 95 % t interval); None if none."""
    import numpy as np
    from scipy import stats

    arr = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if not len(arr):
        return None
    m = float(arr.mean())
    if len(arr) < 2:
        return {"mean": m, "sd": None, "ci": None, "n": 1}
    sd = float(arr.std(ddof=1))
    half = float(stats.t.ppf(0.975, len(arr) - 1)) * sd / math.sqrt(len(arr))
    return {"mean": m, "sd": sd, "ci": [m - half, m + half], "n": len(arr)}


def multiple_tests_note(claims: Sequence[dict], alpha: float = 0.05) -> str:
    """How many claims hold by chance alone when none is true, from the number of tests."""
    held = sum(c["holds"] for c in claims)
    return (f"{len(claims)} tests at α = {alpha:g}, {held} of them {'holds' if held == 1 else 'hold'}; about {alpha * len(claims):.2f} would hold "
            f"by chance alone if no difference were real.")


def fdr_adjusted(p_values: Sequence[float | None]) -> list[float | None]:
    """Benjamini–Hochberg adjusted p-values (:func:`scipy.stats.false_discovery_control`) over the
    defined ones; an undefined p (None) stays None and does not count as a test."""
    from scipy import stats

    defined = [p for p in p_values if p is not None]
    adjusted = iter(stats.false_discovery_control(defined).tolist() if defined else [])
    return [None if p is None else next(adjusted) for p in p_values]
