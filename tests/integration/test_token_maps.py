"""Token maps (issue 54): the training job stores every photo's map beside its run; ``core.token_maps`` makes them
for an older run (SYNTHETIC phantom workspace)."""
from __future__ import annotations

import numpy as np
import pytest

from core.eval.explore import TOKEN_MAPS_ARTIFACT, stored_token_maps
from core.runtime import load_embeddings
from core.vision.baseline import centred_unit
from core.vision.finetune import RUN_KIND
from core.vision.token_maps import MAPS_FILE


@pytest.fixture(scope="module")
def tuned(tiny_phantom, tmp_path_factory):
    """A workspace with a fine-tune run made by the training job (the default mode's), and the job's output."""
    import contextlib
    import io

    from annotations.infra.workspace import Workspace
    from annotations.io.dataset import import_dataset
    from core.train_triderm import main

    ws = Workspace(tmp_path_factory.mktemp("maps") / "ws")
    import_dataset(ws, tiny_phantom(5, 8, 4, 12, 60))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--workspace", str(ws.root), "--mode", "fine-tune", "--views", "2", "--cv", "0"]) == 0
    return ws, ws.store.runs(kind=RUN_KIND)[0], out.getvalue()


def test_contributions_are_each_tokens_share_of_the_centred_embedding():
    """On a linear tail the maps are ``w_t ⟨f_t − c, e⟩ / |p − c|``: they sum to 1 over a photo's wound tokens, are
    0 outside them, and the pooled vectors are the mean-of-wound-means of the tokens; a photo without a wound token
    has an all-zero map."""
    import torch

    from core.vision.features import PhotoFeatures
    from core.vision.token_maps import contribution_maps

    rng = np.random.default_rng(0)
    feats = [torch.from_numpy(rng.normal(size=(3, 4, 4))).half() for _ in range(3)]
    fracs = [torch.zeros(2, 4, 4) for _ in range(3)]
    fracs[0][0, :2, :2] = 1.0  # photo 0: wound 1 has 4 tokens, wound 2 one
    fracs[0][1, 3, 3] = 1.0
    fracs[1][0, 1:3, 1:4] = 1.0  # photo 1: one wound of 6 tokens; photo 2: none
    photos = [PhotoFeatures([1, 2], f.new_zeros((0, 3, 4, 4)), torch.zeros(0, 2, 4, 4), f, fr)
              for f, fr in zip(feats, fracs)]
    tail = torch.nn.Conv2d(3, 3, 1, bias=False)
    torch.nn.init.eye_(tail.weight.view(3, 3))
    center = rng.normal(size=3)
    maps, pooled = contribution_maps(tail, photos, center, batch=2)
    assert maps.shape == (3, 4, 4) and np.isfinite(maps).all()
    np.testing.assert_allclose(maps[:2].sum(axis=(1, 2)), 1.0, atol=1e-6)
    assert (maps[2] == 0).all() and (maps[0][2:, :3] == 0).all()
    f0 = feats[0].float().numpy().astype(np.float64)
    p0 = (f0[:, :2, :2].mean(axis=(1, 2)) + f0[:, 3, 3]) / 2  # the mean over wounds of their mean tokens
    np.testing.assert_allclose(pooled[0], p0, atol=1e-6)
    e = centred_unit(p0, center)
    assert maps[0][3, 3] == pytest.approx(0.5 * (f0[:, 3, 3] - center) @ e / np.linalg.norm(p0 - center), abs=1e-6)


@pytest.mark.slow
def test_the_training_job_stores_every_photos_token_map(tuned):
    """photos × grid, finite, each photo's map summing to 1 (its tokens' shares of its embedding), recorded in the
    run's artifacts; the shares are those of the photo as shown (the inference view: the pooled vectors they
    decompose, centred on the run's centre and scaled, are the run's model's embedding of that view alone)."""
    from dataclasses import replace

    from core.eval.explore import UMAP_MIN_DIST, UMAP_NEIGHBOURS, map_input, stored_umap
    from core.vision.features import FeatureCache
    from core.vision.inference import TunedModel
    from core.vision.token_maps import contribution_maps

    ws, run, out = tuned
    assert run["artifacts"][TOKEN_MAPS_ARTIFACT] == f"runs/{run['id']}/{MAPS_FILE}"
    assert "token maps of every photo for Explore" in out and "Explore's map (UMAP) and token maps stored" in out
    assert stored_umap(ws, map_input(ws, [run["id"]]), UMAP_NEIGHBOURS, UMAP_MIN_DIST) is not None  # the page's map
    emb = load_embeddings(ws, run["id"])
    with np.load(ws.root / run["artifacts"][TOKEN_MAPS_ARTIFACT], allow_pickle=False) as data:
        assert [str(i) for i in data["image_ids"]] == emb["image_ids"] and str(data["kind"]) == "contribution"
        maps, grid = data["maps"], tuple(data["grid"])
    assert maps.shape == (len(emb["image_ids"]), *grid) and grid == (14, 14)
    assert np.isfinite(maps).all()
    np.testing.assert_allclose(maps.sum(axis=(1, 2)), 1.0, atol=1e-4)
    tokens = (maps != 0).sum(axis=(1, 2))
    assert tokens.min() >= 1 and maps.max(axis=(1, 2)).min() > 0  # every photo has a wound token with a share
    widest = maps[int(np.argmax(tokens))]
    assert not np.allclose(widest[widest != 0], widest[widest != 0].mean())  # the tokens' shares differ
    model = TunedModel.load(ws, run["id"])
    photos = FeatureCache(ws, model.backbone).build(emb["image_ids"], 0, False)
    again, pooled = contribution_maps(model.tail, [photos[i] for i in emb["image_ids"]], model.center)
    assert model.views == 2  # the run embeds with test-time views; its maps are of the photo as shown
    shown = replace(model, views=0)
    np.testing.assert_allclose(centred_unit(pooled, model.center), [
        shown.embed(ws.load_image(i), ws.load_mask(i)) for i in emb["image_ids"]], atol=1e-4)
    np.testing.assert_allclose(again, maps, atol=1e-6)


@pytest.mark.slow
def test_the_token_maps_job_makes_them_for_an_older_run(tuned, capsys):
    """A run stored before the maps were (no file, no artifact): the page finds none; ``core.token_maps RUN``
    writes the same maps the training job writes, and the page then reads them."""
    from core.token_maps import main

    ws, run, _ = tuned
    path = ws.root / run["artifacts"][TOKEN_MAPS_ARTIFACT]
    before = np.load(path)["maps"]
    path.unlink()
    older = {**run, "artifacts": {k: v for k, v in run["artifacts"].items() if k != TOKEN_MAPS_ARTIFACT}}
    assert stored_token_maps(ws, older) is None
    assert main(["--workspace", str(ws.root), str(run["id"])]) == 0
    assert f"token maps of run {run['id']}" in capsys.readouterr().out
    maps = stored_token_maps(ws, ws.store.run(run["id"]))
    assert maps is not None and maps.kind == "contribution"
    np.testing.assert_allclose(maps.maps, before, atol=1e-6)
    with pytest.raises(SystemExit):
        main(["--workspace", str(ws.root), "999"])  # no such run: one clear error
