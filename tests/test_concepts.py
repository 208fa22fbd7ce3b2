"""Concept vocabulary, tagger (with negation), sub-captions, concept scores and bottleneck."""
from __future__ import annotations

import json

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
    """Text embeddings: prompts containing 'POS' map to e0, others to e1."""

    logit_scale = torch.tensor(np.log(10.0))

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        return torch.stack([torch.tensor([1.0, 0.0, 0.0]) if "POS" in t else torch.tensor([0.0, 1.0, 0.0]) for t in texts])


def test_scorer_global_local_and_heatmap() -> None:
    from core.concepts.vocabulary import Concept

    c = Concept("x", "x", "wound", ("x",), ("POS a", "POS b"), ("neg",))
    scorer = ConceptScorer(_FakeModel(), [c], beta=0.5, k_frac=0.25)
    patches = F.normalize(torch.tensor([[[0.0, 1.0, 0.2]] * 3 + [[1.0, 0.0, 0.0]]]), dim=-1)  # planted patch 3
    image = F.normalize(torch.tensor([[0.0, 1.0, 0.0]]), dim=-1)
    s = scorer.scores(image, patches)
    assert s["global"][0, 0] == pytest.approx(1 / (1 + np.exp(10.0)), rel=1e-4)  # looks negative globally
    assert s["local"][0, 0] == pytest.approx(1 / (1 + np.exp(-10.0)), rel=1e-4)  # top-1 patch is the planted one
    assert s["fused"][0, 0] == pytest.approx(0.5 * (s["global"][0, 0] + s["local"][0, 0]))
    heat = scorer.heatmaps(patches, (2, 2))
    assert heat.shape == (1, 1, 2, 2) and np.unravel_index(heat[0, 0].argmax(), (2, 2)) == (1, 1)


def test_bottleneck_top_concepts() -> None:
    rng = np.random.default_rng(0)
    S = rng.normal(size=(120, 4))
    y = np.where(S[:, 2] > 0, "b", "a")
    cbm = ConceptBottleneck(["c0", "c1", "c2", "c3"]).fit(S, y)
    assert cbm.top_concepts(1)["b"][0][0] == "c2" and cbm.score(S, y) > 0.9
    with pytest.raises(ValueError, match="n×4"):
        cbm.predict(S[:, :3])
