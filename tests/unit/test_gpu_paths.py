"""CPU guards of the GPU code paths: every tensor a forward creates follows its inputs' device
and dtype (issue 16 §5).

A forward runs on CPU float64 inputs (parameters cast to float64) with torch's default device set
to ``meta`` and a dispatch mode that records every op output. A tensor created without an
explicit ``device=`` lands on ``meta`` (on CUDA it would land on the CPU and crash or silently
copy); one created with a hard-coded dtype comes out float32 instead of float64 (on CUDA, fp32 in
a bf16 path). Both are reported with the op that made them.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from core.concepts.scores import zero_shot
from core.losses.conceptclip import ConceptCLIPLoss, SigLIPLoss
from core.losses.make import MAKELoss
from core.losses.unimodal import CLIPUnimodalLoss

DT = torch.float64


class _Sentinel(TorchDispatchMode):
    """Records op outputs that are off ``device`` or floating but not ``dtype``."""

    def __init__(self, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.device, self.dtype, self.bad = torch.device(device), dtype, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and (t.device != self.device
                                                or (t.is_floating_point() and t.dtype != self.dtype)):
                self.bad.append(f"{func}: {t.device} {t.dtype} {tuple(t.shape)}")
        return out


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Run the block under the sentinel (see the module docstring); fail naming the bad ops."""
    with torch.device("meta"), _Sentinel("cpu", DT) as sentinel:
        yield
    assert not sentinel.bad, "tensors off the inputs' device/dtype:\n" + "\n".join(sentinel.bad[:20])


def _unit(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=DT), dim=-1)


def test_sentinel_catches_hard_coded_device_and_dtype() -> None:
    x = _unit(3, 4)
    with pytest.raises(AssertionError, match="meta"), guarded():
        _ = x.sum() + torch.zeros(())  # no device=: lands on meta
    with pytest.raises(AssertionError, match="float32"), guarded():
        _ = x + torch.ones(3, 4, device=x.device)  # default dtype: float32


def test_losses_follow_input_device_and_dtype() -> None:
    n, p, d, k = 4, 5, 8, 3
    img, raw, patches = _unit(n, d, seed=1), _unit(n, d, seed=2), _unit(n, p, d, seed=3)
    aspects, subs = _unit(n, 2, d, seed=4), _unit(n, k, d, seed=5)
    sub_mask = torch.ones(n, k, dtype=torch.bool)
    sub_mask[0, 1:] = False
    conc, cmask = _unit(n, 2, d, seed=6), torch.tensor([[True, True], [True, False], [False, False], [True, True]])
    t, b = torch.tensor(10.0, dtype=DT), torch.tensor(-5.0, dtype=DT)
    uni, v1, v2 = CLIPUnimodalLoss(in_dim=d, lam=0.5).to(DT), _unit(n, d, seed=7), _unit(n, d, seed=8)
    with guarded():  # inputs are made outside: inside, a factory call without device= lands on meta
        losses = [MAKELoss()(img, patches, raw, aspects, subs, sub_mask, t),
                  ConceptCLIPLoss()(img, raw, patches, conc, cmask, (t, t), (b, b)),
                  SigLIPLoss()(img, raw, t, b), uni(img, raw, t, v1, v2)]
    assert all(v.dtype == DT and torch.isfinite(v) for v in losses)


def test_zero_shot_follows_input_device_and_dtype() -> None:
    args = (_unit(2, 4), _unit(2, 6, 4, seed=1), _unit(3, 4, seed=2), _unit(3, 2, 4, seed=3),
            torch.tensor([[True, False], [True, True], [True, True]]))
    with guarded():
        p = zero_shot(*args, (10.0, -5.0, 10.0, -5.0), k=2)
    assert p["fused"].dtype == DT and torch.allclose(p["fused"].sum(-1), torch.ones(2, dtype=DT))


@pytest.fixture(scope="module")
def clip_model():
    """A tiny random open_clip dual encoder (ViT + causal text tower, open_clip's own heads), float64."""
    import open_clip

    from core.concepts.dual_encoder import open_clip_encoder
    from core.vision.backbones import _open_clip_backbone

    torch.manual_seed(0)
    clip = open_clip.model.CLIP(
        embed_dim=16, vision_cfg=open_clip.model.CLIPVisionCfg(layers=2, width=64, head_width=32, patch_size=16,
                                                               image_size=64),
        text_cfg=open_clip.model.CLIPTextCfg(layers=2, width=32, heads=2, context_length=77, vocab_size=49408))
    backbone = _open_clip_backbone(clip, "tiny", "open_clip:tiny", torch.device("cpu"))
    return open_clip_encoder(backbone, open_clip.get_tokenizer("ViT-B-16"), name="tiny").to(DT).eval()


