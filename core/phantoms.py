"""Wound phantoms: the embedded, fully synthetic demo dataset of TriDerm Studio.

Procedurally rendered photos of RDEB-like wounds that mirror the reference study
(TriDerm, METHODS.md §1: 53 photos, 21 patients, 120 wounds with 1–16 per photo, 513
expert triplets), written in the dataset-folder layout of docs/ARCHITECTURE.md::

    images/<id>.png  masks/<id>.png  wounds.csv  images.csv  patients.csv  triplets.csv
    dataset.json     truth/ (latent truth: wounds.csv, images.csv, concepts.csv,
                             oracle.json, fibrin/<id>.png)

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

Usage::

    python -m core.phantoms --out DIR [--seed S] [--photos 53 --patients 21
                            --wounds 120 --triplets 513] [--montage docs/phantoms.png]
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from scipy import ndimage
from scipy.special import expit, ndtr
from tqdm import tqdm

DATASET_NAME = "TriDerm wound phantoms (synthetic)"
ANNOTATOR = "phantom-expert"
NUMERIC_ATTRIBUTES = ("granulation", "fibrin", "depth", "erythema", "crust")
BORDERS = ("regular", "hyperkeratotic", "fibrotic", "scarred")
# Latent vector of a wound: standardised attributes, each with an expert weight.
LATENT_FEATURES = (
    "granulation", "fibrin", "depth", "erythema", "crust",
    "border_hyperkeratotic", "border_fibrotic", "border_scarred", "log_size",
)
LATENT_WEIGHTS = (1.0, 1.0, 1.0, 0.8, 0.8, 0.6, 0.6, 0.6, 0.5)
CONCEPTS = (
    "granulation", "fibrin", "crust", "erythema", "hyperkeratotic_border",
    "fibrotic_border", "scarring", "deep", "superficial",
)
# Presence thresholds shared by truth/concepts.csv and the description generator.
THRESHOLDS = {"granulation": 0.2, "fibrin": 0.08, "crust": 0.08, "erythema": 0.35,
              "deep": 0.6, "superficial": 0.3}
TARGET_AGREEMENT = 0.85
TARGET_SKIP = 0.05
MISSING_RATE = 0.07
MAX_WOUNDS_PER_PHOTO = 16
_ANSWER_STREAM = 7  # default_rng([seed, 7]) answers triplets.csv in file order

# Body regions: (sided?, sub-sites, attribute logit offsets granulation/fibrin/depth/erythema/crust,
# hyperkeratotic-border bonus).
_REGIONS: dict[str, tuple[bool, tuple[str, ...], tuple[float, ...], float]] = {
    "lower leg": (True, ("shin", "calf", "ankle"), (0.0, 0.4, 0.3, 0.1, 0.0), 0.5),
    "knee": (True, ("knee",), (-0.2, 0.3, 0.1, 0.2, 0.4), 0.7),
    "foot": (True, ("dorsum of the foot", "heel", "toes"), (-0.3, 0.6, 0.5, 0.0, -0.2), 1.0),
    "hand": (True, ("dorsum of the hand", "fingers", "wrist"), (0.1, -0.2, -0.4, 0.3, 0.3), 0.6),
    "arm": (True, ("forearm", "elbow", "upper arm"), (0.2, -0.2, -0.2, 0.1, 0.5), 0.2),
    "back": (False, ("upper back", "lower back", "scapular region"), (0.3, -0.4, -0.7, 0.2, 0.6), -0.5),
    "buttock": (True, ("buttock", "sacral region"), (0.0, 0.3, 0.2, 0.4, 0.0), -0.2),
    "trunk": (False, ("abdomen", "chest", "flank"), (0.3, -0.3, -0.6, 0.3, 0.3), -0.5),
    "shoulder": (True, ("shoulder",), (0.2, -0.1, -0.3, 0.2, 0.4), 0.0),
}
_CAMERAS = ("smartphone", "DSLR", "compact camera")
_FITZPATRICK_RGB = np.array([
    (0.95, 0.80, 0.71), (0.90, 0.72, 0.61), (0.81, 0.60, 0.47),
    (0.66, 0.46, 0.33), (0.47, 0.31, 0.21), (0.31, 0.20, 0.14)], dtype=np.float32)
_SHEETS = np.array([
    (0.72, 0.80, 0.88), (0.90, 0.90, 0.88), (0.42, 0.60, 0.55),
    (0.80, 0.82, 0.84), (0.55, 0.70, 0.82)], dtype=np.float32)
_SIZES = ((512, 384), (544, 408), (480, 360), (576, 384), (512, 340), (384, 512), (408, 544))


# --------------------------------------------------------------------------- latent model
@dataclass
class _Wound:
    attrs: dict[str, float]          # granulation, fibrin, depth, erythema, crust in [0, 1]
    border: str
    size_cm: float                   # longest diameter
    width_cm: float
    duration_weeks: int
    site: str


@dataclass
class _Photo:
    image_id: str
    patient: int
    region: str
    side: str
    camera: str
    wounds: list[_Wound] = field(default_factory=list)


def _counts_per_photo(rng: np.random.Generator, photos: int, wounds: int) -> np.ndarray:
    """Wounds per photo in [1, 16] summing to ``wounds``; one photo holds 16 when feasible."""
    counts = np.minimum(1 + rng.geometric(0.55, size=photos) - 1, MAX_WOUNDS_PER_PHOTO - 4)
    big = -1
    if wounds - photos >= MAX_WOUNDS_PER_PHOTO - 1:
        big = int(rng.integers(photos))
        counts[big] = MAX_WOUNDS_PER_PHOTO
    others = [i for i in range(photos) if i != big]
    while counts.sum() != wounds:
        i = others[int(rng.integers(len(others)))]
        if counts.sum() < wounds and counts[i] < MAX_WOUNDS_PER_PHOTO:
            counts[i] += 1
        elif counts.sum() > wounds and counts[i] > 1:
            counts[i] -= 1
    return counts


def _sample_population(rng: np.random.Generator, n_photos: int, n_patients: int, n_wounds: int
                       ) -> tuple[list[dict[str, Any]], list[_Photo]]:
    """Latent patients and photos with their wounds' attributes."""
    patients: list[dict[str, Any]] = []
    for p in range(n_patients):
        severity = float(rng.standard_normal())
        age = int(np.clip(round(math.exp(math.log(14) + 0.25 * severity + 0.55 * rng.standard_normal())), 1, 55))
        fitz = int(rng.choice(6, p=[0.14, 0.30, 0.26, 0.15, 0.10, 0.05])) + 1
        patients.append({
            "patient_id": f"pt{p + 1:02d}", "severity": severity, "age": age,
            "sex": "F" if rng.random() < 0.5 else "M", "fitzpatrick": fitz,
            "subtype": "RDEB generalized severe" if severity + 0.5 * rng.standard_normal() > 0.2
            else "RDEB generalized intermediate",
            "effect": rng.normal(0.0, 0.7, size=len(NUMERIC_ATTRIBUTES)),
            "border_effect": rng.normal(0.0, 0.8, size=len(BORDERS)),
        })
    owner = np.concatenate([np.arange(n_patients), rng.choice(
        n_patients, size=n_photos - n_patients, p=rng.dirichlet(np.full(n_patients, 1.5)))])
    rng.shuffle(owner)
    counts = _counts_per_photo(rng, n_photos, n_wounds)
    base = np.array([1.4, -1.3, -0.6, -0.3, -2.0])
    load = np.array([-0.5, 0.7, 0.6, 0.4, 0.4])
    chron_load = np.array([-0.4, 0.5, 0.3, -0.2, 0.0])
    regions = list(_REGIONS)
    photos: list[_Photo] = []
    for i in range(n_photos):
        pat = patients[int(owner[i])]
        n = int(counts[i])
        region = "back" if n >= 12 else regions[int(rng.integers(len(regions)))]
        sided, subsites, site_eff, hk_bonus = _REGIONS[region]
        side = ("left" if rng.random() < 0.5 else "right") if sided else ""
        photo = _Photo(f"ph{i + 1:03d}", int(owner[i]), region, side,
                       _CAMERAS[int(rng.choice(3, p=[0.6, 0.25, 0.15]))])
        photo_eff = rng.normal(0.0, 0.3, size=len(NUMERIC_ATTRIBUTES))
        s = pat["severity"]
        for _ in range(n):
            chronic = 0.4 * s + float(rng.standard_normal())
            z = (base + load * s + np.array(site_eff) + pat["effect"] + photo_eff
                 + chron_load * chronic + rng.normal(0.0, 0.65, size=len(NUMERIC_ATTRIBUTES)))
            g, f, dep, ery, cr = expit(z)
            f, cr = float(f), float(0.7 * cr)
            if f + cr > 0.9:
                f, cr = f * 0.9 / (f + cr), cr * 0.9 / (f + cr)
            g = float(g) * (1.0 - f - cr)  # visible granulation: a share of the uncovered bed
            blog = (np.array([0.5, -0.3 + 0.6 * s + 0.7 * chronic + hk_bonus, -0.5 + 0.5 * chronic,
                              -0.4 + 0.3 * s]) + pat["border_effect"])
            prob = np.exp(blog - blog.max())
            border = BORDERS[int(rng.choice(4, p=prob / prob.sum()))]
            size = float(np.clip(math.exp(math.log(2.2) + 0.3 * s + 0.3 * chronic
                                          + 0.45 * rng.standard_normal() - 0.35 * math.log(n)), 0.3, 14.0))
            sub = subsites[int(rng.integers(len(subsites)))]
            photo.wounds.append(_Wound(
                attrs={"granulation": float(g), "fibrin": f, "depth": float(dep),
                       "erythema": float(ery), "crust": cr},
                border=border, size_cm=round(size, 1), width_cm=round(size * rng.uniform(0.45, 0.95), 1),
                duration_weeks=int(np.clip(round(math.exp(1.6 + 0.9 * chronic)), 1, 300)),
                site=f"{side} {sub}".strip()))
        photos.append(photo)
    return patients, photos


