"""Tabular schema inference/encoding and the per-field-token transformer encoder."""
from __future__ import annotations

import math

import pytest
import torch

from core.nested.tabular import TabularEncoder, TabularSchema

RECORDS = [
    {"age": 70, "sex": "F", "site": "heel", "id_like": "a1"},
    {"age": None, "sex": "M", "site": "shin", "id_like": "a2"},
    {"age": "55", "sex": "", "site": "heel", "id_like": "a3"},
    {"age": float("nan"), "empty": None, "id_like": "a4"},
]


def test_infer_types_and_skip_rules():
    schema = TabularSchema.infer(RECORDS, exclude=["site"], max_categories=3)
    kinds = {f.name: f.kind for f in schema.fields}
    # "55" parses as a number; "empty" is always missing; "id_like" has too many categories; "site" excluded
    assert kinds == {"age": "numeric", "sex": "categorical"}
    age = schema.fields[0]
    assert age.mean == pytest.approx(62.5) and age.std == pytest.approx(7.5)
    assert schema.fields[1].categories == ["F", "M"]


def test_encode_marks_missing_and_unseen_values():
    schema = TabularSchema.infer(RECORDS)
    batch = schema.encode([{"age": 62.5, "sex": "X", "site": "heel"}, {}])
    j_age = [f.name for f in schema.numeric].index("age")
    assert batch.numeric[0, j_age] == 0.0 and not batch.numeric_missing[0, j_age]
    cats = [f.name for f in schema.categorical]
    assert batch.categorical_missing[0, cats.index("sex")]  # unseen category → missing
    assert not batch.categorical_missing[0, cats.index("site")]
    assert batch.numeric_missing[1].all() and batch.categorical_missing[1].all()


def test_schema_json_roundtrip(tmp_path):
    schema = TabularSchema.infer(RECORDS)
    loaded = TabularSchema.load(schema.save(tmp_path / "schema.json"))
    assert loaded.to_dict() == schema.to_dict()
    assert torch.equal(loaded.encode(RECORDS).numeric, schema.encode(RECORDS).numeric)


def test_missing_values_never_give_nan_and_use_the_missing_embedding():
    torch.manual_seed(0)
    schema = TabularSchema.infer(RECORDS)
    enc = TabularEncoder(schema, out_dim=8)
    rows = [{}, {"age": float("nan"), "sex": None}, {"age": "n/a"}, RECORDS[0]]
    out = enc(schema.encode(rows))
    assert out.shape == (4, 8) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in enc.parameters() if p.grad is not None)
    assert enc.missing.grad.abs().sum() > 0
    # changing the missing embeddings changes the all-missing row but not a fully observed one
    full = {"age": 70, "sex": "F", "site": "heel", "id_like": "a1"}
    before = enc(schema.encode([{}, full])).detach()
    with torch.no_grad():
        enc.missing.add_(1.0)
    after = enc(schema.encode([{}, full])).detach()
    assert not torch.allclose(before[0], after[0])
    assert torch.allclose(before[1], after[1])


def test_input_embedding_parameters_and_empty_schema():
    schema = TabularSchema.infer(RECORDS)
    enc = TabularEncoder(schema)
    names = {n for n, p in enc.named_parameters() if any(p is q for q in enc.input_embedding_parameters())}
    assert names == {"num_weight", "num_bias", "cat_table.weight", "missing", "field_embedding"}
    assert not any(n.startswith(("transformer", "head", "norm")) for n in names)
    with pytest.raises(ValueError, match="no usable field"):
        TabularEncoder(TabularSchema.infer([{"x": None}]))


def test_constant_numeric_column_is_not_divided_by_zero():
    schema = TabularSchema.infer([{"v": 3}, {"v": 3}])
    assert schema.fields[0].std == 1.0
    assert not math.isnan(float(schema.encode([{"v": 3}]).numeric[0, 0]))
