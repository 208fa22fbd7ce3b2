"""The phantom world: patients, photos and wounds with latent clinical attributes (synthetic)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import expit

NUMERIC_ATTRIBUTES = ("granulation", "fibrin", "depth", "erythema", "crust")


# Told, never shown: symptoms and history that only the descriptions carry (not rendered).
DESCRIBED_ATTRIBUTES = ("pain", "itch", "bleeding", "duration_weeks")


BLEEDING = ("none", "occasional", "frequent")


# In-wound distractors: rendered, never part of the expert's truth, never described.
DISTRACTORS = ("dressing", "glare", "marker")


DISTRACTOR_RATE = {"dressing": 0.4, "glare": 0.4, "marker": 0.3}


BORDERS = ("regular", "hyperkeratotic", "fibrotic", "scarred")


# Latent vector of a wound: standardised attributes, each with an expert weight. The first
# VISIBLE_FEATURES are what a photo shows (``nodule`` is the small, clinically decisive region: a
# raised nodule suspicious for squamous cell carcinoma); the rest only the descriptions tell.
VISIBLE_FEATURES = (
    "granulation", "fibrin", "depth", "erythema", "crust",
    "border_hyperkeratotic", "border_fibrotic", "border_scarred", "log_size", "nodule",
)


DESCRIBED_FEATURES = ("pain", "itch", "bleeding", "log_duration")


LATENT_FEATURES = VISIBLE_FEATURES + DESCRIBED_FEATURES


LATENT_WEIGHTS = (0.8, 0.8, 0.8, 0.6, 0.6, 0.5, 0.5, 0.5, 0.4, 1.6, 1.2, 1.0, 1.0, 0.9)


NODULE_RATE = 0.25


CONCEPTS = (
    "granulation", "fibrin", "crust", "erythema", "hyperkeratotic_border",
    "fibrotic_border", "scarring", "deep", "superficial",
)


# Presence thresholds shared by truth/concepts.csv and the description generator.
THRESHOLDS = {"granulation": 0.2, "fibrin": 0.08, "crust": 0.08, "erythema": 0.35,
              "deep": 0.6, "superficial": 0.3}


MISSING_RATE = 0.07


MAX_WOUNDS_PER_PHOTO = 16


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


SIZES = ((512, 384), (544, 408), (480, 360), (576, 384), (512, 340), (384, 512), (408, 544))


# --------------------------------------------------------------------------- latent model
@dataclass
class Wound:
    """A phantom wound: latent attributes, border, size, site and what the patient tells."""

    attrs: dict[str, float]          # granulation, fibrin, depth, erythema, crust in [0, 1]
    border: str
    size_cm: float                   # longest diameter
    width_cm: float
    duration_weeks: int
    site: str
    nodule: float = 0.0              # share of the wound bed taken by the decisive nodule (0 = none)
    pain: int = 0                    # 0–10 numeric rating scale (told, not shown)
    itch: int = 0                    # 0–10 (told, not shown)
    bleeding: str = "none"           # BLEEDING: bleeding history (told, not shown)
    distractors: tuple[str, ...] = ()  # DISTRACTORS drawn over the wound (shown, ignored by the expert)


@dataclass
class Photo:
    """A phantom photo: id, patient, body region and side, camera and its wounds."""

    image_id: str
    patient: int
    region: str
    side: str
    camera: str
    wounds: list[Wound] = field(default_factory=list)


def counts_per_photo(rng: np.random.Generator, photos: int, wounds: int) -> np.ndarray:
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


def sample_population(rng: np.random.Generator, n_photos: int, n_patients: int, n_wounds: int
                       ) -> tuple[list[dict[str, Any]], list[Photo]]:
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
            "told_effect": rng.normal(0.0, 1.0, size=3),
        })
    owner = np.concatenate([np.arange(n_patients), rng.choice(
        n_patients, size=n_photos - n_patients, p=rng.dirichlet(np.full(n_patients, 1.5)))])
    rng.shuffle(owner)
    counts = counts_per_photo(rng, n_photos, n_wounds)
    base = np.array([1.4, -1.3, -0.6, -0.3, -2.0])
    load = np.array([-0.5, 0.7, 0.6, 0.4, 0.4])
    chron_load = np.array([-0.4, 0.5, 0.3, -0.2, 0.0])
    regions = list(_REGIONS)
    photos: list[Photo] = []
    for i in range(n_photos):
        pat = patients[int(owner[i])]
        n = int(counts[i])
        region = "back" if n >= 12 else regions[int(rng.integers(len(regions)))]
        sided, subsites, site_eff, hk_bonus = _REGIONS[region]
        side = ("left" if rng.random() < 0.5 else "right") if sided else ""
        photo = Photo(f"ph{i + 1:03d}", int(owner[i]), region, side,
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
            wound = Wound(
                attrs={"granulation": float(g), "fibrin": f, "depth": float(dep),
                       "erythema": float(ery), "crust": cr},
                border=border, size_cm=round(size, 1), width_cm=round(size * rng.uniform(0.45, 0.95), 1),
                duration_weeks=int(np.clip(round(math.exp(1.6 + 0.9 * chronic)), 1, 300)),
                site=f"{side} {sub}".strip())
            _told_and_planted(rng, wound, pat)
            photo.wounds.append(wound)
        photos.append(photo)
    return patients, photos


def _told_and_planted(rng: np.random.Generator, w: Wound, patient: dict[str, Any]) -> None:
    """Draw the decisive nodule, the described-only symptoms and history, and the distractors.

    Symptoms depend on a patient effect and weakly on the visible bed, so the descriptions
    add information that no photo holds; distractors are independent of everything."""
    s, told = patient["severity"], patient["told_effect"]
    w.nodule = float(rng.uniform(0.1, 0.2)) if rng.random() < NODULE_RATE * (1 + 0.3 * s) else 0.0
    w.pain = int(np.clip(round(4 + 1.5 * told[0] + 2 * w.attrs["depth"] - 1 + 1.6 * rng.standard_normal()), 0, 10))
    w.itch = int(np.clip(round(3.5 + 1.5 * told[1] + 2 * w.attrs["granulation"] + 1.8 * rng.standard_normal()), 0, 10))
    b = 0.8 * told[2] + 1.5 * w.attrs["crust"] + 0.8 * rng.standard_normal()
    w.bleeding = BLEEDING[int(np.digitize(b, (-0.3, 0.8)))]
    w.distractors = tuple(d for d in DISTRACTORS if rng.random() < DISTRACTOR_RATE[d])


def wound_features(wounds: list[Wound]) -> np.ndarray:
    """Raw (unstandardised) latent features, one row per wound, columns LATENT_FEATURES.

    Distractors are not among them: the expert ignores them."""
    return np.array([[w.attrs[a] for a in NUMERIC_ATTRIBUTES]
                     + [float(w.border == b) for b in BORDERS[1:]] + [math.log(w.size_cm), w.nodule]
                     + [w.pain, w.itch, BLEEDING.index(w.bleeding), math.log(w.duration_weeks)]
                     for w in wounds], dtype=np.float64)


def visible_columns() -> np.ndarray:
    """Boolean mask over LATENT_FEATURES: True where a photo shows the feature."""
    return np.array([f in VISIBLE_FEATURES for f in LATENT_FEATURES])


def standardise(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standardised, weighted latent features with the mean and std used."""
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

