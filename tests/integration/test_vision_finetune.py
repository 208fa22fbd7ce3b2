"""Partial fine-tuning of the backbone's last stage (:mod:`core.vision.finetune`) on a SYNTHETIC phantom."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from annotations.infra.fileio import read_json
from core.eval.protocol import oriented_expert, split_triplets
from core.vision.backbones import load_backbone
from core.vision.baseline import mean_pooled
from core.vision.features import FeatureCache, TokenBank, workspace_wounds
from core.vision.finetune import (
    RUN_KIND,
    SEED_STRIDE,
    AdaptConfig,
    FineTuneConfig,
    LastStageTuner,
    pooling_weights,
    tail_of,
)
from core.vision.token_tail import _Taps, step_flops, token_cells, token_pooled


@pytest.fixture(scope="module")
def tiny(tiny_phantom_workspace):
    """A phantom workspace, its rows, expert triplets and stage-6 / full features (2 augmented views)."""
    ws = tiny_phantom_workspace(5, 8, 4, 12, 60)
    image_ids, keys = workspace_wounds(ws)
    full = load_backbone("efficientnet-lite0", layer="full")
    stage6 = FeatureCache(ws, load_backbone("efficientnet-lite0", layer="stage6")).build(image_ids, 2, False)
    bank = TokenBank(FeatureCache(ws, full).build(image_ids, 0, False), keys)
    return ws, image_ids, oriented_expert(ws, image_ids), full, [stage6[i] for i in image_ids], bank


def test_the_untuned_tail_reproduces_the_frozen_embedding(tiny):
    """The last stage + head on the cached stage-6 features, pooled by :func:`pooling_weights`, is the
    frozen ``full`` mean-pool embedding (up to the cache's fp16)."""
    _, image_ids, _, full, photos, bank = tiny
    tuner = LastStageTuner(full, photos)
    with torch.no_grad():
        mine = tuner._embed(tuner.eval_x, tuner.eval_w).numpy()
    ids, frozen = mean_pooled(bank)[1:]
    assert ids == image_ids
    assert np.abs(mine - frozen).max() < 0.02 * np.abs(frozen).max()
    assert torch.allclose(tuner.eval_w.flatten(1).sum(1), torch.ones(len(photos)))  # weights of a mean


def test_pooling_weights_leave_out_a_wound_without_tokens():
    frac = torch.zeros(2, 4, 4)
    frac[0, :2, :2] = 1.0
    w = pooling_weights(frac)
    assert w.sum() == pytest.approx(1.0) and (w[:2, :2] == 0.25).all()
    assert pooling_weights(torch.zeros(2, 4, 4)).sum() == 0


def test_the_token_restricted_tail_is_the_dense_tail_pooled_in_value_and_gradient(tiny):
    """Issue 52: :func:`token_pooled` computes the tail only where the pooled embedding reads it; its embedding and
    weight gradients are the dense tail's, pooled (held to a float64 dense reference: the dense float32 path is
    itself the less exact of the two), and :func:`step_flops` counts fewer FLOPs than the dense step."""
    _, _, _, full, photos, _ = tiny
    tuner = LastStageTuner(full, photos)
    tail = tail_of(full).eval().requires_grad_(True)
    x, w = tuner.view_x[:, 1], tuner.view_w[:, 1]
    reference = copy.deepcopy(tail).double()
    dense = torch.einsum("bchw,bhw->bc", reference(x.double()), w.double())
    out = token_pooled(tail, x, w)
    assert torch.allclose(out.double(), dense, rtol=1e-5, atol=1e-5)
    probe = torch.randn_like(out)
    grads = torch.autograd.grad((out * probe).sum(), list(tail.parameters()))
    ref = torch.autograd.grad((dense * probe.double()).sum(), list(reference.parameters()))
    for name, g, r in zip([n for n, _ in tail.named_parameters()], grads, ref):
        assert (g.double() - r).norm() <= 1e-4 * r.norm() + 1e-9, name
    # a photo whose wound sits in a corner reads the depthwise kernel's zero padding
    corner = torch.zeros_like(w[:1])
    corner[0, 0, 0] = 1.0
    assert torch.allclose(token_pooled(tail, x[:1], corner).double(),
                          reference(x[:1].double())[:, :, 0, 0], rtol=1e-5, atol=1e-5)
    # the counted arithmetic: linear in the photos, below the dense step's three passes of every convolution
    flops = step_flops(tail, w)
    assert flops == sum(step_flops(tail, w[i:i + 1]) for i in range(len(w)))
    h, v = x.shape[-2:]
    dense_forward = sum(2 * m.weight.numel() * h * v for m in tail.modules() if isinstance(m, torch.nn.Conv2d))
    assert 0 < flops < 3 * dense_forward * len(x)


def test_the_depthwise_taps_backward_is_autograds_to_the_bit(tiny):
    """Issue 52: the taps' own backward (one gradient buffer for the k² taps) gives the gradients autograd gives the
    plain sum of k² gathers times taps, equal to the bit, on the tiny workspace's tokens and on a wound in the
    grid's corner (padding reads); the fine-tune's trajectory and every stored figure are therefore unchanged."""
    _, _, _, full, photos, _ = tiny
    tuner = LastStageTuner(full, photos)
    tail = tail_of(full).eval().requires_grad_(True)
    dw = tail.get_submodule("0.0").conv_dw
    corner = torch.zeros_like(tuner.view_w[:1, 1])
    corner[0, 0, 0] = 1.0
    for x, w in ((tuner.view_x[:, 1], tuner.view_w[:, 1]), (tuner.view_x[:1, 1], corner)):
        _, reads, inside = token_cells(w, dw)
        rows = int(reads.max()) + 1
        index = torch.where(inside, reads, rows)
        padded = torch.cat([torch.randn(rows, dw.out_channels), torch.zeros(1, dw.out_channels)]).requires_grad_()
        taps = dw.weight.flatten(1).t()
        plain = padded.index_select(0, index[:, 0]) * taps[0]
        for t in range(1, len(taps)):
            plain = plain + padded.index_select(0, index[:, t]) * taps[t]
        ours = _Taps.apply(padded, taps, index)
        assert torch.equal(ours, plain)
        probe = torch.randn_like(plain)
        expected = torch.autograd.grad((plain * probe).sum(), [padded, dw.weight])
        got = torch.autograd.grad((ours * probe).sum(), [padded, dw.weight])
        # every row but the padding's (its gradient is dropped: the forward concatenates a constant zero row)
        assert torch.equal(got[0][:-1], expected[0][:-1]) and torch.equal(got[1], expected[1])


def test_fine_tuning_lowers_the_hinge_on_training_photos_only(tiny):
    _, image_ids, triplets, full, photos, _ = tiny
    test_rows = np.arange(len(image_ids) // 2)
    train = triplets[split_triplets(triplets, test_rows)[0]]
    fit_rows = np.setdiff1d(np.arange(len(image_ids)), test_rows)
    tuner = LastStageTuner(full, photos, FineTuneConfig(steps=30, lr=1e-3, batch_triplets=len(train)))
    before = [p.detach().clone() for p in tuner.start.parameters()]
    z = tuner.fit(train, fit_rows, seed=0).transform()
    assert np.mean(tuner.losses[-5:]) < np.mean(tuner.losses[:5])
    assert np.allclose(np.linalg.norm(z, axis=1), 1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, tuner.start.parameters()))  # the backbone is untouched
    again = LastStageTuner(full, photos, tuner.config).fit(train, fit_rows, seed=0).transform()
    assert np.array_equal(z, again)  # same seed, same embedding
    with pytest.raises(ValueError, match="fit_rows"):
        tuner.fit(triplets, fit_rows)  # triplets naming held-out photos


def test_test_time_views_average_the_tuned_views_and_centre_on_the_training_photos(tiny):
    """``transform`` (the default, test-time views): the mean of the tuned tail's embeddings over each photo's
    inference and cached views, centred on the training photos' mean of it, unit length; with every view the
    inference view it is the inference view's embedding (``transform(False)``, the config's ``test_views=False``)."""
    _, image_ids, triplets, full, photos, _ = tiny
    test_rows = np.arange(len(image_ids) // 2)
    train = triplets[split_triplets(triplets, test_rows)[0]]
    fit_rows = np.setdiff1d(np.arange(len(image_ids)), test_rows)
    tuner = LastStageTuner(full, photos, FineTuneConfig(steps=5)).fit(train, fit_rows, seed=0)
    z = tuner.transform()
    assert np.allclose(z, tuner.transform(True)) and tuner.embedded_views == 2
    with torch.no_grad():
        mean = torch.stack([tuner._embed(tuner.view_x[:, v], tuner.view_w[:, v]) for v in range(3)]).mean(0).double()
    expected = (mean - mean[fit_rows].mean(0)).numpy()
    assert tuner.view_x.shape[1] == 3 and np.allclose(z, expected / np.linalg.norm(expected, axis=1, keepdims=True))
    assert not np.allclose(z, tuner.transform(False), atol=1e-4)  # the augmented views count
    inference = LastStageTuner(full, photos, FineTuneConfig(steps=5, test_views=False)).fit(train, fit_rows, seed=0)
    assert np.allclose(inference.transform(), tuner.transform(False)) and inference.embedded_views == 0
    tuner.view_x, tuner.view_w = (t[:, :1].expand(-1, 3, *t.shape[2:]) for t in (tuner.view_x, tuner.view_w))
    tuner.fit(train, fit_rows, seed=0)  # the same tail again (same seed); a fit forgets the embeddings it had
    assert np.allclose(tuner.transform(), tuner.transform(False), atol=1e-6)


def test_transform_and_save_embed_the_photos_once_per_fit(tiny, tmp_path, monkeypatch):
    """``save`` after ``transform`` reuses the fit's embeddings (its centre is the one ``transform`` subtracted);
    a new fit embeds again."""
    import core.vision.finetune as finetune
    _, image_ids, triplets, full, photos, _ = tiny
    calls: list[int] = []
    monkeypatch.setattr(finetune, "token_pooled", lambda *a: calls.append(1) or token_pooled(*a))
    tuner = LastStageTuner(full, photos, FineTuneConfig(steps=2, members=2))
    tuner.fit(triplets, np.arange(len(image_ids)), seed=0)
    fitting = len(calls)
    z = tuner.transform()
    views = tuner.view_x.shape[1]
    assert len(calls) - fitting == 2 * views  # every view, each member
    tuner.save(tmp_path / "tail.pt", "efficientnet-lite0")
    assert len(calls) - fitting == 2 * views
    saved = torch.load(tmp_path / "tail.pt")["center"].numpy()
    assert np.allclose(saved, tuner.centre()) and np.array_equal(z, tuner.transform())
    tuner.fit(triplets, np.arange(len(image_ids)), seed=1)
    assert not np.allclose(tuner.transform(), z)


def test_an_ensemble_is_its_members_unit_embeddings_side_by_side(tiny):
    """``members=2``: two tails fitted with seeds s and s + SEED_STRIDE, each embedding centred on the training
    photos and unit length, concatenated over √2 (unit length; squared distances the members' mean); the
    single-member fits with those seeds are its halves, and its FLOPs count both fits."""
    _, image_ids, triplets, full, photos, _ = tiny
    fit_rows = np.arange(len(image_ids))
    pair = LastStageTuner(full, photos, FineTuneConfig(steps=4, members=2)).fit(triplets, fit_rows, seed=3)
    one = LastStageTuner(full, photos, FineTuneConfig(steps=4))
    halves = [one.fit(triplets, fit_rows, seed=s).transform() for s in (3, 3 + SEED_STRIDE)]
    flops = one.fit_flops_
    z = pair.transform()
    assert len(pair.tails) == 2 and len(pair.losses) == 8 and pair.fit_flops_ == 2 * flops
    np.testing.assert_allclose(z, np.hstack(halves) / np.sqrt(2), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0)
    assert pair.centre().shape == (2 * halves[0].shape[1],)


def test_adapting_without_labels_lowers_vicreg_and_leaves_the_backbone_untouched(tiny):
    """The self-supervised adaptation (issue 30 §4) trains a copy of the tail on the photos' views alone; the
    copy starts a second tuner whose untuned embedding is centred on the photos it is given, unit length."""
    _, image_ids, _, full, photos, _ = tiny
    tuner = LastStageTuner(full, photos)
    before = [p.detach().clone() for p in tuner.start.parameters()]
    config = AdaptConfig(steps=25, lr=1e-3, batch_photos=len(photos), projector=32)
    adapted = tuner.adapt(config)
    assert np.mean(tuner.losses[-5:]) < np.mean(tuner.losses[:5])
    assert all(torch.equal(a, b) for a, b in zip(before, tuner.start.parameters()))  # the backbone is untouched
    assert not all(torch.equal(a, b) for a, b in zip(before, adapted.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(adapted.parameters(), LastStageTuner(full, photos).adapt(config)
                                                                        .parameters()))  # same seed, same tail
    fit_rows = np.arange(len(image_ids) // 2, len(image_ids))
    z = LastStageTuner(full, photos, start=adapted).untuned(fit_rows).transform()
    assert np.allclose(np.linalg.norm(z, axis=1), 1.0)
    frozen = LastStageTuner(full, photos).untuned(fit_rows).transform()
    assert not np.allclose(z, frozen)
    with pytest.raises(ValueError, match="at least 2 photos with augmented views"):
        LastStageTuner(full, photos[:1]).adapt(config)


def test_the_fine_tune_mode_records_its_strict_figure_first(tiny_phantom, imported, capsys):
    """``--mode fine-tune``: a ``vision-finetune`` run whose figure is strict out of fold (patient-disjoint
    folds, with the frozen centred embedding on the same triplets), then every photo embedded; the Report
    shows the strict figure, never the in-sample one."""
    from core.eval.report import STRICT, build_rows
    from core.runtime import load_embeddings
    from core.train_triderm import main

    ws = imported(tiny_phantom(5, 8, 4, 12, 60))
    assert main(["--workspace", str(ws.root), "--mode", "fine-tune", "--views", "2", "--cv-repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "mode: fine-tune (asked)" in out and "strict — all three photos unseen" in out
    run = ws.store.runs(kind=RUN_KIND)[0]
    cv = run["metrics"]["cv"]
    assert run["status"] == "done" and cv["protocol"] == "strict" and cv["folds"] == 2 and cv["repeats"] == 1
    assert "balanced" in cv["frozen_centred"] and len(run["metrics"]["loss"]) == FineTuneConfig().steps
    # issue 52: every fit's wall time and counted arithmetic are in the run record (2 folds, then the final fit)
    timing = run["metrics"]["timing"]
    assert [f["photos"] for f in timing["fits"]][-1] == 8 and len(timing["fits"]) == 3
    assert all(f["s"] > 0 and f["gflop"] > 0 for f in timing["fits"])
    assert timing["fit_gflop"] == pytest.approx(sum(f["gflop"] for f in timing["fits"]), abs=0.2)
    emb = load_embeddings(ws, run["id"])
    assert np.allclose(np.linalg.norm(emb["image_emb"], axis=1), 1.0) and len(emb["image_ids"]) == 8
    row = next(r for r in build_rows(ws, [run], ws.store.expert_triplets(), n_boot=10, seed=0))
    assert row["protocol"] == STRICT and row["balanced"] == cv["balanced"]
    # issue 54: the strict triplets are kept one by one, and the demo's last words are the Report's verdict on them
    assert sum(n for *_, n in cv["per_triplet"]) == cv["n"]
    verdict = read_json(ws.runs_dir / "report" / "report.json")["verdict"]
    assert verdict["trained_run"] == run["id"] and verdict["n"] == len({tuple(t[:3]) for t in cv["per_triplet"]})
    assert verdict["trained"]["balanced"] == pytest.approx(cv["balanced"])  # every strict triplet is common
    assert f"Verdict [SYNTHETIC phantom data]: {verdict['line']}\nNext step: {verdict['next_step']}" in out


def test_a_fine_tune_run_places_new_photos_where_it_put_the_study_photos(tiny_phantom, imported, capsys, tmp_path):
    """The run saves its tuned weights: ``core.embed --model RUN --images DIR`` embeds a copy of a study photo
    (photo + mask) onto that photo's stored embedding, so it is its own nearest study photo."""
    import shutil

    from core.embed import main as embed
    from core.runtime import load_embeddings
    from core.train_triderm import main
    from core.vision.inference import TunedModel, open_model

    data = tiny_phantom(5, 8, 4, 12, 60)
    ws = imported(data)
    assert main(["--workspace", str(ws.root), "--mode", "fine-tune", "--views", "2", "--cv", "0"]) == 0
    run = ws.store.runs(kind=RUN_KIND)[0]
    emb = load_embeddings(ws, run["id"])
    model = open_model(ws, str(run["id"]))
    assert isinstance(model, TunedModel) and model.views == 2  # the run's test-time views
    for n, image_id in enumerate(emb["image_ids"][:3]):
        placed = model.embed(ws.load_image(image_id), ws.load_mask(image_id), ws.store.image(image_id)["sha256"])
        assert np.abs(placed - emb["image_emb"][n]).max() < 1e-4
    photo = next((data / "images").iterdir())
    new = tmp_path / "new"
    (new / "masks").mkdir(parents=True)
    shutil.copy(photo, new / photo.name)
    shutil.copy(data / "masks" / f"{photo.stem}.png", new / "masks" / f"{photo.stem}.png")
    capsys.readouterr()
    assert embed(["--workspace", str(ws.root), "--model", str(run["id"]), "--images", str(new), "--neighbours", "1"]) == 0
    nearest = capsys.readouterr().out.splitlines()[-1]
    assert nearest.strip().startswith(f"{photo.stem}: ") and "(0.000)" in nearest


def test_the_fine_tune_mode_needs_expert_triplets(tiny_phantom, imported, tmp_path):
    import shutil

    from core.train_triderm import main

    ds = tmp_path / "ds"
    shutil.copytree(tiny_phantom(5, 8, 4, 12, 60), ds)
    (ds / "triplets.csv").unlink()
    ws = imported(ds)
    with pytest.raises(SystemExit):
        main(["--workspace", str(ws.root), "--mode", "fine-tune"])
    assert not ws.store.runs(kind=RUN_KIND)


def test_the_fine_tune_modes_options_are_its_run_record(tiny_phantom, imported, capsys):
    """Issue 51: ``--steps 3 …`` (auto → fine-tune) trains exactly 3 steps with the options given, all in the run
    record; ``--mode fine-tune --epochs 3`` (TriDerm-V's option, not this mode's) is refused before any run."""
    from core.train_triderm import main

    ws = imported(tiny_phantom(5, 8, 4, 12, 60))
    given = {"steps": 3, "lr": 1e-3, "margin": 0.2, "batch_triplets": 16, "seed": 4}
    with pytest.raises(SystemExit) as err:
        main(["--workspace", str(ws.root), "--mode", "fine-tune", "--epochs", "3"])
    assert err.value.code == 2 and "--epochs: not read by --mode fine-tune" in capsys.readouterr().err
    assert not ws.store.runs()
    argv = [a for k, v in given.items() for a in ("--" + k.replace("_", "-"), str(v))]
    assert main(["--workspace", str(ws.root), "--views", "2", "--cv", "0", *argv]) == 0  # auto → fine-tune
    assert "mode: fine-tune (" in capsys.readouterr().out
    (run,) = ws.store.runs(kind=RUN_KIND)
    assert {k: run["config"][k] for k in given} == given and run["seed"] == 4
    assert (run["config"]["views"], run["config"]["cv"]) == (2, 0)
    assert len(run["metrics"]["loss"]) == 3 and len(run["metrics"]["timing"]["fits"]) == 1  # 3 steps, one fit
