"""The Train page's logic: one tab per job (its settings, then its panel), the loss curves
(pages/4_Train.py calls :func:`main`)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from annotations.infra.workspace import Workspace
from app import extras, jobs, markup
from core import cli
from core.segmentation.defaults import ADVISED_OUTLINES
from core.vision.recipe import LITE0_LAYERS, LOSS_NAMES, MODES, SUPERVISED_CV
from core.vision.triderm_config import (
    DEFAULT,
    MODE_OPTIONS,
    PAPER_RECIPE,
    PAPER_RECIPE_MODES,
    POOLINGS,
    FineTuneConfig,
    mode_defaults,
)


#: the segmenter tab's choices of what a retraining run trains (``--tune``)
TUNE_LABELS = {"head": "the last layers (default)", "all": "every trained layer"}


def mode_text(mode: str) -> str:
    """What ``mode`` does, in the job's own words (:data:`core.vision.recipe.MODES`, its ``--mode`` help)."""
    return f"**{mode}**: {markup.escape_md(MODES[mode])}."


def vision_tab(ws: Workspace, off: bool) -> tuple[list[str], str]:
    """TriDerm-V's settings (disabled when ``off``): the training job's arguments and a shared model to embed
    with (or "")."""
    st.markdown("An image embedding of the outlined wounds on a frozen backbone (EfficientNet-Lite0 at full depth "
                "offline), learnt in the mode chosen below; the figures are measured on new patients of real "
                "wounds (`benchmarks/real_vision.py`). Only the settings the chosen mode reads are enabled and sent "
                "to the job (which refuses any other); `auto` sends none: the mode it chooses trains with its "
                "defaults.")
    n_expert = sum(1 for t in ws.store.expert_triplets() if t["choice"] in ("j", "k"))
    s1, s2 = st.columns(2)
    modes = [m for m in MODES if n_expert or m not in ("supervised", "fine-tune")]
    mode = s1.radio("Mode", modes, horizontal=True, disabled=off,
                    help=f"{n_expert} expert judgments in this workspace. " + " ".join(mode_text(m) for m in modes))
    s1.caption(mode_text(mode))
    recipe = st.radio("Recipe", ["real-data default", "paper recipe"], horizontal=True,
                      disabled=off or mode not in PAPER_RECIPE_MODES,
                      help=f"paper: {PAPER_RECIPE.dim}-d predictor, raw Euclidean distances; default: {DEFAULT.dim}-d, "
                           f"centred unit length (the {' and '.join(PAPER_RECIPE_MODES)} modes)")
    paper = recipe == "paper recipe" and mode in PAPER_RECIPE_MODES
    # the job refuses an option its mode does not read: only the fields of the mode's configs are sent, each
    # control starting at the mode's own default
    reads, default = MODE_OPTIONS[mode], mode_defaults(mode, paper)

    def unread(name: str) -> bool:
        return off or name not in reads

    def start(name: str) -> Any:
        return default.get(name, getattr(DEFAULT, name, None))

    folds = s2.number_input("Cross-validation folds (by patient; 0 = none)", min_value=0, max_value=20,
                            value=SUPERVISED_CV, disabled=unread("cv"),
                            help=f"supervised and fine-tune modes: patient-disjoint folds, repeated over "
                                 f"{DEFAULT.cv_repeats} random splits; the run's figure is the strict one (triplets "
                                 "whose three photos training never saw). auto takes "
                                 f"{SUPERVISED_CV} folds when it fine-tunes on the triplets")
    c1, c2, c3, c4, c5, c6, c7 = st.columns(7)
    layer = c1.selectbox("Backbone layer", list(LITE0_LAYERS), disabled=unread("layer"),
                         help="EfficientNet-Lite0 tokens: full depth (default) "
                         "or an earlier stage (stage5 = the tokens of earlier releases)")
    values = {"layer": layer,
              "pooling": c2.selectbox("Pooling", POOLINGS, index=POOLINGS.index(DEFAULT.pooling),
                                      disabled=unread("pooling")),
              "loss": c3.selectbox("Loss", LOSS_NAMES, index=LOSS_NAMES.index(DEFAULT.loss), disabled=unread("loss")),
              "epochs": str(int(c4.number_input("Epochs", min_value=1, max_value=500, value=start("epochs"),
                                                disabled=unread("epochs")))),
              "steps": str(int(c5.number_input("Fine-tune steps", min_value=1, max_value=5000,
                                               value=default.get("steps", FineTuneConfig().steps),
                                               disabled=unread("steps")))),
              "batch_size": str(int(c6.number_input("Batch size", min_value=2, max_value=512,
                                                    value=start("batch_size"), disabled=unread("batch_size")))),
              "lr": repr(float(c7.number_input("Learning rate", min_value=1e-6, max_value=1.0, value=start("lr"),
                                               format="%.5f", disabled=unread("lr"),
                                               help=f"fine-tune: {FineTuneConfig().lr} by default; else "
                                                    f"{DEFAULT.lr}"))),
              "cv": str(int(folds))}
    args = ["--mode", mode, *(a for name, v in values.items() if name in reads for a in (cli.flag(name), v)),
            *(["--paper-recipe"] if paper else [])]
    st.markdown("**A shared model**: embed this workspace's photos in the space of a model another centre "
                "published without its patient data (a `python -m core.export_model` folder on this server, or "
                "`hf-hub:org/repo`); the run (`vision-model`) then shows on Explore and is scored on the Report.")
    shared_model = st.text_input("Model folder or hf-hub: name", key="shared_model",
                                 placeholder="hf-hub:org/repo or /srv/models/centre-a", disabled=off).strip()
    return args, shared_model


