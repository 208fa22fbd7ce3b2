"""The Report on a 1366×768 laptop screen, in Chromium: the workspace's verdict in words, then the next step, above
the fold; the repository's real-wound benchmark collapsed at the bottom (issue 54)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import expect
from streamlit_page import idle

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset

expect.set_options(timeout=120_000)
pytestmark = [pytest.mark.browser, pytest.mark.slow]
LAPTOP = {"width": 1366, "height": 768}


@pytest.fixture(scope="module")
def verdict_workspace(demo_dataset, tmp_path_factory) -> Path:
    """The demo with a TEST-ONLY frozen baseline and a TEST-ONLY fine-tuned run whose strict held-out triplets are
    every other expert triplet (random embeddings, clearly labelled), and the evaluation of both."""
    from core.eval.report import run_report
    from core.runtime import save_embeddings

    root = tmp_path_factory.mktemp("verdict") / "ws"
    ws = Workspace(root)
    import_dataset(ws, demo_dataset)
    ids = [im["image_id"] for im in ws.store.images()]
    rng = np.random.default_rng(0)
    for kind, config, metrics in (
            ("vision-baseline", {}, {}),
            ("vision-finetune", {"supervise": "triplets"},
             {"cv": {"protocol": "strict", "balanced": 0.6, "ci": [0.5, 0.7], "n": 1, "n_anchors": 1,
                     "per_triplet": [[t["anchor"], *((t["ref_j"], t["ref_k"]) if t["choice"] == "j" else
                                                     (t["ref_k"], t["ref_j"])), int(n % 3 > 0), 1]
                                     for n, t in enumerate(ws.store.expert_triplets()[::2]) if t["choice"] != "skip"]}})):
        run_id = ws.store.start_run(kind, {"modality": "vision", "test_only": True, **config}, name="TEST-ONLY")
        save_embeddings(ws, run_id, ids, image_emb=rng.normal(size=(len(ids), 6)))
        ws.store.finish_run(run_id, metrics=metrics)
    run_report(ws, n_boot=50)
    ws.store.close()
    return root


def test_report_states_the_verdict_and_next_step_above_the_fold(verdict_workspace, start_app, chromium, add_account,
                                                                sign_in, screenshot, tmp_path):
    server = start_app(verdict_workspace, tmp_path / "streamlit.log")
    name = add_account(server.workspace, "Dr Verdict", "viewer")
    context = chromium.new_context(viewport=LAPTOP)
    pg = context.new_page()
    pg.set_default_timeout(120_000)
    sign_in(pg, server.url, name)
    pg.get_by_role("link", name="Report").click()
    line = pg.get_by_text("The trained embedding (run #2, vision-finetune) agrees with the expert")
    expect(line).to_be_visible()
    idle(pg)
    for shown in (line, pg.get_by_text("Next step:")):
        box = shown.bounding_box()
        assert box["y"] >= 0 and box["y"] + box["height"] <= LAPTOP["height"], box  # above the fold
    expect(line).to_contain_text("the untrained one (run #1, vision-baseline)")
    expect(line).to_contain_text("beyond chance on these")
    expect(pg.get_by_text("Real wounds: vision benchmark")).to_be_hidden()  # collapsed, at the bottom
    expect(pg.get_by_text("Real wounds: the repository's vision benchmark")).to_be_attached()
    screenshot(pg, "report_verdict_1366x768")
    context.close()
