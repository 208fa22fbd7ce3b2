"""Report: this workspace's own result first — the verdict in words (the trained embedding against the
untrained one on the same held-out triplets, :mod:`core.eval.verdict`) and the next step — then every run's
agreement with the expert triplets (with CIs), ablation tables and benchmark charts, downloads; the
repository's real-wound benchmark last, collapsed. Each part says what data it is on: the SYNTHETIC banner
heads this workspace's sections only, never the real-data one.

One function per section (:func:`app.report.main` draws them); the tables' cells and rows come from plain
functions of :mod:`app.report` (``metric_cell``, ``seeds_cell``, ``agreement_rows``, ``ablation_rows``,
``benchmark_rows``)."""

from __future__ import annotations

from app import navigation, report

ws = navigation.page("Report", need="view", banner=False)  # the banner heads the workspace's sections below
report.main(ws)
