"""TriDerm Studio's machine learning; never imports Streamlit.

The jobs (``python -m core.<job>``) sit at the top, with :mod:`core.runtime`, the plumbing they
share (device, workspace, run artifacts). Each part of the method has its package:
:mod:`core.vision`, :mod:`core.text`, :mod:`core.eval`, :mod:`core.nested`, :mod:`core.concepts`,
:mod:`core.losses`, :mod:`core.experiments` and :mod:`core.phantoms` (docs/ARCHITECTURE.md).
"""
