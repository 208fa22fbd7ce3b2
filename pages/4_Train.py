"""Train: launch the vision, text, evaluation, ablation and contrastive-benchmark jobs in the background;
watch loss curves."""

from __future__ import annotations

from app import navigation, train

ws = navigation.page("Train", need="jobs")
train.main(ws)
