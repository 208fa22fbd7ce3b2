"""The contrastive benchmark's names that ``python -m core.bench_contrastive --help`` shows, in a module
without torch or scikit-learn; :mod:`core.experiments.contrastive` uses these (and re-exports them)."""
from __future__ import annotations

VARIANTS = ("clip", "siglip", "image_frozen", "text_frozen", "image_partial", "text_partial",
            "clip_unimodal", "clip_masked", "flip")
#: the benchmark's folder under the workspace's runs/
OUT_DIR = "bench_contrastive"
