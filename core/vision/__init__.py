"""TriDerm-V, the image branch (TriDerm §2.2 and §3.2, METHODS.md §1).

A frozen backbone (:mod:`.backbones`) turns a photo into a feature map; joint photo + mask
augmentation (:mod:`.augment`) makes the views; each wound's tokens on the feature grid and their
cache (:mod:`.features`) are pooled by attention or mean (:mod:`.pooling`); :mod:`.triderm` trains the
pooling + predictor head with VICReg, :mod:`.baseline` is the frozen mean-pool baseline (§3.3).
"""
