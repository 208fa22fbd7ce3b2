"""The papers' comparisons, run on any workspace: TriDerm's ablation tables (:mod:`.ablation`,
Table 2) and the contrastive-objective benchmark (:mod:`.contrastive`, METHODS.md §5).
These are the one place above both the vision and the text branch.
"""
