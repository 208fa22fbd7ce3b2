"""Property-based fuzzing (hypothesis) of what issue 49 hardened: the follow-up fields' parsers, the
study-id mapping CSV and the spreadsheet-safe CSV cells. Any input gives a valid result or one
DatasetError, never another exception; a valid result is within the stated ranges.

``TRIDERM_FUZZ_EXAMPLES`` sets the number of examples (as in ``test_fuzz_readers.py``).
"""
from __future__ import annotations

import math
import os
from datetime import date

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from annotations.accounts.privacy import StudyIds
from annotations.followup import followup, followup_fields
from annotations.followup.measure import (
    ARUCO_DICTIONARIES,
    MARKER_SIDE_CM,
    RULER_CM,
    MarkerSpec,
    Ruler,
    ruler_calibration,
)
from annotations.infra.workspace import Workspace
from annotations.io import csvsafe
from annotations.io.readers import DatasetError

EXAMPLES = int(os.environ.get("TRIDERM_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
NUMBER = st.one_of(st.integers(-10**6, 10**6).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(["1e300", "-0", "nan", "inf", "1_0", "٣", "", " "]))
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12)),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=6)


@FUZZ
@given(st.one_of(st.text(max_size=40), st.dates().map(date.isoformat), st.integers().map(str)))
def test_any_visit_date_is_a_date_in_the_window_or_one_dataset_error(text):
    try:
        day = followup.parse_visit_date(text, "images.csv: line 2")
    except DatasetError as err:
        assert str(err).startswith("images.csv: line 2: visit_date")
        return
    assert followup_fields.EARLIEST_VISIT <= day <= date.today()


@FUZZ
@given(st.one_of(st.text(max_size=60), st.lists(NUMBER, min_size=0, max_size=6).map(" ".join)),
       st.integers(1, 5000), st.integers(1, 5000))
def test_any_ruler_is_a_plausible_calibration_or_one_dataset_error(text, width, height):
    try:
        ruler = Ruler.parse(text, "images.csv: line 2: ruler", (width, height))
        calibration = ruler_calibration(ruler, "images.csv: line 2: ruler", (width, height))
    except DatasetError as err:
        assert str(err).startswith("images.csv: line 2: ruler")
        return
    assert RULER_CM[0] <= ruler.length_cm <= RULER_CM[1]
    assert all(0 <= x <= width for x in (ruler.x1, ruler.x2)) and all(0 <= y <= height for y in (ruler.y1, ruler.y2))
    assert math.isfinite(float(calibration.homography[0, 0]))


@FUZZ
@given(st.one_of(JSONISH, st.fixed_dictionaries({"id": JSONISH, "side_cm": JSONISH},
                                                optional={"dictionary": st.one_of(JSONISH, st.sampled_from(
                                                    ["DICT_4X4_50", "ArucoDetector", "DICT_", "__class__"]))})))
def test_any_marker_is_an_aruco_marker_of_plausible_size_or_one_dataset_error(value):
    try:
        spec = followup.marker_spec(value)
    except DatasetError as err:
        assert str(err).startswith("dataset.json: marker:")
        return
    assert isinstance(spec, MarkerSpec) and spec.dictionary in ARUCO_DICTIONARIES
    assert isinstance(spec.marker_id, int) and spec.marker_id >= 0
    assert MARKER_SIDE_CM[0] <= spec.side_cm <= MARKER_SIDE_CM[1]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("fuzz") / "ws")


@FUZZ
@given(st.one_of(st.binary(max_size=300), st.lists(st.lists(st.text(max_size=10), max_size=3), max_size=4).map(
    lambda rows: ("original,study_id\n" + "\n".join(",".join(r) for r in rows)).encode("utf-8", "surrogatepass"))))
def test_any_study_id_mapping_reads_or_is_one_dataset_error(workspace, tmp_path_factory, data):
    path = tmp_path_factory.mktemp("map") / "ids.csv"
    try:
        path.write_bytes(data)
    except UnicodeEncodeError:
        return
    try:
        ids = StudyIds(workspace, path)
    except DatasetError as err:
        assert str(err).startswith(str(path))
        return
    assert all(isinstance(o, str) and isinstance(s, str) for o, s in ids.ids.items())


@FUZZ
@given(st.text(max_size=30))
def test_a_neutralised_cell_restores_exactly_and_never_starts_a_formula(text):
    cell = csvsafe.neutralise(text)
    assert csvsafe.restore(cell) == text
    if cell.startswith(csvsafe.TRIGGERS):
        float(cell)  # only a plain number stays bare: a spreadsheet reads it as one, runs nothing


@pytest.mark.parametrize(("value", "cell"), [
    ("=1+2", "'=1+2"), ("+A1", "'+A1"), ("-2+3", "'-2+3"), ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"), ("\rx", "'\rx"),
    ("'=x", "''=x"), ("-3.5", "-3.5"), ("+1e3", "+1e3"), (-3.5, -3.5), ("plain", "plain"), ("'quoted", "'quoted")])
def test_neutralise_prefixes_formula_text_only(value, cell):
    assert csvsafe.neutralise(value) == cell
