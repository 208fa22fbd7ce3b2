"""Device selection and mixed precision: CUDA (bf16 autocast) when available, else CPU (fp32)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

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


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Temporarily set torch's intra-op CPU threads (tiny ops run fastest on one thread:
    no fork/join per op, and no oversubscription when other processes share the cores)."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
