"""Feature extraction at scale: a killed extraction resumes without recomputing finished photos,
and ranks (torchrun) each fill a disjoint slice of one shared cache."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotations.infra.workspace import Workspace
from core.vision.backbones import load_backbone
from core.vision.features import FeatureCache


@pytest.fixture(scope="module")
def ws(tiny_phantom_workspace) -> Workspace:
    return tiny_phantom_workspace(4, 5, 2, 6, 0)


class Killed(Exception):
    """Stands in for the process being killed mid-extraction."""


@pytest.fixture(scope="module")
def bb():
    """One untrained backbone (an untrained backbone's cache key is its instance: shared by every run here)."""
    return load_backbone("efficientnet-lite0@stage5", device="cpu", pretrained=False)


def counting_cache(ws: Workspace, bb, kill_after: int | None = None, shard_size: int = 2
                   ) -> tuple[FeatureCache, list, list]:
    """A fresh cache (a new process's) that records every photo it computes and every backbone
    forward call (and dies when the ``kill_after``-th photo would start)."""
    cache = FeatureCache(ws, bb, shard_size=shard_size)
    computed: list[str] = []
    forwards: list[int] = []
    unit, forward = cache._unit, cache._forward

    def recording_unit(image):
        if kill_after is not None and len(computed) == kill_after:
            raise Killed
        computed.append(image)
        return unit(image)

    def recording_forward(images):
        forwards.append(len(images))
        return forward(images)

    cache._unit, cache._forward = recording_unit, recording_forward
    return cache, computed, forwards


def test_a_killed_extraction_resumes_after_its_last_finished_shard(tiny_phantom_workspace, bb):
    ws = tiny_phantom_workspace(4, 5, 2, 6, 0)
    ids = [im["image_id"] for im in ws.store.images()]
    first, _, _ = counting_cache(ws, bb, kill_after=3)  # shards of 2 photos: dies inside the second shard
    with pytest.raises(Killed):
        first.extract(ids, 1, progress=False)
    shards = sorted(first.root.glob("*.safetensors"))
    assert len(shards) == 1  # the first shard finished, written atomically; no partial file
    assert not [p for p in first.root.iterdir() if p.suffix != ".safetensors"]
    assert sorted(v for _, v in first.index().values()) == [1, 1]
    # a writer killed by SIGKILL leaves its hidden temporary file (partial bytes): never read as a shard
    (first.root / ".shard-0123456789abcdef.safetensors.k1ll3d.safetensors").write_bytes(b"\x08\0")
    second, computed, forwards = counting_cache(ws, bb)
    assert second.extract(ids, 1, progress=False) == ids[2:]
    assert len(computed) == 3 and len(forwards) == 2 * 3  # inference + views forward per unfinished photo only
    assert len(second.shard_files()) == 3 and len(second.index()) == 5
    third, computed, forwards = counting_cache(ws, bb)
    assert third.extract(ids, 1, progress=False) == [] and computed == [] and forwards == []
    assert set(json.loads((third.root / "index.json").read_text())) == {p.name for p in third.shard_files()}
    fresh = third.photo(ids[0], 1, use_cache=False)
    assert torch.allclose(fresh.views.float(), third.photo(ids[0], 1).views.float(), atol=1e-2)
    assert forwards == [1, 1]  # only the uncached recomputation


def test_shards_are_read_by_any_new_cache_and_keys_follow_the_image_content(tiny_phantom_workspace, bb):
    ws = tiny_phantom_workspace(5, 3, 1, 3, 0)
    ids = [im["image_id"] for im in ws.store.images()]
    cache, _, _ = counting_cache(ws, bb, shard_size=32)
    cache.extract(ids, 2, progress=False)
    (cache.root / "index.json").unlink()  # the shard headers alone rebuild the merged index
    again, computed, _ = counting_cache(ws, bb)
    got = again.build(ids, 2, progress=False)
    assert computed == [] and got[ids[0]].views.shape[0] == 2 and got[ids[0]].views.dtype == torch.float16
    keys = set(again.index())
    image = ws.load_image(ids[0])
    image.putpixel((0, 0), (0, 0, 0) if image.getpixel((0, 0)) != (0, 0, 0) else (255, 255, 255))
    changed = ws.images_dir / ws.store.image(ids[0])["file"]
    image.save(changed)
    row = ws.store.image(ids[0])
    ws.store.upsert_image(ids[0], row["file"], hashlib.sha256(changed.read_bytes()).hexdigest(), row["width"],
                          row["height"])
    third, computed, _ = counting_cache(ws, bb)
    third.build(ids, 2, progress=False)
    assert len(computed) == 1 and len(set(third.index()) - keys) == 1  # only the changed photo, under a new key


def test_ranks_fill_disjoint_slices_of_one_cache(ws, bb, monkeypatch):
    ids = [im["image_id"] for im in ws.store.images()]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    cache, _, _ = counting_cache(ws, bb)
    assert cache.extract(ids, 1, progress=False) == ids[1::2]
    assert cache.extract(ids, 1, rank=0, world_size=2, progress=False) == ids[0::2]
    assert FeatureCache(ws, bb).extract(ids, 1, rank=0, world_size=1, progress=False) == []
    with pytest.raises(ValueError, match="rank must be in"):
        cache.extract(ids, 1, rank=2, world_size=2)


@pytest.mark.slow
def test_torchrun_ranks_write_one_cache_that_training_reads_without_recomputing(ws, tmp_path):
    """``torchrun -m core.extract_features`` on 2 processes: each rank computes its slice into the
    one folder, rank 0 records the run; a single process then finds every photo cached."""
    root = tmp_path / "ws"
    shutil.copytree(ws.root, root)
    repo = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29547",
                    "-m", "core.extract_features", "--workspace", str(root), "--backbone", "efficientnet-lite0",
                    "--layer", "stage5", "--views", "1", "--shard-size", "2", "--device", "cpu"],
                   cwd=repo, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True, capture_output=True, timeout=600)
    copy = Workspace(root)
    ids = sorted(im["image_id"] for im in copy.store.images())
    run = copy.store.runs("features")[0]
    assert run["status"] == "done" and run["config"]["world_size"] == 2 and run["config"]["backend"] == "gloo"
    assert run["metrics"]["computed_per_rank"] == [3, 2] and run["metrics"]["computed"] == 5
    bb = load_backbone("efficientnet-lite0", layer="stage5", device="cpu")
    cache, computed, forwards = counting_cache(copy, bb)
    assert len(cache.shard_files()) == 3  # rank 0: photos 0, 2 | 4; rank 1: photos 1, 3
    assert set(json.loads((cache.root / "index.json").read_text())) == {p.name for p in cache.shard_files()}
    assert cache.extract(ids, 1, progress=False) == [] and computed == [] and forwards == []
    fresh = cache.photo(ids[1], 1, use_cache=False)
    assert torch.allclose(fresh.views.float(), cache.photo(ids[1], 1).views.float(), atol=1e-2)
