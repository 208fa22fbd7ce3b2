"""Evaluation and fusion (TriDerm §2.4 and §3, Table 1, METHODS.md §1).

Where the vision and text branches meet, through their distance matrices only:
agreement with the expert's triplets (:mod:`.metrics`: balanced/micro agreement, macro-F1,
Cohen's κ, bootstrap CIs), distance matrices (:mod:`.distances`), training-free fusion
(:mod:`.fusion`), nearest/farthest retrieval (:mod:`.retrieval`) and the report (:mod:`.report`).
Imports neither :mod:`core.vision` nor :mod:`core.text`.
"""
