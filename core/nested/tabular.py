"""Tabular metadata encoder: a small transformer over per-field tokens (SLIMP, METHODS.md §2).

SLIMP (papers/slimp_*.txt §3.1, §4.2) encodes lesion- and patient-level metadata with a
transformer tabular encoder (TRACE) whose embedding is the *average of the output field
tokens* (not a CLS token). Each field becomes one token:

- numeric field: standardised value v → v · a_f + b_f (a per-field linear embedding);
- categorical field: a per-field embedding table;
- absent value (None, NaN, "", or a category unseen when the schema was inferred):
  a learned per-field "missing" embedding, so missing values never produce NaN.

A learned field-identity embedding is added to every token so that fields stay
distinguishable after attention. The field schema (names, kinds, standardisation,
categories) is inferred from metadata dicts and saved as JSON next to the model.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn

from annotations.infra.fileio import read_json, write_json

MISSING_STRINGS = frozenset({"", "na", "n/a", "nan", "none", "null", "unknown", "?"})


def is_missing(value: Any) -> bool:
    """True for None, NaN and empty / "NA"-like strings."""
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and value.strip().lower() in MISSING_STRINGS


def as_number(value: Any) -> float | None:
    """The value as a finite float, or None when it is not numeric (bools are not numeric)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


@dataclass
class FieldSpec:
    """One metadata column: ``kind`` is "numeric" (mean/std) or "categorical" (categories)."""

    name: str
    kind: str
    mean: float = 0.0
    std: float = 1.0
    categories: list[str] = field(default_factory=list)


