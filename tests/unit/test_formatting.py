"""The one text form of an agreement and its CI (core/eval/formatting.py), exact strings."""
from __future__ import annotations

import math

import pytest

from core.eval.formatting import agreement_text, ci_text, number


def test_an_agreement_with_its_interval_in_percent():
    assert agreement_text(0.7125, [0.65, 0.77249]) == "71.2 [65.0, 77.2]"
    assert agreement_text(0.7125, (0.65, 0.7725), unit=" %") == "71.2 % [65.0, 77.2]"
    assert agreement_text(0.7125, [0.65, 0.7725], unit="%") == "71.2% [65.0, 77.2]"


def test_a_signed_difference_and_kappa():
    assert agreement_text(0.031, [-0.012, 0.07], unit=" pp", sign=True) == "+3.1 pp [-1.2, 7.0]"
    assert agreement_text(-0.031, [-0.05, -0.012], unit=" pp", sign=True) == "-3.1 pp [-5.0, -1.2]"
    assert agreement_text(0.41234, [0.3, 0.5], scale=1, digits=3) == "0.412 [0.300, 0.500]"


def test_mean_sd_and_interval_over_seeds():
    assert agreement_text(71.234, [68.0, 74.5], sd=1.25, scale=1, digits=2) == "71.23 ± 1.25 [68.00, 74.50]"
    assert agreement_text(71.234, None, sd=0.0, scale=1) == "71.2 ± 0.0"


@pytest.mark.parametrize("missing", [None, math.nan, math.inf])
def test_a_missing_figure_reads_as_a_dash_and_never_as_nan(missing):
    assert agreement_text(missing) == "–"
    assert agreement_text(missing, [math.nan, 0.5], unit=" %") == "– [–, 50.0]"  # no unit after a dash
    assert agreement_text(missing, missing="—") == "—"
    assert number(missing, missing="n/a") == "n/a"


def test_no_interval_is_left_out_not_faked():
    assert agreement_text(0.5, None) == agreement_text(0.5, []) == "50.0"
    assert ci_text(None) == ci_text([]) == "–"
    assert ci_text(None, missing="—") == "—"
    assert ci_text([0.1, 0.2]) == "[10.0, 20.0]"
    with pytest.raises(ValueError):
        ci_text([0.1, 0.2, 0.3])
