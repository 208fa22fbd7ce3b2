"""The fine-tuned tail evaluated only where the pooled embedding reads it (issue 52; docs/profiles/FINETUNE.md).

Everything after EfficientNet-Lite0's last depthwise convolution acts per feature-grid cell, and a photo's
embedding is a weighted sum over its wound-token cells (about 12 % of the grid). So the embedding needs the
depthwise convolution, the projection and the head only at those cells, and the expansion only at the cells
the dilated 3×3 depthwise kernel reads from them (about 44 %): 5.3× fewer FLOPs than the dense tail, with the
same modules (their weights, batch norms and activations) and the same result up to floating-point summation
order. :func:`token_pooled` is the fine-tune's forward; a test holds it to the dense
``pooled(tail(x), w)`` in value and gradient.
"""
from __future__ import annotations

from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Parts(NamedTuple):
    """The modules of the tail, in forward order (the batch norms are timm's ``BatchNormAct2d``)."""

    conv_pw: nn.Conv2d
    bn1: Any
    conv_dw: nn.Conv2d
    bn2: Any
    conv_pwl: nn.Conv2d
    bn3: Any
    conv_head: nn.Conv2d
    bn_head: Any


def _conv(conv: nn.Conv2d, x: Tensor) -> Tensor:
    """A 1×1 convolution applied to N×C cells, as the matrix product it is."""
    return F.linear(x, conv.weight.flatten(1), conv.bias)


def _norm(bn: Any, x: Tensor) -> Tensor:
    """An eval-mode batch norm (timm's ``BatchNormAct2d``: with its activation) applied to N×C cells."""
    if bn.training:
        raise ValueError("the token-restricted tail keeps the batch-norm statistics: put the tail in eval mode")
    y = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
    return bn.act(bn.drop(y)) if hasattr(bn, "act") else y


def parts(tail: nn.Module) -> Parts:
    """The tail's modules (``blocks[6]``'s only block, ``conv_head``, ``bn2``); a block :func:`token_pooled`
    would not compute exactly is refused."""
    block, conv_head, bn_head = tail.get_submodule("0.0"), tail.get_submodule("1"), tail.get_submodule("2")
    _check(block)
    get = block.get_submodule
    return Parts(cast(nn.Conv2d, get("conv_pw")), get("bn1"), cast(nn.Conv2d, get("conv_dw")), get("bn2"),
                 cast(nn.Conv2d, get("conv_pwl")), get("bn3"), cast(nn.Conv2d, conv_head), bn_head)


def _check(block: nn.Module) -> None:
    """Refuse a block :func:`token_pooled` would not compute exactly (squeeze-excitation, anti-aliasing, drop
    path or a residual connection)."""
    extras = [name for name in ("se", "aa", "drop_path") if not isinstance(getattr(block, name), nn.Identity)]
    if getattr(block, "has_skip", False) or extras:
        raise ValueError(f"the token-restricted tail supports EfficientNet-Lite0's last stage only (found "
                         f"{', '.join(extras) or 'a residual connection'})")


def token_cells(w: Tensor, dw: nn.Conv2d) -> tuple[Tensor, Tensor, Tensor]:
    """Where the embedding reads the tail: the flat (photo·H·W) indices of the cells where ``w`` (B×H×W) is
    non-zero, and for each, the flat indices of the k² cells its depthwise kernel ``dw`` reads (clamped inside
    the grid) with a mask of those that are inside (the others are the kernel's zero padding)."""
    H, W = w.shape[-2:]
    k, d, pad = dw.kernel_size[0], dw.dilation[0], cast(tuple[int, int], dw.padding)[0]
    cells = w.reshape(-1).nonzero().squeeze(1)
    photo, rest = cells // (H * W), cells % (H * W)
    offsets = torch.arange(k, device=w.device) * d - pad
    rows = rest[:, None] // W + offsets.repeat_interleave(k)[None]
    cols = rest[:, None] % W + offsets.repeat(k)[None]
    inside = (rows >= 0) & (rows < H) & (cols >= 0) & (cols < W)
    return cells, photo[:, None] * (H * W) + rows.clamp(0, H - 1) * W + cols.clamp(0, W - 1), inside


