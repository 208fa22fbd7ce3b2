"""TriDerm-T, the text branch (TriDerm §2.3, METHODS.md §1).

An LLM (or the phantom truth) answers triplet questions over the wound descriptions as a synthetic
expert (:mod:`.llm`); :mod:`.sampling` chooses the questions (uniform, anchor-balanced, active),
:mod:`.queries` asks them and stores the answers; a Soft Ordinal Embedding (:mod:`.soe`) is fitted
to the answers (:mod:`.fit`); :mod:`.sentence` holds the sentence-encoder baselines (§3.3).
"""
