"""The one text form of an agreement and its 95 % CI: ``71.3 % [65.0, 77.2]`` (torch-free).

Every table and sentence that shows a figure with its interval goes through :func:`agreement_text`:
the report's tables (:mod:`core.eval.report`), the verdict (:mod:`core.eval.verdict`), the model card
(:mod:`core.vision.model_card`), the training job's summary (``python -m core.train_triderm``) and
docs/RESULTS.md's mean ± sd [CI] cells (:mod:`benchmarks.results`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

MISSING = "–"  # a figure there is none of (en dash); the model card and the job's summary write "—"


def number(x: float | None, *, scale: float = 100.0, digits: int = 1, sign: bool = False,
           missing: str = MISSING) -> str:
    """``scale·x`` to ``digits`` decimals (with its sign when ``sign``); ``missing`` for None or a non-finite x."""
    if x is None or not math.isfinite(x):
        return missing
    return f"{scale * x:{'+' if sign else ''}.{digits}f}"


def ci_text(ci: Sequence[float] | None, *, scale: float = 100.0, digits: int = 1, missing: str = MISSING) -> str:
    """``[lo, hi]``, each bound as :func:`number` writes it; ``missing`` when there is no interval."""
    if ci is None or len(ci) == 0:
        return missing
    lo, hi = (number(bound, scale=scale, digits=digits, missing=missing) for bound in ci)
    return f"[{lo}, {hi}]"


def agreement_text(value: float | None, ci: Sequence[float] | None = None, *, sd: float | None = None,
                   scale: float = 100.0, digits: int = 1, unit: str = "", sign: bool = False,
                   missing: str = MISSING) -> str:
    """``value[unit][ ± sd][ [lo, hi]]``: an agreement (a fraction, shown ×``scale``), its spread over seeds
    and its interval, all to ``digits`` decimals. The unit follows a value only, the sd and interval only
    when given (an empty interval counts as none); a missing value or bound reads ``missing``."""
    text = number(value, scale=scale, digits=digits, sign=sign, missing=missing)
    if text != missing:
        text += unit
    if sd is not None:
        text += f" ± {number(sd, scale=scale, digits=digits, missing=missing)}"
    if ci is not None and len(ci):
        text += " " + ci_text(ci, scale=scale, digits=digits, missing=missing)
    return text
