"""User-given checkpoints load with ``weights_only=True``: a crafted pickle is refused with one
clear error before any of its code runs; plain training checkpoints still load."""
from __future__ import annotations

import os

import pytest
import torch

from core.nested.training import load_init
from core.runtime import load_checkpoint
from core.vision.backbones import load_backbone


class Payload:
    """Unpickling this runs a shell command: what a malicious checkpoint would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def crafted(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "extra": Payload(str(marker))}, path)
    return path, marker


def test_a_crafted_checkpoint_is_refused_before_it_runs(crafted) -> None:
    path, marker = crafted
    with pytest.raises(ValueError, match=f"{path}: refused — not a plain weights checkpoint"):
        load_checkpoint(path)
    with pytest.raises(ValueError, match="refused"):
        load_init(torch.nn.Linear(2, 2), path)  # train_slimp --init
    with pytest.raises(ValueError, match="refused"):
        load_backbone(str(path), device="cpu")  # a backbone given as a file
    assert not marker.exists()


def test_plain_training_checkpoints_still_load(tmp_path) -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    path = tmp_path / "checkpoint.pt"
    torch.save({"args": {"lr": 1e-3, "crop_size": None, "backbone": "x"}, "model": model.state_dict(),
                "optimizer": opt.state_dict(), "epoch": 3, "losses": [1.0, 0.5], "history": {"a": [1.0]}}, path)
    blob = load_checkpoint(path)
    assert blob["epoch"] == 3 and torch.equal(blob["model"]["weight"], model.weight.detach())
    other = torch.nn.Linear(3, 2)
    assert load_init(other, path) == [] and torch.equal(other.weight, model.weight)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match=r"junk.pt"):
        load_checkpoint(tmp_path / "junk.pt")
