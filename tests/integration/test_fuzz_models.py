"""Fuzzing the model loaders (issue 49): mutated ``config.json`` values, mutated segmenter metadata and random or
cut safetensors bytes either load or raise one clear error (:class:`~core.vision.model_files.ModelFileError`, or
:class:`~core.segmentation.model.SegmenterError`) — never another exception, never a huge allocation (the sizes
are bounded before a module is built; the shipped shapes are small).

``make test`` runs a modest number of examples; for a long run set ``TRIDERM_FUZZ_EXAMPLES``, e.g.
``TRIDERM_FUZZ_EXAMPLES=2000 python -m pytest tests/integration/test_fuzz_models.py``.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from core.runtime import write_model_folder
from core.segmentation.model import Segmenter, SegmenterError, encoder, new_net
from core.vision.inference import HEAD_FORMAT, SharedHead, shared_model
from core.vision.model_files import ModelFileError, load_weights
from core.vision.triderm_config import TriDermConfig

EXAMPLES = int(os.environ.get("TRIDERM_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: JSON values a hostile config may hold: small and huge integers, reals, text, paths, lists, objects.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 40) | st.sampled_from([0, 2 ** 31, 10 ** 13, -(10 ** 9)])
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
    | st.sampled_from(["../x.pt", "/etc/passwd", "file:../../x.pt", "open_clip:ViT-B-16:../x.pt", "a\0b",
                       "efficientnet-lite0", "timm:tf_efficientnet_lite0", "x" * 300]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)
DROP = object()
HEAD_KEYS = ["channels", "dim", "recipe", "backbone", "layer", "normalize", "metrics", "data", "model_format", "extra"]
RECIPE_KEYS = ["dim", "hidden", "supervise", "supervise_dim", "supervise_heads", "pooling", "views", "epochs"]


@pytest.fixture(scope="module")
def head_folder(tmp_path_factory) -> Path:
    cfg = TriDermConfig(dim=4, hidden=4)
    recipe = {k: v for k, v in asdict(cfg).items() if k != "backbone"}
    model = SharedHead(8, 4, recipe, "efficientnet-lite0", None, "center-l2", {}, {}, model_format=HEAD_FORMAT)
    return write_model_folder(model, tmp_path_factory.mktemp("fuzz") / "head", "# a test head\n")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    enc = encoder("cpu")
    return Segmenter(new_net(enc), enc, input_size=64).save(tmp_path_factory.mktemp("fuzz") / "seg.safetensors")


def _mutate(config: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(config)
    for key, value in changes.items():
        if value is DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


@FUZZ
@given(top=st.dictionaries(st.sampled_from(HEAD_KEYS), JSON_VALUES | st.just(DROP), max_size=3),
       recipe=st.dictionaries(st.sampled_from(RECIPE_KEYS), JSON_VALUES | st.just(DROP), max_size=3))
def test_a_mutated_head_config_loads_or_is_one_model_file_error(head_folder, top, recipe):
    config = json.loads((head_folder / "config.json").read_text())
    config["recipe"] = _mutate(config["recipe"], recipe)
    config = _mutate(config, top)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        shutil.copytree(head_folder, folder)
        (folder / "config.json").write_text(json.dumps(config))
        try:
            model = shared_model(SharedHead, folder)
        except ModelFileError as e:
            assert "config.json" in str(e) or "model.safetensors" in str(e) or "model folder" in str(e)
        else:
            assert sum(p.numel() for p in model.parameters()) < 1_000_000


@FUZZ
@given(data=st.data())
def test_random_or_cut_safetensors_bytes_load_or_are_one_model_file_error(head_folder, data):
    good = (head_folder / "model.safetensors").read_bytes()
    kind = data.draw(st.sampled_from(["cut", "random", "flipped", "header"]))
    if kind == "cut":
        blob = good[: data.draw(st.integers(0, len(good) - 1))]
    elif kind == "random":
        blob = data.draw(st.binary(max_size=256))
    elif kind == "flipped":  # one byte of the header or the data changed
        at = data.draw(st.integers(0, len(good) - 1))
        blob = good[:at] + bytes([data.draw(st.integers(0, 255))]) + good[at + 1:]
    else:  # a header of hostile tensor entries over a few data bytes
        header = json.dumps({data.draw(st.sampled_from(["head.pool.score.0.weight", "center", "x"])): {
            "dtype": data.draw(st.sampled_from(["F32", "F16", "I64", "U8", "BOOL", "XX"])),
            "shape": data.draw(st.lists(st.integers(-2, 10 ** 12), max_size=3)),
            "data_offsets": data.draw(st.lists(st.integers(-2, 10 ** 12), min_size=2, max_size=2))}}).encode()
        blob = len(header).to_bytes(8, "little") + header + bytes(16)
    model = SharedHead(8, 4, {"dim": 4, "hidden": 4}, "efficientnet-lite0", None, "center-l2")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(blob)
        try:
            load_weights(model, path)
        except ModelFileError as e:
            assert str(path) in str(e)


@FUZZ
@given(meta=st.dictionaries(st.sampled_from(["format", "backbone", "width", "input_size", "channels", "tta"]),
                            st.sampled_from(["", "0", "1", "2", "4", "16", "32", "64", "4096", str(10 ** 12), "-5",
                                             "x", "[1,", "null", "3.5", "٣٢"]) | st.text(max_size=6),
                            max_size=3))
def test_mutated_segmenter_metadata_loads_or_is_one_segmenter_error(checkpoint, meta):
    with safe_open(str(checkpoint), framework="pt") as fh:
        names = fh.keys()
        tensors = {k: fh.get_tensor(k) for k in names}
        metadata = {**(fh.metadata() or {}), **meta}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seg.safetensors"
        save_file(tensors, str(path), metadata=metadata)
        try:
            seg = Segmenter.load(path, device="cpu")
        except SegmenterError as e:
            assert str(path) in str(e)
        else:
            assert seg.input_size <= 2048 and seg.net.decoder.width <= 1024


@FUZZ
@given(cut=st.integers(0, 10 ** 9))
def test_cut_segmenter_checkpoints_are_one_segmenter_error(checkpoint, cut):
    good = checkpoint.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seg.safetensors"
        path.write_bytes(good[: cut % len(good)])
        with pytest.raises(SegmenterError, match=r"seg\.safetensors"):
            Segmenter.load(path, device="cpu")


def test_the_loaders_take_their_own_files(head_folder, checkpoint):
    """The fuzzers' starting points load (so a refusal above is the mutation's)."""
    assert isinstance(shared_model(SharedHead, head_folder), SharedHead)
    assert Segmenter.load(checkpoint, device="cpu").input_size == 64
