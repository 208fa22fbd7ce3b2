"""Feature extraction at scale: a killed extraction resumes without recomputing finished photos,
and ranks (torchrun) each fill a disjoint slice of one shared cache."""
from __future__ import annotations

import pytest
import torch

from annotations.workspace import Workspace
from core.vision.backbones import load_backbone
from core.vision.features import FeatureCache


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Workspace:
    from annotations.dataset import import_dataset
    from core.phantoms import build

    out = tmp_path_factory.mktemp("shards") / "ds"
    build(out, seed=4, photos=5, patients=2, wounds=6, triplets=0)
    ws = Workspace(tmp_path_factory.mktemp("shardsws") / "ws")
    import_dataset(ws, out)
    return ws


class Killed(Exception):
    """Stands in for the process being killed mid-extraction."""


@pytest.fixture(scope="module")
def bb():
    """One untrained backbone (an untrained backbone's cache key is its instance: shared by every run here)."""
    return load_backbone("efficientnet-lite0@stage5", device="cpu", pretrained=False)


def counting_cache(ws: Workspace, bb, kill_after: int | None = None) -> tuple[FeatureCache, list]:
    """A fresh cache (a new process's) that records every photo it computes (and dies after ``kill_after``)."""
    cache = FeatureCache(ws, bb)
    computed: list[str] = []
    unit = cache._unit

    def recording_unit(image):
        if kill_after is not None and len(computed) == kill_after:
            raise Killed
        computed.append(image)
        return unit(image)

    cache._unit = recording_unit
    return cache, computed


def test_a_killed_extraction_resumes_with_only_the_unfinished_photos(tmp_path, bb):
    ws = Workspace(tmp_path / "ws")
    from annotations.dataset import import_dataset
    from core.phantoms import build

    build(tmp_path / "ds", seed=4, photos=5, patients=2, wounds=6, triplets=0)
    import_dataset(ws, tmp_path / "ds")
    ids = [im["image_id"] for im in ws.store.images()]
    first, _ = counting_cache(ws, bb, kill_after=2)
    with pytest.raises(Killed):
        first.extract(ids, 1, progress=False)
    assert len(list(first.root.glob("*.pt"))) == 2  # two photos finished, written atomically; no partial file
    assert not [p for p in first.root.iterdir() if p.suffix != ".pt"]
    second, computed = counting_cache(ws, bb)
    assert second.extract(ids, 1, progress=False) == ids[2:]
    assert len(computed) == 3
    third, computed = counting_cache(ws, bb)
    assert third.extract(ids, 1, progress=False) == [] and computed == []
    fresh = third.photo(ids[0], 1, use_cache=False)
    assert torch.allclose(fresh.views.float(), third.photo(ids[0], 1).views.float(), atol=1e-2)


def test_ranks_fill_disjoint_slices_of_one_cache(ws, bb, monkeypatch):
    ids = [im["image_id"] for im in ws.store.images()]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    cache, _ = counting_cache(ws, bb)
    assert cache.extract(ids, 1, progress=False) == ids[1::2]
    assert cache.extract(ids, 1, rank=0, world_size=2, progress=False) == ids[0::2]
    assert FeatureCache(ws, bb).extract(ids, 1, rank=0, world_size=1, progress=False) == []
    with pytest.raises(ValueError, match="rank must be in"):
        cache.extract(ids, 1, rank=2, world_size=2)