def text_tab(llm_sources: list[str], off: bool) -> list[str]:
    """TriDerm-T's settings (disabled when ``off``): the SOE job's arguments."""
    st.markdown("Soft Ordinal Embedding of the LLM's triplets (TriDerm-T). Needs LLM triplets (LLM oracle page).")
    c1, c2 = st.columns(2)
    source = c1.selectbox("Triplet source", llm_sources or ["(no LLM triplets yet)"], disabled=off or not llm_sources)
    dim = c2.number_input("Dimensions", min_value=1, max_value=64, value=4, disabled=off)
    return ["--source", source, "--dim", str(int(dim))]


def evaluation_tab(off: bool) -> list[str]:
    """The evaluation job's arguments (disabled when ``off``)."""
    st.markdown("Agreement of every finished embedding run (and the vision + text fusions) with the expert "
                "triplets, with bootstrap CIs. Writes the report shown on the Report page.")
    n_boot = st.number_input("Bootstrap resamples", min_value=100, max_value=10_000, value=1000, step=100,
                             disabled=off)
    return ["--n-boot", str(int(n_boot))]


def ablation_tab(off: bool) -> list[str]:
    """The ablation job's arguments (disabled when ``off``)."""
    st.markdown("The paper's Table 2 ablations (SOE dimension/budget/oracle; pooling and loss) over seeds.")
    c1, c2 = st.columns(2)
    quick = c1.checkbox("Quick pass (10 vision epochs)", value=True, disabled=off)
    seeds = c2.number_input("Seeds per cell", min_value=1, max_value=10, value=3, disabled=off)
    return (["--quick"] if quick else []) + ["--n-seeds", str(int(seeds))]


def bench_tab(off: bool) -> list[str]:
    """The contrastive benchmark's arguments (disabled when ``off``: the variants come from a torch module)."""
    if off:
        VARIANTS: tuple[str, ...] = ()
    else:
        from core.experiments.contrastive import VARIANTS

    st.markdown("CLIP-objective variants (SigLIP, frozen / partly frozen towers, unimodal terms, FLIP) trained "
                "under identical settings on wound crops + descriptions; retrieval, concept AUROC, linear probe "
                "and triplet agreement. Finished cells are reused. Results on the Report page.")
    c1, c2 = st.columns([1, 3])
    quick = c1.checkbox("Quick pass (1 seed, 2 epochs, 96 px)", value=True, disabled=off)
    variants = c2.multiselect("Variants", VARIANTS, default=list(VARIANTS), disabled=off)
    return (["--quick"] if quick else []) + ["--variants", ",".join(variants or VARIANTS)]


def panels(ws: Workspace, tabs: list, args: dict[str, list[str]], shared_model: str, llm_sources: list[str],
           segmenter_tab=None, hint: str | None = None) -> None:
    """The job panel of each tab (``segmenter_tab``: the segmenter's, where it is installed; ``hint``: the install
    hint of the missing ``[ml]`` extra, which disables every Start), then the loss curves (refreshed every 2 s
    while a job runs; :func:`main` makes it a fragment)."""
    with tabs[0]:
        jobs.job_panel(ws, "train-triderm", "train_triderm", args["vision"], "training", blocked=hint)
        if shared_model:
            jobs.job_panel(ws, "embed-shared-model", "embed", ["--model", shared_model],
                         "embedding with the shared model", blocked=hint)
    with tabs[1]:
        if llm_sources:
            jobs.job_panel(ws, "fit-soe", "fit_soe", args["text"], "SOE fit", blocked=hint)
        else:
            st.info("Run the LLM oracle first: SOE needs LLM triplets.")
        st.markdown("**Text baseline**: mean-pooled MiniLM sentence embeddings of each photo's descriptions "
                    "(offline).")
        jobs.job_panel(ws, "text-embed", "text_embed", ["--model", "minilm"], "text baseline", blocked=hint)
    with tabs[2]:
        jobs.job_panel(ws, "evaluate", "evaluate", args["evaluation"], "evaluation", blocked=hint)
    with tabs[3]:
        jobs.job_panel(ws, "ablate", "ablate", args["ablation"], "ablations", blocked=hint)
    with tabs[4]:
        jobs.job_panel(ws, "bench-contrastive", "bench_contrastive", args["bench"], "benchmark", blocked=hint)
    if segmenter_tab is not None:
        with segmenter_tab:
            st.markdown("Fine-tune the wound segmenter that suggests outlines on the Wound masks page (until then, the "
                        "default model shipped with TriDerm) on every outline drawn or imported so far "
                        "(`python -m core.train_segmenter --workspace W`). It retrains the last layers that decide "
                        "where an outline's edge falls, so it learns how this clinic outlines without forgetting "
                        "the rest. The run ends with its Dice on held-out photos beside the Dice of the segmenter it "
                        "started from: if the fine-tune is worse there, keep outlining and retrain.")
            outlined = ws.store.counts()["images_with_wounds"]
            if outlined < ADVISED_OUTLINES:
                st.info(f"This workspace has {outlined} outlined photo{'' if outlined == 1 else 's'}. On other "
                        f"clinics' photos a fine-tune on 5 changed nothing and one on 15–20 helped (the model card's "
                        f"learning curve): outline at least {ADVISED_OUTLINES} before retraining.")
            tune = st.radio("What retraining changes", tuple(TUNE_LABELS), horizontal=True, disabled=hint is not None,
                            format_func=lambda t: TUNE_LABELS[t],
                            help="The last layers (the default) learn where and how large this clinic's outlines "
                                 "are, and did no harm where a clinic outlines as the default's data does. Every "
                                 "trained layer also learns a looser or tighter edge than the default's, but made "
                                 "a clinic whose outlines already matched it worse (MODEL_CARD.md, failure modes): "
                                 "choose it when this clinic outlines differently, and compare the run's held-out "
                                 "Dice with its start's.")
            jobs.job_panel(ws, "train-segmenter", "train_segmenter", ["--tune", tune], "segmenter retraining",
                           blocked=hint)
    loss_curves(ws)


