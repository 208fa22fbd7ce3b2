"""Concept vocabulary, tagger (with negation), sub-captions, concept scores and bottleneck."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.concepts.scores import ConceptBottleneck, ConceptScorer
from core.concepts.vocabulary import ConceptTagger, disease_aspect, load_vocab, sub_captions


@pytest.fixture(scope="module")
def tagger() -> ConceptTagger:
    return ConceptTagger(load_vocab())


def test_vocab_groups() -> None:
    assert len(load_vocab(groups=("skincon",))) == 22
    assert len(load_vocab(groups=("derm7pt",))) == 7
    names = {c.name for c in load_vocab()}
    assert {"granulation", "fibrin", "crust", "erythema", "hyperkeratotic_border", "deep"} <= names
    assert all(c.positive and c.negative for c in load_vocab(groups=("wound", "skincon", "derm7pt")))


def test_vocab_rejects_bad_file(tmp_path) -> None:
    bad = tmp_path / "v.json"
    bad.write_text(json.dumps({"concepts": [{"name": "x", "label": "x", "group": "wound", "terms": ["x"],
                                             "positive": [], "negative": ["y"]}]}))
    with pytest.raises(ValueError, match="positive"):
        load_vocab(bad)


@pytest.mark.parametrize("text, expected", [
    ("no fibrin", {"fibrin": -1}),
    ("without crusts", {"crust": -1}),
    ("Granulating wound bed, no fibrin or crust.", {"granulation": 1, "fibrin": -1, "crust": -1}),
    ("no crust, fibrin, or erythema", {"crust": -1, "fibrin": -1, "erythema": -1}),
    ("fibrin absent, erythema around the wound", {"fibrin": -1, "erythema": 1}),
    ("no signs of inflammation, fibrotic border.", {"erythema": -1, "fibrotic_border": 1}),
    ("Shallow erosion with crusting but no erythema", {"erosion": 1, "crust": 1, "erythema": -1}),
    ("crusts: none", {"crust": -1}),
    ("Deep ulcer. Thick yellow slough.", {"deep": 1, "fibrin": 1}),
    ("hypergranulation", {}),
])
def test_tagger_negation(tagger: ConceptTagger, text: str, expected: dict[str, int]) -> None:
    assert tagger.tag(text) == expected


def test_mentions_offsets_point_at_terms(tagger: ConceptTagger) -> None:
    text = "Deep ulcer. Some crusting, no fibrin."
    found = {(n, text[a:b], v) for n, a, b, v in tagger.mentions(text)}
    assert found == {("deep", "Deep", 1), ("crust", "crusting", 1), ("fibrin", "fibrin", -1)}


def test_labels_matrix(tagger: ConceptTagger) -> None:
    names, rows = tagger.labels(["fibrin", "no fibrin", "crust"])
    f = names.index("fibrin")
    assert [r[f] for r in rows] == [1, 0, -1]


def test_sub_captions_and_aspects(tagger: ConceptTagger) -> None:
    assert sub_captions("Deep ulcer on the shin. Thick fibrin, some crust; x.") == [
        "Deep ulcer on the shin", "Thick fibrin", "some crust"]
    assert "fibrin / slough" in tagger.concept_aspect("thick fibrin")
    assert disease_aspect({"rdeb_subtype": "RDEB-sev", "x": 1}, ["rdeb_subtype", "missing"]) == "rdeb subtype: RDEB-sev"


class _FakeModel:
    """Prompts containing 'POS' embed (globally and on their concept span) to e0, others to e1."""

    def encode_spans(self, texts: list[str], spans: list) -> tuple[torch.Tensor, torch.Tensor]:
        assert all(sp is not None for sp in spans)  # every prompt names the concept 'x'
        e = torch.stack([torch.tensor([1.0, 0.0, 0.0]) if "POS" in t else torch.tensor([0.0, 1.0, 0.0]) for t in texts])
        return e, e

    def zero_shot_scales(self, sigmoid: bool) -> tuple[float, float, float, float]:
        return (10.0, -3.0, 10.0, -7.0) if sigmoid else (10.0, 0.0, 10.0, -7.0)


def test_zero_shot_eqs_10_to_12_hand_computed() -> None:
    """Two classes; class 1 has two concepts. Patches v1 = (1, 0), v2 = (0, 1), v3 = (.6, .8),
    image = (1, 0), k = 2, (t_g, b_g, t_l, b_l) = (10, −5, 4, −1), β = 0.5."""
    from core.concepts.scores import zero_shot

    patches = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]])
    image = torch.tensor([[1.0, 0.0]])
    text = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    concepts = torch.tensor([[[0.0, 1.0], [9.0, 9.0]], [[1.0, 0.0], [0.6, 0.8]]])  # [0, 1] is padding
    mask = torch.tensor([[True, False], [True, True]])
    p = zero_shot(image, patches, text, concepts, mask, (10.0, -5.0, 4.0, -1.0), k=2, beta=0.5)
    s_g = [10 * 1 - 5, 10 * 0 - 5]  # eq. 10
    # class 0: top-2 for (0, 1) are v2, v3 → i_loc ∝ (.6, 1.8), t_loc = (0, 1): cos = 1.8 / √3.6
    # class 1: top-2 for (1, 0) are v1, v3; for (.6, .8) v3, v2 → i_loc ∝ v1 + 2 v3 + v2 = (2.2, 2.6),
    #          t_loc ∝ (1.6, 0.8): cos = 5.6 / √(11.6 · 3.2)
    s_l = [4 * 1.8 / math.sqrt(3.6) - 1, 4 * 5.6 / math.sqrt(11.6 * 3.2) - 1]  # eq. 11
    soft = lambda s: [math.exp(v) / sum(math.exp(u) for u in s) for v in s]  # noqa: E731
    assert p["global"][0].tolist() == pytest.approx(soft(s_g), abs=1e-6)
    assert p["local"][0].tolist() == pytest.approx(soft(s_l), abs=1e-6)
    assert p["fused"][0].tolist() == pytest.approx([0.5 * (a + b) for a, b in zip(soft(s_l), soft(s_g))], abs=1e-6)
    with pytest.raises(ValueError, match="at least one concept"):
        zero_shot(image, patches, text, concepts, torch.tensor([[False, False], [True, True]]), (1, 0, 1, 0), k=1)


def test_scorer_global_local_and_heatmap() -> None:
    from core.concepts.vocabulary import Concept

    c = Concept("x", "x", "wound", ("x",), ("POS x a", "POS b x"), ("neg x",))
    scorer = ConceptScorer(_FakeModel(), [c], beta=0.5, k_frac=0.25)
    patches = F.normalize(torch.tensor([[[0.0, 1.0, 0.2]] * 3 + [[1.0, 0.0, 0.0]]]), dim=-1)  # planted patch 3
    image = F.normalize(torch.tensor([[0.0, 1.0, 0.0]]), dim=-1)
    s = scorer.scores(image, patches)
    assert s["global"][0, 0] == pytest.approx(1 / (1 + np.exp(10.0)), rel=1e-4)  # looks absent globally
    # local, k = 1: "present" takes the planted patch (cos 1), "absent" a (0, 1, .2) patch (cos 1/√1.04)
    assert s["local"][0, 0] == pytest.approx(1 / (1 + np.exp(10 / np.sqrt(1.04) - 10.0)), rel=1e-4)
    assert s["fused"][0, 0] == pytest.approx(0.5 * (s["global"][0, 0] + s["local"][0, 0]))
    heat = scorer.heatmaps(patches, (2, 2))
    assert heat.shape == (1, 1, 2, 2) and np.unravel_index(heat[0, 0].argmax(), (2, 2)) == (1, 1)


def test_concept_span_finds_the_term() -> None:
    from core.concepts.scores import concept_span

    c = load_vocab()[[x.name for x in load_vocab()].index("fibrin")]
    prompt = "a wound with fibrinous slough"
    a, b = concept_span(c, prompt)
    assert prompt[a:b] == "fibrinous" and concept_span(c, "intact skin") is None


def test_bottleneck_top_concepts() -> None:
    rng = np.random.default_rng(0)
    S = rng.normal(size=(120, 4))
    y = np.where(S[:, 2] > 0, "b", "a")
    cbm = ConceptBottleneck(["c0", "c1", "c2", "c3"]).fit(S, y)
    assert cbm.top_concepts(1)["b"][0][0] == "c2" and cbm.score(S, y) > 0.9
    with pytest.raises(ValueError, match="n×4"):
        cbm.predict(S[:, :3])


@pytest.mark.parametrize("flags, message", [(["--groups", "derm7pt"], "none of its concepts has labels"),
                                            (["--groups", "bogus"], "--groups 'bogus': unknown concept group")])
def test_train_concepts_groups_without_results_is_a_clean_error(demo_workspace, capsys, flags, message) -> None:
    from core.train_concepts import main

    with pytest.raises(SystemExit) as e:
        main(["--workspace", str(demo_workspace.root), "--epochs", "1", "--crop-size", "64", *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert demo_workspace.store.runs(kind="concepts") == []


def test_split_holdout_one_patient_is_not_enough_data() -> None:
    from core.concepts.training import NotEnoughData, split_holdout

    with pytest.raises(NotEnoughData, match="cannot split 1 patient group"):
        split_holdout(["p1"] * 5, 0.3, seed=0)
    mask = split_holdout(["a", "a", "b", "c"], 0.3, seed=0)
    assert 0 < mask.sum() < 4 and mask[0] == mask[1]  # whole patients on each side


def test_train_concepts_with_too_few_described_wounds_is_one_error_and_no_run(demo_workspace, capsys) -> None:
    """The library raises NotEnoughData (never exits); the job reports it once, exit 2, no run stored."""
    from core.train_concepts import main

    store = demo_workspace.store
    for w in store.wounds()[3:]:
        store.upsert_wound(w["image_id"], w["wound_index"], w["area"], w["bbox"], "", w.get("metadata"))
    with pytest.raises(SystemExit) as e:
        main(["--workspace", str(demo_workspace.root), "--epochs", "1", "--crop-size", "64"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "need at least 4 wounds with a description, found 3" in err
    assert store.runs(kind="concepts") == []


def test_concept_metrics_auroc_on_held_out_wounds_and_bottleneck() -> None:
    """concept_metrics scores only held-out wounds: a scorer that ranks them perfectly gets AUROC 1."""
    from types import SimpleNamespace

    from core.concepts.run import ConceptData, concept_metrics

    n = 12
    labels = np.array([[i % 2, (i // 2) % 2] for i in range(n)])
    held = np.arange(n) >= 6
    scores = {k: labels[:, ::-1].astype(float) for k in ("global", "local", "fused")}  # scorer order: b, a
    scores["local"] = 1.0 - scores["local"]  # the local scores rank every wound backwards
    pairs = SimpleNamespace(metadata=[{"site": "arm" if i % 2 else "leg"} for i in range(n)])
    data = ConceptData([], None, pairs, ["a", "b"], labels, "test", held)
    out = concept_metrics(data, SimpleNamespace(names=["b", "a"]), scores, "site", seed=0)
    assert out["auroc_global"] == out["auroc_fused"] == {"a": 1.0, "b": 1.0, "mean": 1.0}
    assert out["auroc_local"] == {"a": 0.0, "b": 0.0, "mean": 0.0}
    assert out["bottleneck"]["target"] == "site" and out["bottleneck"]["heldout_accuracy"] == 1.0
    assert concept_metrics(data, SimpleNamespace(names=["b", "a"]), scores, "nothing", seed=0).keys() == {
        "auroc_global", "auroc_local", "auroc_fused"}
