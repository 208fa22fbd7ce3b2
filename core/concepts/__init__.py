"""Concept models (MAKE, METHODS.md §3; ConceptCLIP, §4): an image–text dual encoder, a wound
concept vocabulary, concept scores, heatmaps and a concept bottleneck.

:mod:`.dual_encoder` (CLIP-style towers with patch and text-token outputs), :mod:`.vocabulary`
(concept vocabulary, description tagger with negation, text aspects; data in ``concept_vocab.json``),
:mod:`.scores` (zero-shot concept scores, patch heatmaps, bottleneck), :mod:`.training` (the
trainer for the CLIP, SigLIP, MAKE and ConceptCLIP objectives), :mod:`.run` (one concepts run:
data, training, held-out evaluation, stored embeddings).
"""