def loss_curves(ws: Workspace) -> None:
    """Plot the training loss per epoch of the chosen runs, with a table of every run that reported one."""
    st.subheader("Loss curves")
    runs = [r for r in ws.store.runs() if isinstance(r["metrics"].get("loss"), list) and r["metrics"]["loss"]]
    if not runs:
        st.caption("No run has reported a loss yet. Curves appear here live while a job trains.")
        return
    labels = {f"run {r['id']} · {r['kind']} · {r['status']}": r for r in runs}
    chosen = st.multiselect("Runs", list(labels), default=list(labels)[:3], key="loss_runs")
    fig = go.Figure()
    for label in chosen:
        losses = labels[label]["metrics"]["loss"]
        fig.add_trace(go.Scatter(x=list(range(1, len(losses) + 1)), y=losses, mode="lines+markers", name=label))
    fig.update_layout(xaxis_title="epoch", yaxis_title="training loss", height=380, margin={"t": 20, "b": 40},
                      legend={"orientation": "h", "y": -0.25})
    st.plotly_chart(fig, width="stretch")
    st.dataframe(pd.DataFrame([{
        "run": r["id"], "kind": r["kind"], "status": markup.status_badge(r["status"]), "epochs": len(r["metrics"]["loss"]),
        "last loss": round(float(r["metrics"]["loss"][-1]), 5), "seed": r["seed"], "git": (r["git_sha"] or "")[:8],
        "message": r["message"] or "",
    } for r in runs]), hide_index=True, width="stretch")


def main(ws: Workspace) -> None:
    """One tab per job (settings, then its panel), the segmenter's where it is installed, and the loss curves;
    without the ``[ml]`` extra every control stays, disabled, naming it."""
    st.caption("Jobs run as separate processes: leaving this page or closing the browser does not stop them. "
               "Progress and losses come from each job's run record in the store.")
    hint = extras.missing_extra("ml")
    if hint:
        st.error(f"Training needs the `[ml]` extra (torch), which this server does not have (an annotation server "
                 f"installs only `[app]`). To train here, install it on the server and restart the app: `{hint}`.",
                 icon=":material/extension:")
    if ws.store.counts()["wounds"] == 0:
        st.info("No wound is outlined yet: the vision model trains on wound outlines (Wound masks page).")
    has_segmenter = jobs.module_available("train_segmenter")  # shown only where `core.train_segmenter` is installed
    tabs = st.tabs(["TriDerm vision", "Text (SOE)", "Evaluation", "Ablations", "Contrastive benchmark"]
                   + (["Retrain segmenter"] if has_segmenter else []))
    llm_sources = [s for s in ws.store.triplet_sources() if s.startswith("llm:")]
    off = hint is not None
    with tabs[0]:
        vision_args, shared_model = vision_tab(ws, off)
    with tabs[1]:
        text_args = text_tab(llm_sources, off)
    with tabs[2]:
        eval_args = evaluation_tab(off)
    with tabs[3]:
        ablate_args = ablation_tab(off)
    with tabs[4]:
        bench_args = bench_tab(off)
    every = 2.0 if jobs.any_job_running(ws) else None
    st.fragment(panels, run_every=every)(ws, tabs, {"vision": vision_args, "text": text_args, "evaluation": eval_args,
                                                   "ablation": ablate_args, "bench": bench_args},
                                         shared_model, llm_sources, tabs[5] if has_segmenter else None, hint)
