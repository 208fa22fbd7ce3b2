"""Evaluation and fusion (TriDerm §2.4 and §3, Table 1, METHODS.md §1).

Where the vision and text branches meet, through their distance matrices only:
agreement with the expert's triplets (:mod:`.metrics`: balanced/micro agreement, macro-F1,
Cohen's κ, bootstrap CIs), the evaluation protocol (:mod:`.protocol`: patient-disjoint folds, strict and
anchor-unseen scoring, patient bootstrap, paired tests), distance matrices (:mod:`.distances`), training-free fusion
(:mod:`.fusion`), nearest/farthest retrieval (:mod:`.retrieval`), the report (:mod:`.report`), the
statistics over seeds (:mod:`.stats`), the machine-readable result files (:mod:`.result_files`) and
the one text form of an agreement and its CI (:mod:`.formatting`).
Imports neither :mod:`core.vision` nor :mod:`core.text`.
"""
