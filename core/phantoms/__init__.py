"""Wound phantoms: the embedded, fully synthetic demo dataset of TriDerm Studio.

Split by role: :mod:`~core.phantoms.world` (patients, photos, wounds and their latent
attributes), :mod:`~core.phantoms.render` (photos and label maps),
:mod:`~core.phantoms.descriptions` (clinical free text), :mod:`~core.phantoms.expert` (the
calibrated noisy oracle and its reload) and :mod:`~core.phantoms.dataset` (the dataset folder).

Procedurally rendered photos of RDEB-like wounds that mirror the reference study
(TriDerm, METHODS.md §1: 53 photos, 21 patients, 120 wounds with 1–16 per photo, 513
expert triplets), written in the dataset-folder layout of docs/ARCHITECTURE.md::

    images/<id>.png  masks/<id>.png  wounds.csv  images.csv  patients.csv  triplets.csv
    dataset.json     truth/ (latent truth: wounds.csv, images.csv, concepts.csv, oracle.json,
                             ceilings.json, fibrin/<id>.png, planted/<id>.png)

Generative model (all of it is synthetic and labelled so):

Phantom v2 plants what the paper's claims need to be won or lost:

- in-wound distractors the expert ignores (a dressing edge, a specular glare, a tattoo-like
  marker-ink mark; ``Wound.distractors``) and a small, clinically decisive region (a raised nodule
  suspicious for SCC, heavily weighted by the expert), so attention pooling can beat mean pooling;
- symptoms and history that no photo shows (pain, itch, bleeding history, duration), told in the
  descriptions only; the expert's truth mixes visible and told features;
- a text oracle (:class:`TextOracle`, used by ``core.text.llm.PhantomOracle``) that reads the
  descriptions only;
- the planted ceilings (truth/ceilings.json, :func:`load_ceilings`): the best balanced agreement
  with the expert's triplets reachable from what the photos show, from what the descriptions
  say, from both, and the expert's own noise ceiling.

Generative model (all of it is synthetic and labelled so):

- Patients carry a latent disease severity; wounds draw their clinical attributes
  (granulation, fibrin coverage, depth, erythema, hemorrhagic crust coverage, border type,
  size) from logits that mix severity, site, chronicity, a patient effect, a photo effect
  and wound noise, so wounds of one patient resemble each other.
- The attributes drive the rendering (granular red bed, blobby yellow fibrin, dark
  cracked crusts, pale raised rims, pink halo, depth shading) on Fitzpatrick-toned,
  scarred skin under varying camera scale, orientation, light, white balance and blur.
- Descriptions are clinical free text generated from the same attributes (varied
  wording, omissions, negations); metadata (age, sex, Fitzpatrick type, site, size,
  duration) correlate with them and are missing at a realistic rate.
- The expert's triplets come from a noisy oracle on the photos' latent vectors
  (mean of their wounds' weighted, standardised attribute vectors): P(choose j) =
  Φ(Δ/σ) with Δ = d(i,k) − d(i,j), skips more likely for ambiguous triplets. σ and the
  skip scale are calibrated numerically so the perfect latent embedding agrees with
  the expert about 85% of the time and about 5% of answers are skips.
  :class:`PhantomTruth` reloads that oracle so any (i, j, k) is answered the same way.

:mod:`~core.phantoms.visits` renders follow-up visits instead (``--visits N``): each patient's wounds
healing, growing, closing or new at planted rates beside an ArUco marker of known size, truth in cm².

Usage::

    python -m core.phantoms --out DIR [--seed S] [--photos 53 --patients 21
                            --wounds 120 --triplets 513] [--montage docs/phantoms.png]
    python -m core.phantoms --out DIR --visits N [--patients 21] [--seed S]
"""
from core.phantoms.dataset import DATASET_NAME, build, montage
from core.phantoms.descriptions import DescriptionReader, read_description
from core.phantoms.expert import (
    ANNOTATOR,
    CEILINGS,
    PhantomTruth,
    TextOracle,
    calibrate_oracle,
    expert_rng,
    load_ceilings,
    load_text_oracle,
    load_truth,
)
from core.phantoms.world import (
    CONCEPTS,
    DESCRIBED_FEATURES,
    DISTRACTORS,
    LATENT_FEATURES,
    VISIBLE_FEATURES,
    concept_presence,
)

__all__ = [
    "ANNOTATOR",
    "CEILINGS",
    "CONCEPTS",
    "DATASET_NAME",
    "DESCRIBED_FEATURES",
    "DISTRACTORS",
    "LATENT_FEATURES",
    "VISIBLE_FEATURES",
    "DescriptionReader",
    "PhantomTruth",
    "TextOracle",
    "build",
    "calibrate_oracle",
    "concept_presence",
    "expert_rng",
    "load_ceilings",
    "load_text_oracle",
    "load_truth",
    "montage",
    "read_description",
]