def _wound_features(wounds: list[_Wound]) -> np.ndarray:
    """Raw (unstandardised) latent features, one row per wound, columns LATENT_FEATURES."""
    return np.array([[w.attrs[a] for a in NUMERIC_ATTRIBUTES]
                     + [float(w.border == b) for b in BORDERS[1:]] + [math.log(w.size_cm)]
                     for w in wounds], dtype=np.float64)


def _standardise(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mean, std = raw.mean(axis=0), raw.std(axis=0)
    std = np.where(std > 1e-9, std, 1.0)
    return (raw - mean) / std * np.asarray(LATENT_WEIGHTS), mean, std


def concept_presence(attrs: dict[str, float], border: str) -> dict[str, int]:
    """Binary presence of each concept in CONCEPTS for one wound's latent attributes."""
    return {
        "granulation": int(attrs["granulation"] >= THRESHOLDS["granulation"]),
        "fibrin": int(attrs["fibrin"] >= THRESHOLDS["fibrin"]),
        "crust": int(attrs["crust"] >= THRESHOLDS["crust"]),
        "erythema": int(attrs["erythema"] >= THRESHOLDS["erythema"]),
        "hyperkeratotic_border": int(border == "hyperkeratotic"),
        "fibrotic_border": int(border == "fibrotic"),
        "scarring": int(border == "scarred"),
        "deep": int(attrs["depth"] >= THRESHOLDS["deep"]),
        "superficial": int(attrs["depth"] < THRESHOLDS["superficial"]),
    }


# --------------------------------------------------------------------------- expert oracle
def _margins(latent: np.ndarray, triplets: np.ndarray) -> np.ndarray:
    """Δ = d(i,k) − d(i,j) in latent space for rows (i, j, k)."""
    i, j, k = triplets.T
    return (np.linalg.norm(latent[i] - latent[k], axis=1) - np.linalg.norm(latent[i] - latent[j], axis=1))


def _skip_probability(delta: np.ndarray, sigma: float, skip_scale: float) -> np.ndarray:
    return np.minimum(skip_scale * np.exp(-0.5 * (delta / sigma) ** 2), 0.5)


def calibrate_oracle(latent: np.ndarray, target_agreement: float = TARGET_AGREEMENT,
                     target_skip: float = TARGET_SKIP, sample: int = 60000,
                     seed: int = 0) -> tuple[float, float]:
    """Noise scale σ and skip scale so that, over uniformly random triplets, the perfect
    latent embedding agrees with the simulated expert's non-skip answers with probability
    ``target_agreement`` and a fraction ``target_skip`` of answers are skips (bisection)."""
    n = latent.shape[0]
    if n < 3:
        raise ValueError(f"need at least 3 photos to calibrate the oracle, got {n}")
    rng = np.random.default_rng([seed, 11])
    trip = np.stack([rng.permutation(n)[:3] for _ in range(min(sample, 20000))])
    delta = np.abs(_margins(latent, trip))
    if not np.any(delta > 0):
        raise ValueError("all photos share one latent vector; the oracle cannot be calibrated")

    def stats(sigma: float) -> tuple[float, float]:
        gauss = np.exp(-0.5 * (delta / sigma) ** 2)
        skip_scale = target_skip / max(gauss.mean(), 1e-12)
        keep = 1.0 - _skip_probability(delta, sigma, skip_scale)
        return float((keep * ndtr(delta / sigma)).sum() / keep.sum()), skip_scale

    lo, hi = 1e-6 * delta.max(), 100.0 * delta.max()
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if stats(mid)[0] > target_agreement:
            lo = mid
        else:
            hi = mid
    sigma = math.sqrt(lo * hi)
    return sigma, stats(sigma)[1]


@dataclass
class PhantomTruth:
    """Latent truth of a phantom dataset and its simulated expert.

    ``answer(i, j, k, rng)`` draws the expert's answer to "is i more similar to j or to
    k?" exactly as the triplets.csv answers were drawn: first a uniform number for the
    skip decision, then one for the choice, P(j) = Φ((d(i,k) − d(i,j)) / sigma).
    """

    image_ids: list[str]
    latent: np.ndarray                  # photos × len(LATENT_FEATURES)
    sigma: float
    skip_scale: float
    seed: int
    wounds: list[dict[str, Any]]        # truth/wounds.csv rows (attributes, concepts)
    root: Path | None = None

    def __post_init__(self) -> None:
        self._index = {im: n for n, im in enumerate(self.image_ids)}

    def index(self, image: str | int) -> int:
        """Row of an image id (or pass-through of an integer index)."""
        if isinstance(image, (int, np.integer)):
            if not 0 <= int(image) < len(self.image_ids):
                raise IndexError(f"image index {image} outside [0, {len(self.image_ids)})")
            return int(image)
        if image not in self._index:
            raise KeyError(f"unknown phantom image id {image!r}")
        return self._index[image]

    def fibrin_mask(self, image: str | int) -> np.ndarray:
        """H×W label map of the planted fibrin (wound index where fibrin is visible, 0 elsewhere)."""
        if self.root is None:
            raise ValueError("this PhantomTruth was not loaded from a folder; no fibrin masks")
        return np.asarray(Image.open(self.root / "fibrin" / f"{self.image_ids[self.index(image)]}.png"))

    def concepts(self) -> list[dict[str, Any]]:
        """truth/concepts.csv rows: image_id, wound_index and 0/1 presence of each concept in CONCEPTS."""
        if self.root is None:
            raise ValueError("this PhantomTruth was not loaded from a folder; no concept table")
        with open(self.root / "concepts.csv", newline="", encoding="utf-8") as fh:
            return [{k: (v if k == "image_id" else int(v)) for k, v in r.items()} for r in csv.DictReader(fh)]

    def distance_matrix(self) -> np.ndarray:
        """Euclidean distances between the photos' latent vectors (the perfect embedding)."""
        diff = self.latent[:, None, :] - self.latent[None, :, :]
        return np.sqrt((diff ** 2).sum(-1))

    def probabilities(self, i: str | int, j: str | int, k: str | int) -> tuple[float, float]:
        """(P(skip), P(choose j | not skipped)) for one triplet."""
        tri = np.array([[self.index(i), self.index(j), self.index(k)]])
        if len(set(tri[0].tolist())) != 3:
            raise ValueError(f"a triplet needs three distinct images, got {(i, j, k)}")
        delta = _margins(self.latent, tri)
        return (float(_skip_probability(delta, self.sigma, self.skip_scale)[0]),
                float(ndtr(delta / self.sigma)[0]))

    def answer(self, i: str | int, j: str | int, k: str | int, rng: np.random.Generator) -> str:
        """The simulated expert's answer: 'j', 'k' or 'skip'."""
        p_skip, p_j = self.probabilities(i, j, k)
        u_skip, u_choice = rng.random(), rng.random()
        if u_skip < p_skip:
            return "skip"
        return "j" if u_choice < p_j else "k"

    def expected_agreement(self, triplets: np.ndarray | None = None) -> float:
        """Expected agreement of the perfect embedding with the expert's non-skip answers."""
        if triplets is None:
            n = len(self.image_ids)
            triplets = np.array([(a, b, c) for a in range(n) for b in range(n) for c in range(b + 1, n)
                                 if a != b and a != c])
        delta = np.abs(_margins(self.latent, np.asarray(triplets)))
        keep = 1.0 - _skip_probability(delta, self.sigma, self.skip_scale)
        return float((keep * ndtr(delta / self.sigma)).sum() / keep.sum())


def expert_rng(seed: int) -> np.random.Generator:
    """The random stream that answered triplets.csv (in file order) for ``seed``."""
    return np.random.default_rng([seed, _ANSWER_STREAM])


def load_truth(truth_dir: str | Path) -> PhantomTruth:
    """Load ``DIR/truth`` (or DIR itself) written by :func:`build`."""
    root = Path(truth_dir)
    if (root / "truth").is_dir():
        root = root / "truth"
    oracle_path = root / "oracle.json"
    if not oracle_path.is_file():
        raise FileNotFoundError(f"{oracle_path} not found: not a phantom truth folder")
    oracle = json.loads(oracle_path.read_text(encoding="utf-8"))
    with open(root / "images.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    latent = np.array([[float(r[f"z_{f}"]) for f in LATENT_FEATURES] for r in rows], dtype=np.float64)
    with open(root / "wounds.csv", newline="", encoding="utf-8") as fh:
        wounds = list(csv.DictReader(fh))
    return PhantomTruth([r["image_id"] for r in rows], latent, float(oracle["sigma"]),
                        float(oracle["skip_scale"]), int(oracle["seed"]), wounds, root)


# --------------------------------------------------------------------------- descriptions
def _pick(rng: np.random.Generator, options: tuple[str, ...] | list[str]) -> str:
    return options[int(rng.integers(len(options)))]


def describe(w: _Wound, rng: np.random.Generator) -> str:
    """Clinical free text for one wound from its latent attributes (varied wording,
    omissions and negations; positive mentions only for concepts that are present)."""
    a = w.attrs
    depth = a["depth"]
    if depth < THRESHOLDS["superficial"]:
        adj, noun = _pick(rng, ("Superficial", "Flat superficial", "Superficial")), \
            _pick(rng, ("erosion", "erosion", "wound", "blister erosion", "lesion"))
    elif depth < THRESHOLDS["deep"]:
        adj, noun = "Shallow", _pick(rng, ("wound", "ulcer", "ulceration", "lesion"))
    else:
        adj, noun = _pick(rng, ("Deep", "Deep", "Deep, punched-out")), \
            _pick(rng, ("ulcer", "wound", "ulceration", "cavity"))
    mention_depth = rng.random() < 0.85
    head = f"{adj} {noun}" if mention_depth else _pick(rng, ("Wound", "Lesion", "Open wound"))
    if rng.random() < 0.75:
        head = _pick(rng, (f"{head} on the {w.site}", f"{head}, {w.site}", f"{w.site.capitalize()}: {head.lower()}"))
    if rng.random() < 0.3:
        head += f", approx. {w.size_cm:g} x {w.width_cm:g} cm"

    g, f, c, e = a["granulation"], a["fibrin"], a["crust"], a["erythema"]
    clauses: list[tuple[float, str]] = []  # (mention probability, text)
    if g >= 0.6:
        clauses.append((0.9, _pick(rng, ("bright red granulation tissue covering most of the bed",
                                         "beefy red granulation throughout", "well-granulating wound bed",
                                         "healthy granulation tissue over nearly the entire base"))))
    elif g >= 0.4:
        clauses.append((0.85, _pick(rng, ("red granulation tissue over much of the bed",
                                          "good granulation in large parts", "granulating base"))))
    elif g >= THRESHOLDS["granulation"]:
        clauses.append((0.75, _pick(rng, ("partly granulating bed", "some granulation tissue",
                                          "patchy granulation"))))
    else:
        clauses.append((0.45, _pick(rng, ("no visible granulation tissue", "pale pink base without granulation",
                                          "granulation absent", "no granulation"))))
    if f >= 0.55:
        clauses.append((0.95, _pick(rng, ("bed largely covered by yellow fibrin",
                                          "thick adherent slough over most of the base",
                                          "extensive fibrin coating", "predominantly fibrinous wound bed"))))
    elif f >= 0.25:
        clauses.append((0.85, _pick(rng, ("patchy yellow fibrin", "moderate fibrin deposits",
                                          "partly covered with slough", "fibrinous coating in places"))))
    elif f >= THRESHOLDS["fibrin"]:
        clauses.append((0.7, _pick(rng, ("thin yellow fibrin at the edges", "a little fibrin",
                                         "minor slough at the margin", "small fibrin spots"))))
    else:
        clauses.append((0.4, _pick(rng, ("no fibrin", "free of slough", "without fibrin", "clean bed, no slough"))))
    if c >= 0.35:
        clauses.append((0.9, _pick(rng, ("extensive hemorrhagic crusts", "large dark blood crusts",
                                         "partly covered by thick hemorrhagic crust"))))
    elif c >= THRESHOLDS["crust"]:
        clauses.append((0.7, _pick(rng, ("some hemorrhagic crusting", "small dark crusts",
                                         "a few hemorrhagic crusts at the rim"))))
    else:
        clauses.append((0.3, _pick(rng, ("without crusts", "no crusting", "no hemorrhagic crust"))))
    if e >= 0.65:
        clauses.append((0.85, _pick(rng, ("marked surrounding erythema", "strongly inflamed periwound skin",
                                          "pronounced erythema and inflammation around the wound"))))
    elif e >= THRESHOLDS["erythema"]:
        clauses.append((0.7, _pick(rng, ("mild surrounding erythema", "slight periwound redness",
                                         "mildly inflamed margins"))))
    else:
        clauses.append((0.35, _pick(rng, ("no erythema", "no signs of inflammation",
                                          "without surrounding erythema"))))
    border = {
        "hyperkeratotic": ("hyperkeratotic border", "thick hyperkeratotic margins",
                           "hyperkeratotic whitish rim", "edges hyperkeratotic"),
        "fibrotic": ("fibrotic border", "firm fibrotic edges", "fibrotic margins"),
        "scarred": ("scarred border", "surrounding atrophic scar tissue", "scarred wound margins"),
        "regular": ("regular border", "well-defined regular margins", "smooth regular edges"),
    }[w.border]
    clauses.append((0.8 if w.border != "regular" else 0.45, _pick(rng, border)))
    if rng.random() < 0.2:
        clauses.append((1.0, _pick(rng, ("moderate exudate", "painful on dressing change",
                                         "patient reports itching", "dressing changed daily",
                                         f"present for about {w.duration_weeks} weeks"))))
    kept = [text for p, text in clauses if rng.random() < p]
    order = rng.permutation(len(kept))
    kept = [kept[o] for o in order]
    if rng.random() < 0.5 or len(kept) < 2:
        text = ", ".join([head] + kept)
        return text + "."
    sentences = [head] + [k[0].upper() + k[1:] for k in kept]
    return ". ".join(sentences) + "."


# --------------------------------------------------------------------------- rendering
def _noise(rng: np.random.Generator, h: int, w: int, scale: float) -> np.ndarray:
    """Smooth value noise (≈ unit std) with feature size ``scale`` pixels (bicubic upsampling)."""
    scale = max(float(scale), 1.0)
    gh, gw = int(math.ceil(h / scale)) + 3, int(math.ceil(w / scale)) + 3
    grid = rng.standard_normal((gh, gw), dtype=np.float32)
    if scale <= 1.0:
        out = grid[:h, :w]
    else:
        big = Image.fromarray(grid, mode="F").resize((int(gw * scale), int(gh * scale)), Image.BICUBIC)
        oy, ox = int(rng.integers(0, int(scale) + 1)), int(rng.integers(0, int(scale) + 1))
        out = np.asarray(big)[oy:oy + h, ox:ox + w]
    out = out - out.mean()
    return out / (out.std() + 1e-6)


def _fractal(rng: np.random.Generator, h: int, w: int, scale: float, octaves: int = 3) -> np.ndarray:
    total = np.zeros((h, w), np.float32)
    amp, norm = 1.0, 0.0
    for o in range(octaves):
        total += amp * _noise(rng, h, w, scale / 2 ** o)
        norm += amp * amp
        amp *= 0.5
    return total / math.sqrt(norm)


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3 - 2 * x)


@dataclass
class _Geometry:
    cx: float
    cy: float
    r: float          # mean radius along the minor-normalised frame (px)
    elong: float
    angle: float
    harmonics: np.ndarray   # (k, amplitude, phase)
    bound: float      # bounding radius (px)


def _wound_distance(geo: _Geometry, ys: slice, xs: slice, fine: np.ndarray) -> np.ndarray:
    """Normalised radial distance d (wound boundary at d = 1) on a bbox."""
    yy, xx = np.mgrid[ys, xs].astype(np.float32)
    dx, dy = xx - geo.cx, yy - geo.cy
    ca, sa = math.cos(geo.angle), math.sin(geo.angle)
    u = (dx * ca + dy * sa) / math.sqrt(geo.elong)
    v = (-dx * sa + dy * ca) * math.sqrt(geo.elong)
    rho, th = np.hypot(u, v), np.arctan2(v, u)
    radius = np.full_like(rho, geo.r)
    for k, amp, ph in geo.harmonics:
        radius += geo.r * amp * np.cos(k * th + ph)
    return rho / np.maximum(radius, 1.0) + 0.045 * fine[ys, xs]


def _place(rng: np.random.Generator, photo: _Photo, safe: np.ndarray, h: int, w: int
           ) -> tuple[list[_Geometry], float]:
    """Camera scale (px per cm) and non-overlapping wound geometries inside the skin."""
    sizes = np.array([wd.size_cm for wd in photo.wounds])
    widths = np.array([wd.width_cm for wd in photo.wounds])
    area_cm2 = float(np.sum(math.pi / 4 * sizes * widths))
    frac = rng.uniform(0.07, 0.3)
    ppc = math.sqrt(frac * safe.sum() / max(area_cm2, 1e-3))
    ppc = min(ppc, 0.6 * min(h, w) / sizes.max(), 90.0)
    floor = max(10.0 / sizes.min(), 7.0 / max(widths.min(), 0.2), 4.0)  # smallest wound ≥ ~10×7 px
    ppc = max(ppc, floor)
    ys, xs = np.nonzero(safe)
    order = np.argsort(-sizes, kind="stable")
    for _attempt in range(40):
        geos: list[_Geometry | None] = [None] * len(sizes)
        ok = True
        for idx in order:
            major, minor = sizes[idx] * ppc / 2, max(widths[idx], 0.2) * ppc / 2
            elong = max(major / minor, 1.0)
            r = math.sqrt(major * minor)
            ks = np.arange(2, 8)
            amps = rng.normal(0, 0.09, len(ks)) / ks ** 0.7
            harm = np.stack([ks, amps, rng.uniform(0, 2 * math.pi, len(ks))], 1)
            bound = r * (1 + np.abs(amps).sum() + 0.08) * math.sqrt(elong)
            for _try in range(200):
                p = int(rng.integers(len(ys)))
                cy, cx = float(ys[p]), float(xs[p])
                if not (bound < cx < w - bound and bound < cy < h - bound):
                    if bound * 2 < min(h, w) * 0.9:
                        continue
                if all(g is None or math.hypot(cx - g.cx, cy - g.cy) > (bound + g.bound) * 1.05 + 3
                       for g in geos):
                    geos[idx] = _Geometry(cx, cy, r, elong, rng.uniform(0, math.pi), harm, bound)
                    break
            else:
                ok = False
                break
        if ok:
            return [g for g in geos if g is not None], ppc
        ppc = max(ppc * 0.88, 0.8 * floor)
    raise RuntimeError(f"could not place the wounds of {photo.image_id}")


def _add_ruler(rng: np.random.Generator, col: np.ndarray, labels: np.ndarray, ppc: float) -> bool:
    """Lay a paper measuring tape (cm/mm ticks at the photo's true scale) on the scene where it
    covers no wound; return whether one was placed."""
    h, w = labels.shape
    length_cm = float(np.clip(round(rng.uniform(0.3, 0.6) * max(h, w) / ppc), 2, 15))
    lw, lh = int(length_cm * ppc) + 8, int(np.clip(1.2 * ppc, 14, 0.12 * min(h, w)))
    if lw > 0.9 * max(h, w):
        return False
    tape = Image.new("L", (lw, lh), 0)
    ink = Image.new("L", (lw, lh), 0)
    ImageDraw.Draw(tape).rectangle((0, 0, lw - 1, lh - 1), fill=255)
    draw = ImageDraw.Draw(ink)
    step_mm = 1 if ppc >= 25 else 5
    for mm in range(0, int(length_cm * 10) + 1, step_mm):
        x = 4 + mm * ppc / 10
        tick = lh * (0.45 if mm % 10 == 0 else 0.28 if mm % 5 == 0 else 0.16)
        draw.line((x, 0, x, tick), fill=255, width=1)
        if mm % 10 == 0 and 0 < mm < length_cm * 10 and lh >= 16:
            draw.text((x - 3, lh * 0.5), str(mm // 10), fill=255, font=_font(max(8, int(lh * 0.35))))
    angle = float(rng.uniform(0, 180))
    tape_a = np.asarray(tape.rotate(angle, resample=Image.BILINEAR, expand=True), np.float32) / 255
    ink_a = np.asarray(ink.rotate(angle, resample=Image.BILINEAR, expand=True), np.float32) / 255
    th, tw = tape_a.shape
    if th >= h or tw >= w:
        return False
    keep_out = ndimage.binary_dilation(labels > 0, iterations=6)
    for _ in range(30):
        y0, x0 = int(rng.integers(0, h - th)), int(rng.integers(0, w - tw))
        if not np.any(keep_out[y0:y0 + th, x0:x0 + tw] & (tape_a > 0.01)):
            paper = np.array([0.96, 0.95, 0.90], np.float32) * float(col[y0:y0 + th, x0:x0 + tw].mean() / 0.55) ** 0.3
            patch = col[y0:y0 + th, x0:x0 + tw]
            patch[:] = patch * (1 - tape_a[..., None]) + np.clip(paper, 0, 1) * tape_a[..., None]
            patch *= (1 - 0.85 * ink_a[..., None])
            return True
    return False


def _render_photo(rng: np.random.Generator, photo: _Photo, fitz: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """RGB uint8 image, label map, fibrin label map and nuisance parameters of one photo."""
    w, h = _SIZES[int(rng.choice(len(_SIZES), p=[0.25, 0.15, 0.15, 0.1, 0.1, 0.15, 0.1]))]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    # Body part: a band around an axis through the frame; beyond it, a bedsheet.
    axis = rng.uniform(0, math.pi)
    nx, ny = -math.sin(axis), math.cos(axis)
    has_bg = rng.random() < 0.6
    diag = math.hypot(h, w)
    half = diag * (rng.uniform(0.32, 0.55) if has_bg else 2.0)
    offset = rng.uniform(-0.12, 0.12) * diag if has_bg else 0.0
    signed = (xx - w / 2) * nx + (yy - h / 2) * ny - offset
    edge_noise = _fractal(rng, h, w, 60, 2) * 6
    dist = np.abs(signed) + edge_noise
    skin_alpha = np.clip((half - dist) / 2.0, 0, 1)
    skin = skin_alpha > 0.5
    safe = dist < half - 0.04 * diag if has_bg else np.ones((h, w), bool)
    geos, ppc = _place(rng, photo, safe, h, w)

    # Skin colour, texture and RDEB skin changes (scars, pigment, milia).
    tone = _FITZPATRICK_RGB[fitz - 1] * rng.uniform(0.94, 1.06, 3).astype(np.float32)
    col = np.empty((h, w, 3), np.float32)
    col[:] = tone
    low = _fractal(rng, h, w, 90, 2)
    col *= (1 + 0.05 * low)[..., None]
    blotch = np.clip(_fractal(rng, h, w, 40, 2) - 0.8, 0, None)
    col *= (1 - 0.07 * blotch[..., None] * np.array([0.1, 0.9, 0.8], np.float32))
    scar = _smoothstep((_fractal(rng, h, w, 40, 2) - rng.uniform(1.2, 1.9)) * 1.5)
    scar_col = tone * np.array([1.08, 1.0, 1.02], np.float32) + np.float32(0.12)
    col = col * (1 - 0.4 * scar[..., None]) + scar_col * 0.4 * scar[..., None]
    pig = _smoothstep((_fractal(rng, h, w, 14, 2) - 2.0) * 2)
    col *= (1 - 0.2 * pig[..., None] * np.array([0.6, 0.85, 1.0], np.float32))
    fine = _noise(rng, h, w, 1.6)  # one fine field: pores, milia, outline jitter, glints, weave
    pores = fine
    col *= (1 + 0.03 * pores[..., None])
    height = 0.15 * pores + 2.0 * low
    milia = (np.roll(fine, (7, 11), (0, 1)) > 3.3) & (scar > 0.2)
    mil = ndimage.gaussian_filter(milia.astype(np.float32), 0.8) * 3
    col = col * (1 - np.clip(mil, 0, 0.7)[..., None]) + np.float32(0.97) * np.clip(mil, 0, 0.7)[..., None]
    height += 2 * mil

    labels = np.zeros((h, w), np.uint8)
    fibrin_map = np.zeros((h, w), np.uint8)
    wet = np.zeros((h, w), np.float32)
    boxes, dists = [], []
    for n, geo in enumerate(geos, start=1):
        wd = photo.wounds[n - 1]
        reach = geo.bound * (1.6 + 1.2 * wd.attrs["erythema"] + (0.6 if wd.border == "scarred" else 0)) + 6
        ys = slice(max(0, int(geo.cy - reach)), min(h, int(geo.cy + reach) + 1))
        xs = slice(max(0, int(geo.cx - reach)), min(w, int(geo.cx + reach) + 1))
        d = _wound_distance(geo, ys, xs, fine)
        inside = (d < 1) & skin[ys, xs] & (labels[ys, xs] == 0)
        comp, ncomp = ndimage.label(inside)
        if ncomp > 1:  # an outline is one closed region: keep the largest piece
            inside = comp == 1 + int(np.argmax(np.bincount(comp.ravel())[1:]))
        inside = ndimage.binary_fill_holes(inside) & (labels[ys, xs] == 0)
        labels[ys, xs][inside] = n
        boxes.append((ys, xs))
        dists.append(d)

    # Periwound effects first (erythema, then border), only on unwounded skin.
    for n, (geo, (ys, xs), d) in enumerate(zip(geos, boxes, dists), start=1):
        wd = photo.wounds[n - 1]
        bh, bw = d.shape
        free = (labels[ys, xs] == 0) & skin[ys, xs]
        t = np.maximum(d - 1, 0) * geo.r          # px outside the outline (approx.)
        ery = wd.attrs["erythema"]
        we = geo.r * (0.25 + 0.9 * ery) + 3
        halo = ery * np.exp(-2.2 * t / we) * np.clip(0.8 + 0.45 * _noise(rng, bh, bw, max(3, geo.r / 3)), 0, 1.4)
        halo = np.clip(halo, 0, 1) * free
        red = np.array([1.0, 0.58, 0.60], np.float32)
        patch = col[ys, xs]
        patch *= (1 - halo[..., None] * (1 - red))
        tex = _noise(rng, bh, bw, max(1.5, geo.r / 14))
        if wd.border == "hyperkeratotic":
            width = max(2.5, 0.2 * geo.r) * (0.8 + 0.35 * _noise(rng, bh, bw, max(3, geo.r / 4)))
            rim = np.clip(1 - t / np.maximum(width, 1), 0, 1) ** 0.6 * (d >= 0.97)
            rim *= np.clip(0.9 + 0.6 * _noise(rng, bh, bw, max(2, geo.r / 8)), 0, 1) * free
            rim_col = np.array([0.93, 0.89, 0.79], np.float32) * (0.92 + 0.08 * tex[..., None])
            rim_col = rim_col * (0.65 + 0.35 * tone.max() / 0.95)
            patch[:] = patch * (1 - 0.9 * rim[..., None]) + rim_col * 0.9 * rim[..., None]
            height[ys, xs] += 3.0 * rim + 0.8 * rim * tex
        elif wd.border == "fibrotic":
            width = max(2.5, 0.3 * geo.r)
            rim = _smoothstep(1 - t / width) * free
            rim_col = np.array([0.93, 0.79, 0.77], np.float32) * (0.6 + 0.4 * tone.max() / 0.95)
            patch[:] = patch * (1 - 0.7 * rim[..., None]) + rim_col * 0.7 * rim[..., None]
            height[ys, xs] += 2.0 * rim
            wet[ys, xs] += 0.25 * rim
        elif wd.border == "scarred":
            width = max(4.0, 0.8 * geo.r)
            mott = _smoothstep(_noise(rng, bh, bw, max(2.5, geo.r / 5)) + 0.3)
            rim = _smoothstep(1 - t / width) * mott * free
            rim_col = np.array([0.97, 0.87, 0.86], np.float32) * (0.6 + 0.4 * tone.max() / 0.95)
            patch[:] = patch * (1 - 0.75 * rim[..., None]) + rim_col * 0.75 * rim[..., None]
            height[ys, xs] -= 0.8 * rim
            wet[ys, xs] += 0.2 * rim
        else:
            width = max(1.5, 0.08 * geo.r)
            rim = _smoothstep(1 - t / width) * free
            rim_col = np.array([0.95, 0.67, 0.65], np.float32) * (0.6 + 0.4 * tone.max() / 0.95)
            patch[:] = patch * (1 - 0.6 * rim[..., None]) + rim_col * 0.6 * rim[..., None]
        col[ys, xs] = patch

    # Wound beds.
    gran_px = max(1.2, 0.1 * ppc)  # granules ≈ 1 mm
    for n, (geo, (rys, rxs), rd) in enumerate(zip(geos, boxes, dists), start=1):
        wd = photo.wounds[n - 1]
        a = wd.attrs
        # The bed lies within the bounding radius: crop the periwound box to it.
        ys = slice(max(rys.start, int(geo.cy - geo.bound) - 3), min(rys.stop, int(geo.cy + geo.bound) + 4))
        xs = slice(max(rxs.start, int(geo.cx - geo.bound) - 3), min(rxs.stop, int(geo.cx + geo.bound) + 4))
        d = rd[ys.start - rys.start:ys.stop - rys.start, xs.start - rxs.start:xs.stop - rxs.start]
        bh, bw = d.shape
        mine = labels[ys, xs] == n
        npx = int(mine.sum())
        alpha = np.clip(0.5 + (1 - d) * geo.r / 1.2, 0, 1) * (labels[ys, xs] == n) \
            + np.clip(0.5 + (1 - d) * geo.r / 1.2, 0, 1) * (labels[ys, xs] == 0) * 0.5 * (d < 1.03)
        alpha = np.clip(alpha, 0, 1)
        # Crust, then fibrin among the rest, then granulation vs pink epithelial base.
        n_c = _fractal(rng, bh, bw, max(3, geo.r / 2.2), 2) + 0.6 * (d - 0.5)
        crust = np.zeros((bh, bw), np.float32)
        if a["crust"] > 0.005 and npx:
            thr = np.quantile(n_c[mine], 1 - a["crust"])
            crust = expit((n_c - thr) / 0.06).astype(np.float32)
        n_f = _fractal(rng, bh, bw, max(3, geo.r / 2.8), 2) + rng.uniform(0.0, 1.8) * (d - 0.5)
        fib = np.zeros((bh, bw), np.float32)
        free_bed = mine & (crust < 0.5)
        if a["fibrin"] > 0.005 and free_bed.any():
            q = min(a["fibrin"] * npx / max(free_bed.sum(), 1), 1.0)
            thr = np.quantile(n_f[free_bed], 1 - q)
            fib = expit((n_f - thr) / 0.12).astype(np.float32) * (1 - crust)
        n_g = _fractal(rng, bh, bw, max(3, geo.r / 2.5), 2)
        rest = mine & (fib < 0.5) & (crust < 0.5)
        q = min(a["granulation"] * npx / max(int(rest.sum()), 1), 1.0)
        thr = np.quantile(n_g[rest], 1 - q) if rest.any() else 0.0
        gra = expit((n_g - thr) / 0.25).astype(np.float32)
        granules = _fractal(rng, bh, bw, gran_px, 2)
        gran_col = np.array([0.74, 0.13, 0.13], np.float32) * rng.uniform(0.9, 1.1) \
            * (1 + 0.18 * granules[..., None]) + np.array([0.06, 0.03, 0.02], np.float32) * a["granulation"]
        pink_col = np.array([0.90, 0.56, 0.53], np.float32) * (1 + 0.05 * _noise(rng, bh, bw, 4)[..., None])
        ft = _fractal(rng, bh, bw, max(2, geo.r / 6), 2)
        tint = np.clip(0.5 + 0.35 * ft, 0, 1)[..., None]
        fib_col = (np.array([0.89, 0.66, 0.37], np.float32) * (1 - tint)
                   + np.array([0.97, 0.89, 0.68], np.float32) * tint)
        fib_col *= (1 + 0.03 * _noise(rng, bh, bw, 1.5)[..., None])
        cracks = np.abs(_noise(rng, bh, bw, max(2, geo.r / 5))) < 0.12
        ct = _fractal(rng, bh, bw, max(2, geo.r / 6), 2)
        crust_col = (np.array([0.40, 0.14, 0.09], np.float32)
                     + np.array([-0.14, -0.06, -0.04], np.float32) * np.clip(ct, -1, 1)[..., None])
        crust_col *= (1 - 0.45 * cracks[..., None])
        bed = pink_col * (1 - gra[..., None]) + gran_col * gra[..., None]
        bed = bed * (1 - fib[..., None]) + fib_col * fib[..., None]
        bed = bed * (1 - crust[..., None]) + crust_col * crust[..., None]
        # Depth: a bowl with steep walls, darkened at the bottom (ambient occlusion).
        depth_px = 0.5 + a["depth"] * (0.28 * geo.r + 2)
        smooth_d = d - 0.045 * fine[ys, xs]  # the bowl follows the outline, not its pixel jitter
        bowl = np.clip((1 - smooth_d) / 0.35, 0, 1) ** 0.8
        bed *= (1 - 0.3 * a["depth"] * bowl)[..., None]
        patch = col[ys, xs]
        col[ys, xs] = patch * (1 - alpha[..., None]) + bed * alpha[..., None]
        height[ys, xs] += alpha * (-depth_px * bowl + 0.8 * granules * gra * (1 - fib) * (1 - crust)
                                   + 0.8 * fib * _noise(rng, bh, bw, 6) + 2.0 * crust + 1.0 * crust * cracks)
        wet[ys, xs] += alpha * ((1 - crust) * (0.8 - 0.6 * fib))
        fibrin_map[ys, xs][mine & (fib > 0.5)] = n

    # Light: Lambert shading of the height field, gradient, cylinder fall-off, flash glints.
    light_dir = rng.uniform(0, 2 * math.pi)
    lz = rng.uniform(0.75, 0.9)
    lx, ly = math.cos(light_dir) * math.sqrt(1 - lz * lz), math.sin(light_dir) * math.sqrt(1 - lz * lz)
    hs = ndimage.gaussian_filter(height, 0.7)
    gy, gx = np.gradient(hs)
    shade = (-gx * lx - gy * ly + lz) / np.sqrt(gx * gx + gy * gy + 1) / lz
    shade = np.clip(shade, 0.35, 1.45)
    col *= shade[..., None]
    if has_bg:
        cyl = np.sqrt(np.clip(1 - (np.abs(signed) / half) ** 2, 0, 1))
        col *= (0.62 + 0.38 * cyl)[..., None]
    flash = rng.random() < 0.5
    spec_field = np.roll(fine, (h // 3, w // 3), (0, 1))
    glint = np.clip(wet, 0, 1) * (np.clip(shade - 1.02, 0, None) * 2.5
                                   + (spec_field > (2.1 if flash else 2.6)) * 0.7)
    col += np.clip(glint, 0, 1)[..., None] * np.float32(0.9)

    # Background sheet with folds and weave, a soft shadow next to the body.
    if has_bg:
        sheet = _SHEETS[int(rng.integers(len(_SHEETS)))] * rng.uniform(0.85, 1.05)
        folds = _fractal(rng, h, w, 70, 3)
        weave = np.roll(fine, (h // 2, w // 5), (0, 1))
        bg = np.empty((h, w, 3), np.float32)
        bg[:] = sheet
        bg *= (1 + 0.12 * folds + 0.025 * weave)[..., None]
        shadow = np.exp(-np.clip(dist - half, 0, None) / (0.05 * diag))
        bg *= (1 - 0.35 * shadow)[..., None]
        col = col * skin_alpha[..., None] + bg * (1 - skin_alpha[..., None])

    ruler = rng.random() < 0.35 and _add_ruler(rng, col, labels, ppc)

    # Camera: exposure gradient, vignetting, white balance, blur, sensor noise.
    gdir = rng.uniform(0, 2 * math.pi)
    grad = 1 + rng.uniform(0.05, 0.2) * (((xx - w / 2) * math.cos(gdir) + (yy - h / 2) * math.sin(gdir)) / (diag / 2))
    r2 = ((xx - w / 2) ** 2 + (yy - h / 2) ** 2) / (diag / 2) ** 2
    vign = 1 - rng.uniform(0.1, 0.3) * r2
    exposure = rng.uniform(0.88, 1.08) * (1.05 if flash else 1.0)
    wb = np.array([1 + rng.normal(0, 0.05), 1.0, 1 + rng.normal(0, 0.06)], np.float32)
    col *= (grad * vign * exposure)[..., None] * wb
    blur = rng.uniform(0.4, 1.3) if photo.camera != "DSLR" else rng.uniform(0.3, 0.7)
    col = ndimage.gaussian_filter(col, (blur, blur, 0))
    col += np.float32(0.012) * rng.standard_normal(col.shape, dtype=np.float32)
    col = np.clip(col, 0, 1) ** rng.uniform(0.92, 1.06)
    img = (col * 255 + 0.5).astype(np.uint8)
    nuisance = {"width": w, "height": h, "px_per_cm": round(ppc, 3), "flash": int(flash),
                "blur_sigma": round(blur, 3), "wb_red": round(float(wb[0]), 4), "wb_blue": round(float(wb[2]), 4),
                "background": int(has_bg), "ruler": int(ruler), "light_azimuth": round(light_dir, 4)}
    return img, labels, fibrin_map, nuisance


# --------------------------------------------------------------------------- writing
def _maybe(rng: np.random.Generator, value: Any) -> Any:
    """``value`` or '' (missing) at MISSING_RATE."""
    return "" if rng.random() < MISSING_RATE else value


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")


def _save_png(path: Path, array: np.ndarray, mode: str) -> None:
    Image.fromarray(array, mode=mode).save(path, format="PNG", compress_level=1 if mode == "RGB" else 6)


def _sample_triplets(rng: np.random.Generator, n: int, m: int) -> np.ndarray:
    """``m`` distinct (anchor, ref_j, ref_k) with three distinct images and no repeated
    (anchor, {j, k}) pair, uniformly at random."""
    capacity = n * (n - 1) * (n - 2) // 2
    if m > capacity:
        raise ValueError(f"{m} triplets requested but {n} photos allow only {capacity} distinct ones")
    seen: set[tuple[int, int, int]] = set()
    out: list[tuple[int, int, int]] = []
    while len(out) < m:
        i, j, k = (int(x) for x in rng.choice(n, size=3, replace=False))
        key = (i, min(j, k), max(j, k))
        if key not in seen:
            seen.add(key)
            out.append((i, j, k))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def build(out: str | Path, seed: int = 0, photos: int = 53, patients: int = 21, wounds: int = 120,
          triplets: int = 513, progress: bool = False) -> dict[str, Any]:
    """Write a phantom dataset to ``out``; return a summary (counts, agreement, timing)."""
    if not 3 <= photos:
        raise ValueError(f"--photos must be at least 3, got {photos}")
    if not 1 <= patients <= photos:
        raise ValueError(f"--patients must be in [1, photos={photos}], got {patients}")
    if not photos <= wounds <= MAX_WOUNDS_PER_PHOTO * photos or wounds > 255 * photos:
        raise ValueError(f"--wounds must be in [photos={photos}, {MAX_WOUNDS_PER_PHOTO * photos}], got {wounds}")
    capacity = photos * (photos - 1) * (photos - 2) // 2
    if not 0 <= triplets <= capacity:
        raise ValueError(f"--triplets must be in [0, {capacity}] (distinct triplets of {photos} photos), "
                         f"got {triplets}")
    t0 = time.perf_counter()
    out = Path(out)
    rng = np.random.default_rng([seed, 1])
    pats, phs = _sample_population(rng, photos, patients, wounds)
    all_wounds = [w for p in phs for w in p.wounds]
    zw, mean, std = _standardise(_wound_features(all_wounds))
    latent, row = [], 0
    for p in phs:
        latent.append(zw[row:row + len(p.wounds)].mean(axis=0))
        row += len(p.wounds)
    latent_arr = np.array(latent)
    sigma, skip_scale = calibrate_oracle(latent_arr, seed=seed)

    for sub in ("images", "masks", "truth"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    for sub in ("images", "masks", "truth/fibrin"):
        (out / sub).mkdir(parents=True, exist_ok=True)

    meta_rng = np.random.default_rng([seed, 3])
    text_rng = np.random.default_rng([seed, 5])
    wound_rows, truth_wounds, concept_rows, image_rows, truth_images = [], [], [], [], []
    row = 0
    for pi, p in enumerate(tqdm(phs, desc="phantoms", unit="photo", disable=not progress)):
        pat = pats[p.patient]
        img, labels, fib, nuis = _render_photo(np.random.default_rng([seed, 2, pi]), p, pat["fitzpatrick"])
        _save_png(out / "images" / f"{p.image_id}.png", img, "RGB")
        _save_png(out / "masks" / f"{p.image_id}.png", labels, "L")
        _save_png(out / "truth" / "fibrin" / f"{p.image_id}.png", fib, "L")
        areas = np.bincount(labels.ravel(), minlength=len(p.wounds) + 1)
        fib_areas = np.bincount(fib.ravel(), minlength=len(p.wounds) + 1)
        image_rows.append([p.image_id, pat["patient_id"], _maybe(meta_rng, p.region), _maybe(meta_rng, p.camera),
                           _maybe(meta_rng, "flash" if nuis["flash"] else "ambient")])
        truth_images.append([p.image_id, pat["patient_id"], len(p.wounds)]
                            + [f"{v:.6f}" for v in latent_arr[pi]]
                            + [nuis[k] for k in ("width", "height", "px_per_cm", "flash", "blur_sigma", "wb_red",
                                                 "wb_blue", "background", "ruler", "light_azimuth")])
        for wi, wd in enumerate(p.wounds, start=1):
            wound_rows.append([p.image_id, wi, describe(wd, text_rng), _maybe(meta_rng, wd.site),
                               _maybe(meta_rng, wd.size_cm), _maybe(meta_rng, wd.duration_weeks)])
            truth_wounds.append([p.image_id, wi] + [f"{wd.attrs[a]:.4f}" for a in NUMERIC_ATTRIBUTES]
                                + [wd.border, wd.size_cm, wd.width_cm, wd.duration_weeks, wd.site,
                                   int(areas[wi]), int(fib_areas[wi])]
                                + [f"{v:.6f}" for v in zw[row]])
            concept_rows.append([p.image_id, wi] + list(concept_presence(wd.attrs, wd.border).values()))
            row += 1

    _write_csv(out / "wounds.csv", ["image_id", "wound_index", "description", "anatomical_site", "size_cm",
                                    "duration_weeks"], wound_rows)
    _write_csv(out / "images.csv", ["image_id", "patient_id", "body_region", "camera", "lighting"], image_rows)
    _write_csv(out / "patients.csv", ["patient_id", "age", "sex", "fitzpatrick", "rdeb_subtype"],
               [[p["patient_id"], _maybe(meta_rng, p["age"]), _maybe(meta_rng, p["sex"]),
                 _maybe(meta_rng, p["fitzpatrick"]), _maybe(meta_rng, p["subtype"])] for p in pats])

    truth = PhantomTruth([p.image_id for p in phs], latent_arr, sigma, skip_scale, seed, [])
    trip = _sample_triplets(np.random.default_rng([seed, 6]), photos, triplets)
    ans_rng, lat_rng = expert_rng(seed), np.random.default_rng([seed, 8])
    trip_rows, choices = [], []
    for i, j, k in trip:
        choice = truth.answer(int(i), int(j), int(k), ans_rng)
        choices.append(choice)
        p_j = truth.probabilities(int(i), int(j), int(k))[1]  # harder triplets take longer
        latency = int(round(math.exp(8.0 + 0.6 * (1 - abs(2 * p_j - 1)) + 0.35 * lat_rng.standard_normal())))
        trip_rows.append([phs[i].image_id, phs[j].image_id, phs[k].image_id, choice, ANNOTATOR, latency])
    _write_csv(out / "triplets.csv", ["anchor", "ref_j", "ref_k", "choice", "annotator", "latency_ms"], trip_rows)

    _write_csv(out / "truth" / "wounds.csv",
               ["image_id", "wound_index", *NUMERIC_ATTRIBUTES, "border", "size_cm", "width_cm", "duration_weeks",
                "anatomical_site", "area_px", "fibrin_px", *[f"z_{f}" for f in LATENT_FEATURES]], truth_wounds)
    _write_csv(out / "truth" / "images.csv",
               ["image_id", "patient_id", "n_wounds", *[f"z_{f}" for f in LATENT_FEATURES], "width", "height",
                "px_per_cm", "flash", "blur_sigma", "wb_red", "wb_blue", "background", "ruler", "light_azimuth"],
               truth_images)
    _write_csv(out / "truth" / "patients.csv", ["patient_id", "severity", "age", "sex", "fitzpatrick", "rdeb_subtype"],
               [[p["patient_id"], f"{p['severity']:.4f}", p["age"], p["sex"], p["fitzpatrick"], p["subtype"]]
                for p in pats])
    _write_csv(out / "truth" / "concepts.csv", ["image_id", "wound_index", *CONCEPTS], concept_rows)

    answered = np.array([c != "skip" for c in choices], bool)
    agree = None
    if answered.any():
        D = truth.distance_matrix()
        t = trip[answered]
        chose_j = np.array([c == "j" for c in choices])[answered]
        dj, dk = D[t[:, 0], t[:, 1]], D[t[:, 0], t[:, 2]]
        agree = float(np.mean(np.where(chose_j, dj < dk, dk < dj)))
    oracle = {
        "synthetic": True,
        "model": "P(skip) = min(skip_scale * exp(-(delta/sigma)^2 / 2), 0.5); P(j | answered) = Phi(delta / sigma); "
                 "delta = d(i,k) - d(i,j), Euclidean distance of the photos' latent vectors (truth/images.csv z_*)",
        "answer_stream": f"numpy default_rng([seed, {_ANSWER_STREAM}]); per triplet in triplets.csv order: "
                         "one uniform for skip, one for the choice",
        "sigma": sigma, "skip_scale": skip_scale, "seed": seed,
        "target_agreement": TARGET_AGREEMENT, "target_skip": TARGET_SKIP,
        "expected_agreement": truth.expected_agreement(), "sample_agreement": agree,
        "sample_skip_rate": float(1 - answered.mean()) if len(choices) else None,
        "latent_features": list(LATENT_FEATURES), "latent_weights": list(LATENT_WEIGHTS),
        "feature_mean": mean.tolist(), "feature_std": std.tolist(),
        "concepts": list(CONCEPTS), "concept_thresholds": THRESHOLDS,
        "fibrin_masks": "truth/fibrin/<image_id>.png: wound index where planted fibrin is visible, 0 elsewhere",
    }
    (out / "truth" / "oracle.json").write_text(json.dumps(oracle, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (out / "dataset.json").write_text(json.dumps({
        "name": DATASET_NAME, "synthetic": True, "seed": seed, "generator": "core.phantoms",
        "counts": {"images": photos, "patients": patients, "wounds": wounds, "triplets": triplets},
    }, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return {"out": str(out), "synthetic": True, "seed": seed, "images": photos, "patients": patients,
            "wounds": wounds, "triplets": triplets, "skips": int((~answered).sum()),
            "truth_agreement": agree, "sigma": sigma, "seconds": round(time.perf_counter() - t0, 2)}


# --------------------------------------------------------------------------- montage
def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType sizing
        return ImageFont.load_default()


def montage(dataset_dir: str | Path, n: int = 12, cols: int = 4, tile: tuple[int, int] = (320, 240),
            outlines: bool = True) -> Image.Image:
    """Grid of ``n`` phantoms spread evenly over the dataset (thin wound outlines optional),
    captioned SYNTHETIC."""
    root = Path(dataset_dir)
    every = sorted((root / "images").glob("*.png"))
    if not every:
        raise FileNotFoundError(f"no images in {root / 'images'}")
    paths = [every[int(i)] for i in np.unique(np.linspace(0, len(every) - 1, min(n, len(every))).round())]
    rows = math.ceil(len(paths) / cols)
    tw, th = tile
    pad, top = 6, 44
    sheet = Image.new("RGB", (cols * (tw + pad) + pad, top + rows * (th + pad) + pad), (250, 250, 250))
    draw = ImageDraw.Draw(sheet)
    draw.text((pad + 2, 10), "SYNTHETIC wound phantoms - procedurally rendered RDEB-like wounds "
              "(TriDerm Studio demo data, not patients)", fill=(150, 20, 20), font=_font(17))
    for idx, path in enumerate(paths):
        img = Image.open(path).convert("RGB")
        if outlines and (root / "masks" / path.name).is_file():
            lab = np.asarray(Image.open(root / "masks" / path.name))
            edge = (lab > 0) & (ndimage.grey_erosion(lab, size=3) != lab)
            arr = np.asarray(img).copy()
            arr[edge] = (arr[edge] * 0.45 + np.array([0, 230, 255]) * 0.55).astype(np.uint8)
            img = Image.fromarray(arr)
        img.thumbnail((tw, th), Image.LANCZOS)
        x = pad + (idx % cols) * (tw + pad) + (tw - img.width) // 2
        y = top + (idx // cols) * (th + pad) + (th - img.height) // 2
        sheet.paste(img, (x, y))
        label = f"{path.stem}  SYNTHETIC"
        draw.rectangle((x, y, x + 8 * len(label) + 6, y + 16), fill=(0, 0, 0))
        draw.text((x + 3, y + 1), label, fill=(255, 255, 255), font=_font(12))
    return sheet


# --------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.phantoms",
        description="Build the SYNTHETIC wound-phantom demo dataset (dataset-folder layout with latent truth/).")
    parser.add_argument("--out", required=True, type=Path, help="dataset folder to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--photos", type=int, default=53)
    parser.add_argument("--patients", type=int, default=21)
    parser.add_argument("--wounds", type=int, default=120)
    parser.add_argument("--triplets", type=int, default=513)
    parser.add_argument("--montage", type=Path, default=None, help="also write a 12-phantom montage PNG here")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} exists and is not a folder")
    if args.out.is_dir() and any(args.out.iterdir()):
        meta = args.out / "dataset.json"
        try:
            synthetic = json.loads(meta.read_text(encoding="utf-8")).get("synthetic") is True
        except (OSError, ValueError):
            synthetic = False
        if not synthetic:
            parser.error(f"--out {args.out} is a non-empty folder that is not a phantom dataset; refusing to overwrite")
    try:
        summary = build(args.out, args.seed, args.photos, args.patients, args.wounds, args.triplets,
                        progress=sys.stderr.isatty())
    except ValueError as exc:
        parser.error(str(exc))
    if args.montage is not None:
        args.montage.parent.mkdir(parents=True, exist_ok=True)
        sheet = montage(args.out).quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.FLOYDSTEINBERG)
        sheet.save(args.montage, format="PNG", optimize=True)  # a 256-colour palette keeps the docs file small
        summary["montage"] = str(args.montage)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