@dataclass
class TabularBatch:
    """Encoded records: numeric values (standardised, 0 where missing), category indices
    (0 where missing) and the missing masks, one column per field of each kind."""

    numeric: Tensor  # n × F_num float
    numeric_missing: Tensor  # n × F_num bool
    categorical: Tensor  # n × F_cat long
    categorical_missing: Tensor  # n × F_cat bool

    def __len__(self) -> int:
        return self.numeric.shape[0]

    def to(self, device: torch.device | str) -> TabularBatch:
        """The same batch with every tensor on ``device``."""
        return TabularBatch(*(t.to(device) for t in (self.numeric, self.numeric_missing, self.categorical, self.categorical_missing)))

    def index(self, idx: Tensor | Sequence[int]) -> TabularBatch:
        """Rows ``idx`` of every tensor."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        return TabularBatch(self.numeric[idx], self.numeric_missing[idx], self.categorical[idx], self.categorical_missing[idx])


class TabularSchema:
    """Field schema inferred from metadata records; encodes records into a :class:`TabularBatch`.

    A column is numeric when every present value parses as a finite number, else
    categorical. Columns that are always missing, or categorical columns that look like
    identifiers / free text (more than ``max_categories`` distinct values, or a distinct
    value for more than half the rows when there are over 10 rows), are left out.
    """

    def __init__(self, fields: Sequence[FieldSpec]) -> None:
        self.fields = list(fields)
        self.numeric = [f for f in self.fields if f.kind == "numeric"]
        self.categorical = [f for f in self.fields if f.kind == "categorical"]
        bad = [f.name for f in self.fields if f.kind not in ("numeric", "categorical")]
        if bad:
            raise ValueError(f"unknown field kind for {bad}")

    @classmethod
    def infer(cls, records: Iterable[Mapping[str, Any]], exclude: Iterable[str] = (), max_categories: int = 50) -> TabularSchema:
        """Infer the schema of ``records`` (metadata dicts), skipping the ``exclude`` columns."""
        records = list(records)
        excluded = set(exclude)
        names: list[str] = []
        for rec in records:
            names.extend(k for k in rec if k not in excluded and k not in names)
        fields = []
        for name in sorted(names):
            present = [rec[name] for rec in records if name in rec and not is_missing(rec[name])]
            if not present:
                continue
            numbers = [as_number(v) for v in present]
            if all(n is not None for n in numbers):
                t = torch.tensor(numbers, dtype=torch.float64)
                std = float(t.std(unbiased=False)) if len(numbers) > 1 else 0.0
                fields.append(FieldSpec(name, "numeric", mean=float(t.mean()), std=std if std > 1e-12 else 1.0))
                continue
            categories = sorted({str(v).strip() for v in present})
            if len(categories) > max_categories or (len(records) > 10 and len(categories) > 0.5 * len(records)):
                continue
            fields.append(FieldSpec(name, "categorical", categories=categories))
        return cls(fields)

    def __len__(self) -> int:
        return len(self.fields)

    @property
    def names(self) -> list[str]:
        """The field names in schema order."""
        return [f.name for f in self.fields]

    def encode(self, records: Sequence[Mapping[str, Any]]) -> TabularBatch:
        """Encode metadata dicts; absent, non-numeric or unseen values are marked missing."""
        n = len(records)
        num = torch.zeros(n, len(self.numeric))
        num_missing = torch.ones(n, len(self.numeric), dtype=torch.bool)
        cat = torch.zeros(n, len(self.categorical), dtype=torch.long)
        cat_missing = torch.ones(n, len(self.categorical), dtype=torch.bool)
        lookups = [{c: i for i, c in enumerate(f.categories)} for f in self.categorical]
        for r, rec in enumerate(records):
            for j, f in enumerate(self.numeric):
                value = rec.get(f.name)
                number = None if is_missing(value) else as_number(value)
                if number is not None:
                    num[r, j] = (number - f.mean) / f.std
                    num_missing[r, j] = False
            for j, (f, lookup) in enumerate(zip(self.categorical, lookups)):
                value = rec.get(f.name)
                if not is_missing(value) and str(value).strip() in lookup:
                    cat[r, j] = lookup[str(value).strip()]
                    cat_missing[r, j] = False
        return TabularBatch(num, num_missing, cat, cat_missing)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields (:meth:`from_dict` reads it back)."""
        return {"fields": [asdict(f) for f in self.fields]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TabularSchema:
        """The schema written by :meth:`to_dict`."""
        return cls([FieldSpec(**f) for f in data["fields"]])

    def save(self, path: str | Path) -> Path:
        """Write the schema as JSON to ``path``; returns the path."""
        path = Path(path)
        write_json(path, self.to_dict())
        return path

    @classmethod
    def load(cls, path: str | Path) -> TabularSchema:
        """Read a schema written by :meth:`save`."""
        return cls.from_dict(read_json(path))


class TabularEncoder(nn.Module):
    """Transformer over per-field tokens; output = mean of the output field tokens → Linear.

    Input-embedding parameters (:meth:`input_embedding_parameters`) are the per-field
    numeric weights/biases, the categorical tables and the per-field missing embeddings —
    the only tabular parameters SLIMP's continual pre-training adapts (appendix D).
    """

    #: each categorical field's first row in :attr:`cat_table` (a buffer)
    cat_offsets: Tensor

    def __init__(self, schema: TabularSchema, out_dim: int = 128, d_model: int = 64, n_layers: int = 2, n_heads: int = 4) -> None:
        super().__init__()
        if len(schema) == 0:
            raise ValueError("the tabular schema has no usable field (every metadata column is missing or free text)")
        self.schema = schema
        n_num, n_cat = len(schema.numeric), len(schema.categorical)
        self.num_weight = nn.Parameter(torch.randn(n_num, d_model) * 0.02)
        self.num_bias = nn.Parameter(torch.zeros(n_num, d_model))
        sizes = [len(f.categories) for f in schema.categorical]
        self.register_buffer("cat_offsets", torch.tensor([0, *sizes[:-1]], dtype=torch.long).cumsum(0) if sizes else torch.zeros(0, dtype=torch.long))
        self.cat_table = nn.Embedding(max(sum(sizes), 1), d_model)
        nn.init.normal_(self.cat_table.weight, std=0.02)
        self.missing = nn.Parameter(torch.randn(n_num + n_cat, d_model) * 0.02)
        self.field_embedding = nn.Parameter(torch.randn(n_num + n_cat, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward=2 * d_model, dropout=0.0, batch_first=True, norm_first=True)
        self.transformer = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, out_dim)

    def input_embedding_parameters(self) -> list[nn.Parameter]:
        """Per-field numeric embeddings, categorical tables, missing and field-identity embeddings."""
        # nn.Embedding.weight is a Parameter; torch's stubs type it as a plain Tensor
        return [self.num_weight, self.num_bias, cast(nn.Parameter, self.cat_table.weight), self.missing,
                self.field_embedding]

    def tokens(self, batch: TabularBatch) -> Tensor:
        """Input field tokens, n × F × d_model (numeric fields first, then categorical)."""
        n_num = self.num_weight.shape[0]
        num = batch.numeric.unsqueeze(-1) * self.num_weight + self.num_bias
        num = torch.where(batch.numeric_missing.unsqueeze(-1), self.missing[:n_num], num)
        cat = self.cat_table(batch.categorical + self.cat_offsets)
        cat = torch.where(batch.categorical_missing.unsqueeze(-1), self.missing[n_num:], cat)
        return torch.cat([num, cat], dim=1) + self.field_embedding

    def forward(self, batch: TabularBatch) -> Tensor:
        """Embeddings n × out_dim."""
        out = self.transformer(self.tokens(batch))
        return self.head(self.norm(out.mean(dim=1)))
