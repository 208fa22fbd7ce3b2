"""Device selection and mixed precision: CUDA (bf16 autocast) when available, else CPU (fp32)."""
from __future__ import annotations

import contextlib

import torch


def pick_device() -> torch.device:
    """Return ``cuda`` when a GPU is available, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast(device: torch.device | str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; a no-op context on CPU (fp32 there is both faster and exact)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