def test_dual_encoder_follows_input_device_and_dtype(clip_model) -> None:
    tok = clip_model.text.tokenize(["deep ulcer with fibrin", "crust"])
    x = torch.randn(2, 3, 64, 64, dtype=DT)
    with torch.no_grad():
        hidden = clip_model.text_levels(tok, tok.attention_mask, 0, 1).float()  # a cached level, kept in fp32
    with torch.no_grad(), guarded():
        g, patches, grid = clip_model.encode_image_from(x, 0)
        t0, tokens = clip_model.encode_text_from(tok, tok.attention_mask, 0)
        t1, _ = clip_model.encode_text_from(hidden, tok.attention_mask, 1)
    assert g.dtype == patches.dtype == tokens.dtype == DT and grid == (4, 4)
    assert torch.allclose(t0, t1, atol=1e-6)  # the cached states were moved to the model's dtype


@pytest.mark.parametrize("objective, unimodal", [("clip", None), ("clip", "augment"), ("clip", "mask"),
                                                 ("make", None), ("siglip", None)])
def test_trainer_loss_follows_input_device_and_dtype(clip_model, objective: str, unimodal: str | None) -> None:
    from core.concepts.training import TrainConfig, Trainer, WoundPairs, build_text_inputs
    from core.concepts.vocabulary import ConceptTagger, load_vocab

    desc = ["Deep ulcer, thick yellow fibrin, no crust.", "Superficial erosion with small dark crusts.",
            "Granulating wound bed, mild erythema.", "Hyperkeratotic border, some fibrin."]
    n = len(desc)
    pairs = WoundPairs(keys=[(f"p{i}", 1) for i in range(n)], image_ids=[f"p{i}" for i in range(n)],
                       patient_ids=[f"pt{i}" for i in range(n)], descriptions=desc, metadata=[{} for _ in range(n)],
                       crops=np.random.default_rng(0).integers(0, 255, (n, 64, 64, 3), dtype=np.uint8),
                       boxes=np.zeros((n, 4), int))
    cfg = TrainConfig(objective=objective, unimodal=unimodal, epochs=1, batch=4, text_unlock=1,
                      image_unlock=-1 if unimodal else 0)
    trainer = Trainer(clip_model, pairs, build_text_inputs(pairs, ConceptTagger(load_vocab())), cfg)
    trainer.uni.to(DT)
    idx = torch.arange(n)
    with guarded():
        loss = trainer.loss(idx)
    assert loss.dtype == DT and torch.isfinite(loss)
    clip_model.set_trainable(0, 0)


def test_slimp_forward_and_loss_follow_input_device_and_dtype() -> None:
    from core.nested.model import SLIMP, make_inputs
    from core.nested.tabular import TabularSchema
    from core.nested.training import batch_loss

    wounds = [{"site": s, "size": v} for s, v in (("arm", 1.0), ("leg", None), ("arm", 2.5), ("back", 0.5))]
    patients = [{"age": 12, "sex": "F"}, {"age": None, "sex": "M"}]
    ws, ps = TabularSchema.infer(wounds), TabularSchema.infer(patients)
    torch.manual_seed(0)
    model = SLIMP(8, ws, ps, dim=4).to(DT)
    wound_tab, patient_tab = ws.encode(wounds), ps.encode(patients)
    wound_tab.numeric, patient_tab.numeric = wound_tab.numeric.to(DT), patient_tab.numeric.to(DT)
    images = torch.randn(4, 8, dtype=DT)
    inputs = make_inputs([(0, np.array([0, 1])), (1, np.array([2, 3]))], images, None, wound_tab, patient_tab,
                         torch.device("cpu"))
    with guarded():
        loss, _ = batch_loss(model, model(inputs), inputs, 2, None, 1)
    assert loss.dtype == DT and torch.isfinite(loss)


@pytest.fixture
def gpu(monkeypatch):
    """A mocked CUDA device (``torch.cuda.is_available()``); the test sets ``is_bf16_supported``. The process's
    precision choice and ``$TRIDERM_CUDA_PRECISION`` are cleared, and come back afterwards."""
    from core import runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runtime, "_chosen_precision", None)
    monkeypatch.delenv(runtime.PRECISION_ENV, raising=False)
    return lambda bf16: monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


def test_autocast_is_bf16_on_cuda_and_a_no_op_on_the_cpu(gpu) -> None:
    """The one place that picks the mixed-precision dtype (core.runtime.autocast), checked on CPU."""
    from core.runtime import autocast, grad_scaler

    gpu(True)
    ctx = autocast("cuda:0")
    assert isinstance(ctx, torch.autocast) and ctx.device == "cuda" and ctx.fast_dtype == torch.bfloat16
    assert not grad_scaler("cuda:0").is_enabled()  # bf16 needs no loss scaling
    assert isinstance(autocast(torch.device("cpu")), contextlib.nullcontext)
    a = torch.randn(4, 4)
    with autocast("cpu"):
        assert (a @ a).dtype == torch.float32  # fp32 on the CPU: exact and faster there


