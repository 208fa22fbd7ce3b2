"""Crop and zoom geometry of the triplet tiles and the zoom dialog (annotations.accounts.session): a small wound
fills about half its crop, a wound at the photo's edge stays whole and magnified, 2× / 4× zoom closer,
a pan moves the window by half of it and stops at the photo's edge."""
from __future__ import annotations

import numpy as np
import pytest

from annotations.accounts import session

ASPECT = 4 / 3
TILE_WIDTH = 430  # a triplet tile's width on screen at 1366 px (three columns)


def labels_with(box: tuple[int, int, int, int], shape: tuple[int, int] = (3024, 4032)) -> np.ndarray:
    """A label map of ``shape`` with wound 1 filling ``box`` (left, top, right, bottom)."""
    labels = np.zeros(shape, np.int32)
    labels[box[1]:box[3], box[0]:box[2]] = 1
    return labels


def inside(outer, inner) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


def test_wounds_box_spans_every_wound():
    labels = labels_with((10, 20, 30, 40), (100, 120))
    labels[70:80, 90:100] = 2
    assert session.wounds_box(labels) == (10, 20, 100, 80)
    assert session.wounds_box(np.zeros((5, 5), np.int32)) is None


def test_a_tiny_wound_fills_half_its_crop_and_shows_at_least_150_px_wide():
    wound = (2000, 1500, 2040, 1530)  # 40×30 px of a 12 MP photo: 1 % of its width
    box = session.wound_crop_box(labels_with(wound), ASPECT)
    assert inside(box, wound)
    width, height = box[2] - box[0], box[3] - box[1]
    assert abs(width / height - ASPECT) < 0.05
    assert width == pytest.approx(2 * 40, abs=2)  # half a wound's width of margin on each side
    assert TILE_WIDTH * 40 / width >= 150  # the wound's width on screen
    # centred on the wound
    assert abs((box[0] + box[2]) / 2 - 2020) <= 1 and abs((box[1] + box[3]) / 2 - 1515) <= 1


def test_a_speck_is_cropped_no_smaller_than_the_minimum_side():
    box = session.wound_crop_box(labels_with((500, 500, 503, 502)), ASPECT, min_side=40)
    assert box[3] - box[1] >= 40 and box[2] - box[0] >= 53 and inside(box, (500, 500, 503, 502))


def test_a_wound_at_the_photo_edge_stays_whole_and_magnified():
    wound = (4000, 2990, 4032, 3024)  # the bottom right corner
    box = session.wound_crop_box(labels_with(wound), ASPECT)
    assert inside(box, wound) and box[2] == 4032 and box[3] == 3024  # moved inward, not shrunk
    assert box[2] - box[0] == pytest.approx(2 * 34 * ASPECT, abs=2)  # same size as in the middle
    left = session.wound_crop_box(labels_with((0, 1000, 20, 1040)), ASPECT)
    assert left[0] == 0 and inside(left, (0, 1000, 20, 1040)) and left[2] - left[0] < 200


def test_wounds_larger_than_a_crop_of_the_photo_give_the_whole_photo():
    labels = labels_with((10, 0, 390, 300), (300, 400))
    assert session.wound_crop_box(labels) == (0, 0, 400, 300)
    assert session.wound_crop_box(np.zeros((30, 40), np.int32)) is None


def test_zoom_fits_the_wounds_then_magnifies_2x_and_4x():
    size, wound = (4032, 3024), (2000, 1500, 2200, 1650)
    fit = session.zoom_box(size, wound, 1.0, ASPECT)
    assert inside(fit, wound) and (fit[2] - fit[0]) == pytest.approx(200 * 1.5, abs=2)  # wound = 2/3 of the view
    two, four = session.zoom_box(size, wound, 2.0, ASPECT), session.zoom_box(size, wound, 4.0, ASPECT)
    assert (two[2] - two[0]) == pytest.approx((fit[2] - fit[0]) / 2, abs=1)
    assert (four[2] - four[0]) == pytest.approx((fit[2] - fit[0]) / 4, abs=1)
    assert inside(fit, two) and inside(two, four)  # all around the wound's centre
    assert session.zoom_box(size, wound, 0.0, ASPECT) == (0, 0, 4032, 3024)
    assert session.zoom_box(size, None, 1.0, ASPECT) == (0, 0, 4032, 3024)  # nothing outlined: the photo
    with pytest.raises(ValueError, match="magnification"):
        session.zoom_box(size, wound, -1.0)


def test_zoom_never_goes_below_the_minimum_side():
    box = session.zoom_box((400, 300), (200, 150, 202, 151), 4.0, ASPECT, min_side=24)
    assert box[3] - box[1] == 24 and box[2] - box[0] == 32


def test_pan_moves_half_a_window_and_stops_at_the_edge():
    size, wound = (4032, 3024), (3900, 100, 3960, 145)  # near the top right corner
    fit = session.zoom_box(size, wound, 1.0, ASPECT)
    width = fit[2] - fit[0]
    left = session.zoom_box(size, wound, 1.0, ASPECT, session.panned(fit, -1, 0))
    assert left[0] == pytest.approx(fit[0] - width / 2, abs=1) and left[1] == fit[1]
    down = session.zoom_box(size, wound, 1.0, ASPECT, session.panned(fit, 0, 1))
    assert down[1] == pytest.approx(fit[1] + (fit[3] - fit[1]) / 2, abs=1)
    right = fit
    for _ in range(50):  # far past the edge: the window stops there, keeping its size
        right = session.zoom_box(size, wound, 1.0, ASPECT, session.panned(right, 1, -1))
    assert right[2] == 4032 and right[1] == 0 and right[2] - right[0] == width
    back = session.zoom_box(size, wound, 1.0, ASPECT, session.panned(right, -1, 0))  # one step back moves at once
    assert back[0] == pytest.approx(right[0] - width / 2, abs=1)
