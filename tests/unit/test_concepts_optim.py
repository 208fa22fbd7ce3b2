"""Image–text training plumbing: open_clip's weight-decay grouping, and the torchvision v2 crop views."""
from __future__ import annotations

import torch
from torch import nn

from core.concepts.training import decay_groups
from core.vision.augment import crop_views


def test_no_weight_decay_on_temperatures_biases_and_gains():
    head, norm = nn.Linear(4, 3), nn.LayerNorm(3)
    logit_scale, logit_bias = nn.Parameter(torch.tensor(2.6)), nn.Parameter(torch.tensor(-10.0))
    groups = decay_groups([*head.parameters(), *norm.parameters(), logit_scale, logit_bias], lr=1e-3,
                          weight_decay=0.1)
    decayed = [p for g in groups if g["weight_decay"] > 0 for p in g["params"]]
    free = [p for g in groups if g["weight_decay"] == 0 for p in g["params"]]
    assert decayed == [head.weight]
    assert {id(p) for p in free} == {id(head.bias), id(norm.weight), id(norm.bias), id(logit_scale), id(logit_bias)}
    assert all(g["lr"] == 1e-3 for g in groups)
    assert decay_groups([], 1e-3, 0.1) == []


def test_crop_views_are_reproducible_per_generator_and_drawn_per_crop():
    crops = torch.rand(3, 3, 32, 32)
    a = crop_views(crops, torch.Generator().manual_seed(0))
    b = crop_views(crops, torch.Generator().manual_seed(0))
    c = crop_views(crops, torch.Generator().manual_seed(1))
    assert a.shape == crops.shape and a.min() >= 0 and a.max() <= 1
    assert torch.equal(a, b) and not torch.equal(a, c)
    same = crop_views(crops[[0, 0, 0]], torch.Generator().manual_seed(0))
    assert not torch.equal(same[0], same[1])  # each crop gets its own parameters
    state = torch.get_rng_state()
    crop_views(crops, torch.Generator().manual_seed(0))
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is left as it was