def test_gpus_without_bf16_get_fp16_with_a_loss_scaler(gpu) -> None:
    from core.runtime import autocast, grad_scaler, use_precision

    gpu(False)
    ctx = autocast("cuda:0")
    assert isinstance(ctx, torch.autocast) and ctx.fast_dtype == torch.float16
    assert grad_scaler("cuda:0").is_enabled()
    with pytest.raises(ValueError, match="bf16: this GPU does not support bfloat16"):
        use_precision("bf16", "cuda:0")
    assert use_precision("fp32", "cuda:0") == "fp32" and not grad_scaler("cuda:0").is_enabled()
    assert isinstance(autocast("cuda:0"), contextlib.nullcontext)
    assert use_precision("auto", "cuda:0") == "fp16"


def test_cpu_precision_is_fp32_whatever_is_asked(gpu) -> None:
    """``--precision`` on the CPU is a no-op: no autocast, and a pass-through scaler (the loops' three lines
    are then exactly ``loss.backward(); opt.step()``)."""
    from core.runtime import autocast, grad_scaler, use_precision

    gpu(False)
    for spec in ("auto", "fp16", "bf16", "fp32"):
        assert use_precision(spec, "cpu") == "fp32" and isinstance(autocast("cpu"), contextlib.nullcontext)
    scaler, w = grad_scaler("cpu"), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.5)
    loss = (w * w).sum()
    assert scaler.scale(loss) is loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(w.detach(), torch.zeros(2))  # 1 − 0.5·2


def test_precision_option_sits_beside_device_and_is_resolved(gpu, monkeypatch) -> None:
    import argparse

    from core import cli, runtime

    monkeypatch.setattr(runtime, "_chosen_device", None)
    gpu(True)
    parser = argparse.ArgumentParser()
    cli.add_device(parser)
    args = cli.parse_args(parser, ["--device", "cuda", "--precision", "fp16"])
    assert (args.device, args.precision) == ("cuda", "fp16") and runtime.amp_dtype("cuda") == torch.float16
    assert cli.parse_args(parser, ["--device", "cuda"]).precision == "bf16"
    assert cli.parse_args(parser, ["--device", "cpu", "--precision", "bf16"]).precision == "fp32"
    with pytest.raises(SystemExit):
        cli.parse_args(parser, ["--precision", "fp64"])
    gpu(False)
    with pytest.raises(SystemExit):
        cli.parse_args(parser, ["--device", "cuda", "--precision", "bf16"])


def test_cuda_precision_env_gives_fp32_or_one_clear_error(gpu, monkeypatch) -> None:
    """``TRIDERM_CUDA_PRECISION`` still chooses when ``--precision`` is auto (benchmarks.gpu's fp32 rows); a typo
    is refused; an explicit ``--precision`` wins over it."""
    from core.runtime import PRECISION_ENV, autocast, use_precision

    gpu(True)
    monkeypatch.setenv(PRECISION_ENV, "fp32")
    assert isinstance(autocast("cuda:0"), contextlib.nullcontext)
    assert use_precision("bf16", "cuda:0") == "bf16"
    use_precision("auto")
    monkeypatch.setenv(PRECISION_ENV, "fp16")
    assert autocast("cuda:0").fast_dtype == torch.float16
    monkeypatch.setenv(PRECISION_ENV, "fp8")
    with pytest.raises(ValueError, match="TRIDERM_CUDA_PRECISION='fp8': choose from auto, fp32, bf16, fp16"):
        autocast("cuda:0")


def test_torchrun_of_one_process_initialises_the_process_group(monkeypatch) -> None:
    """Under ``torchrun --nproc_per_node 1`` the group is initialised too (gloo on the CPU, nccl on CUDA), so
    one process exercises the collectives a multi-GPU run uses; without torchrun nothing is initialised."""
    import socket

    import torch.distributed as dist

    from core.runtime import init_distributed, use_device

    use_device("cpu")
    try:
        assert init_distributed() == (0, 1, torch.device("cpu")) and not dist.is_initialized()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for k, v in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(port)}.items():
            monkeypatch.setenv(k, v)
        assert init_distributed() == (0, 1, torch.device("cpu"))
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        use_device(None)



@pytest.mark.parametrize("pooling", ["attention", "mean"])
def test_wound_head_follows_input_device_and_dtype(pooling: str) -> None:
    from core.vision.pooling import WoundHead

    head = WoundHead(6, dim=5, pooling=pooling).to(DT)
    tokens, segment = _unit(7, 6), torch.tensor([0, 0, 1, 1, 1, 2, 2])
    with guarded():
        z, w = head(tokens, segment, 3)
    assert z.shape == (3, 5) and w.shape == (7,)