class _Taps(torch.autograd.Function):
    """The depthwise convolution at the token cells, ``Σ_t padded[index[:, t]] · taps[t]``: one row gather per tap
    (no cells×k²×C temporary). Its backward adds the k² taps' input gradients into one buffer, in the order
    autograd's own accumulation of k² ``index_select`` backwards adds them (last tap first), so the gradients
    are equal to the bit (a test holds it); that saves k² − 1 zero-filled buffers and their sums over the read
    cells, and the k² gathered rows are gathered again instead of kept (docs/profiles/FINETUNE.md, round 5)."""

    @staticmethod
    def forward(ctx: Any, padded: Tensor, taps: Tensor, index: Tensor) -> Tensor:
        out = padded.index_select(0, index[:, 0]).mul_(taps[0])
        for tap in range(1, len(taps)):
            out.add_(padded.index_select(0, index[:, tap]).mul_(taps[tap]))
        ctx.save_for_backward(padded, taps, index)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        padded, taps, index = ctx.saved_tensors
        buffer = torch.empty_like(grad)
        grad_padded = grad_taps = None
        if ctx.needs_input_grad[0]:
            grad_padded = torch.zeros_like(padded)
            for tap in reversed(range(len(taps))):
                grad_padded.index_add_(0, index[:, tap], torch.mul(grad, taps[tap], out=buffer))
        if ctx.needs_input_grad[1]:
            grad_taps = torch.stack([torch.mul(grad, padded.index_select(0, index[:, tap]), out=buffer).sum(0)
                                     for tap in range(len(taps))])
        return grad_padded, grad_taps, None


def token_pooled(tail: nn.Module, x: Tensor, w: Tensor) -> Tensor:
    """B×D embeddings ``Σ_cells w · tail(x)`` of the tail (``blocks[6]``, ``conv_head``, ``bn2`` of
    EfficientNet-Lite0: :func:`core.vision.finetune.tail_of`, in eval mode) on stage-6 features ``x``
    (B×C×H×W), computed at the cells where ``w`` (B×H×W pooling weights) is non-zero and the cells their
    depthwise kernel reads."""
    p = parts(tail)
    B, C, H, W = x.shape
    cells, reads, inside = token_cells(w, p.conv_dw)
    needed, where = torch.unique(reads[inside], return_inverse=True)
    expanded = _norm(p.bn1, _conv(p.conv_pw, x.permute(0, 2, 3, 1).reshape(-1, C)[needed]))
    padded = torch.cat([expanded, expanded.new_zeros(1, expanded.shape[1])])  # the last row is the zero padding
    index = torch.full_like(reads, len(needed))
    index[inside] = where
    taps = p.conv_dw.weight.flatten(1).t()  # k²×C, in the kernel's row-major order as ``reads``
    depthwise = cast(Tensor, _Taps.apply(padded, taps, index))
    if p.conv_dw.bias is not None:
        depthwise = depthwise + p.conv_dw.bias
    h = _norm(p.bn3, _conv(p.conv_pwl, _norm(p.bn2, depthwise)))
    h = _norm(p.bn_head, _conv(p.conv_head, h))
    return h.new_zeros(B, h.shape[1]).index_add_(0, cells // (H * W), h * w.reshape(-1)[cells, None])


def step_flops(tail: nn.Module, w: Tensor) -> int:
    """Floating-point operations of one training step of :func:`token_pooled` on the pooling weights ``w``
    (B×H×W): each convolution's forward (2 × weights per cell it computes), weight gradient and input gradient
    (none for the first: its input is the frozen features), plus the pooling. Counted by hand because
    :class:`torch.utils.flop_counter.FlopCounterMode` counts only the matrix products of a step."""
    p = parts(tail)
    cells, reads, inside = token_cells(w, p.conv_dw)
    n_read, n_tok = len(torch.unique(reads[inside])), len(cells)
    per_cell = [2 * m.weight.numel() for m in (p.conv_pw, p.conv_dw, p.conv_pwl, p.conv_head)]
    rest = n_tok * sum(per_cell[1:])
    return 2 * per_cell[0] * n_read + 3 * rest + 2 * n_tok * p.conv_head.out_channels
