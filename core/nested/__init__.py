"""SLIMP, the nested model (METHODS.md §2): wound images + wound metadata + patient metadata.

:mod:`.tabular` encodes metadata fields as tokens, :mod:`.model` nests wound and patient records,
:mod:`.training` holds the distributed training steps and the evaluation (the loss is
:mod:`core.losses.nested`).
"""
