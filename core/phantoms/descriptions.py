"""Clinical free-text descriptions of phantom wounds, and the reading of them (synthetic).

One phrase table drives both directions: :func:`describe` writes a wound's description from its
attributes (graded wording, omissions, negations; symptoms and history that no photo shows:
pain, itch, bleeding, duration), and :func:`read_description` recovers what a text states —
a level per mentioned attribute, NaN for what it leaves out. The phantom text oracle
(:class:`DescriptionReader`) sees nothing but these texts.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from core.phantoms.world import BLEEDING, LATENT_FEATURES, LATENT_WEIGHTS, THRESHOLDS, Wound

# attribute → graded levels (lower bound, level value read back, mention probability, phrases)
_LEVELS: dict[str, tuple[tuple[float, float, float, tuple[str, ...]], ...]] = {
    "granulation": (
        (0.6, 0.7, 0.9, ("bright red granulation tissue covering most of the bed", "beefy red granulation throughout",
                         "well-granulating wound bed", "healthy granulation tissue over nearly the entire base")),
        (0.4, 0.5, 0.85, ("red granulation tissue over much of the bed", "good granulation in large parts",
                          "granulating base")),
        (THRESHOLDS["granulation"], 0.3, 0.75, ("partly granulating bed", "some granulation tissue",
                                               "patchy granulation")),
        (-math.inf, 0.08, 0.45, ("no visible granulation tissue", "pale pink base without granulation",
                                 "granulation absent", "no granulation")),
    ),
    "fibrin": (
        (0.55, 0.65, 0.95, ("bed largely covered by yellow fibrin", "thick adherent slough over most of the base",
                            "extensive fibrin coating", "predominantly fibrinous wound bed")),
        (0.25, 0.4, 0.85, ("patchy yellow fibrin", "moderate fibrin deposits", "partly covered with slough",
                           "fibrinous coating in places")),
        (THRESHOLDS["fibrin"], 0.15, 0.7, ("thin yellow fibrin at the edges", "a little fibrin",
                                           "minor slough at the margin", "small fibrin spots")),
        (-math.inf, 0.02, 0.4, ("no fibrin", "free of slough", "without fibrin", "clean bed, no slough")),
    ),
    "crust": (
        (0.35, 0.45, 0.9, ("extensive hemorrhagic crusts", "large dark blood crusts",
                           "partly covered by thick hemorrhagic crust")),
        (THRESHOLDS["crust"], 0.18, 0.7, ("some hemorrhagic crusting", "small dark crusts",
                                          "a few hemorrhagic crusts at the rim")),
        (-math.inf, 0.02, 0.3, ("without crusts", "no crusting", "no hemorrhagic crust")),
    ),
    "erythema": (
        (0.65, 0.75, 0.85, ("marked surrounding erythema", "strongly inflamed periwound skin",
                            "pronounced erythema and inflammation around the wound")),
        (THRESHOLDS["erythema"], 0.5, 0.7, ("mild surrounding erythema", "slight periwound redness",
                                            "mildly inflamed margins")),
        (-math.inf, 0.2, 0.35, ("no erythema", "no signs of inflammation", "without surrounding erythema")),
    ),
    "nodule": (
        (0.05, 0.15, 0.6, ("raised nodular area in the bed, biopsy advised", "exophytic nodule, suspicious for SCC",
                           "firm heaped-up nodule within the wound")),
        (-math.inf, 0.0, 0.25, ("no nodules", "no suspicious nodular tissue")),
    ),
    "bleeding": (
        (2, 2.0, 0.9, ("bleeds at most dressing changes", "frequent bleeding reported", "recurrent bleeding")),
        (1, 1.0, 0.9, ("occasional bleeding", "bled a few times", "bleeds now and then")),
        (-math.inf, 0.0, 0.9, ("no bleeding reported", "no history of bleeding", "does not bleed")),
    ),
}

_BORDERS = {
    "hyperkeratotic": ("hyperkeratotic border", "thick hyperkeratotic margins", "hyperkeratotic whitish rim",
                       "edges hyperkeratotic"),
    "fibrotic": ("fibrotic border", "firm fibrotic edges", "fibrotic margins"),
    "scarred": ("scarred border", "surrounding atrophic scar tissue", "scarred wound margins"),
    "regular": ("regular border", "well-defined regular margins", "smooth regular edges"),
}

_DEPTH = (("superficial", 0.2), ("shallow", 0.45), ("deep", 0.75))  # head adjective → depth read back

# Told, not shown: numeric templates (mention probability, phrasings); {n} is the value.
_PAIN = (0.9, ("pain {n}/10 on dressing change", "painful, NRS {n}/10", "reports pain {n}/10"))
_ITCH = (0.85, ("itch {n}/10", "pruritus rated {n}/10", "itching {n}/10 at night"))
_DURATION = (0.85, ("present for about {n} weeks", "open for {n} weeks", "duration {n} weeks"))
_NUMBERS = {"pain": r"(?:pain|nrs) (\d+)/10", "itch": r"(?:itch|pruritus rated|itching) (\d+)/10",
            "duration_weeks": r"(?:present for about|open for|duration) (\d+) weeks",
            "size_cm": r"approx\. (\d+(?:\.\d+)?) x"}
_FILLERS = ("moderate exudate", "dressing changed daily", "non-adherent dressing in place", "photographed at follow-up")


def _pick(rng: np.random.Generator, options: tuple[str, ...] | list[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _level(name: str, value: float) -> tuple[float, float, float, tuple[str, ...]]:
    return next(lv for lv in _LEVELS[name] if value >= lv[0])


def describe(w: Wound, rng: np.random.Generator) -> str:
    """Clinical free text for one wound (varied wording, omissions and negations; positive
    mentions only for what is present); pain, itch, bleeding and duration are told here only."""
    depth = w.attrs["depth"]
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

    values = {**w.attrs, "nodule": w.nodule, "bleeding": BLEEDING.index(w.bleeding)}
    clauses: list[tuple[float, str]] = []  # (mention probability, text)
    for name in _LEVELS:
        _, _, p, phrases = _level(name, values[name])
        clauses.append((p, _pick(rng, phrases)))
    clauses.append((0.8 if w.border != "regular" else 0.45, _pick(rng, _BORDERS[w.border])))
    clauses.append((_PAIN[0], "painless" if w.pain == 0 else _pick(rng, _PAIN[1]).format(n=w.pain)))
    clauses.append((_ITCH[0], _pick(rng, _ITCH[1]).format(n=w.itch)))
    clauses.append((_DURATION[0], _pick(rng, _DURATION[1]).format(n=w.duration_weeks)))
    if rng.random() < 0.2:
        clauses.append((1.0, _pick(rng, _FILLERS)))
    kept = [text for p, text in clauses if rng.random() < p]
    order = rng.permutation(len(kept))
    kept = [kept[o] for o in order]
    if rng.random() < 0.5 or len(kept) < 2:
        return ", ".join([head] + kept) + "."
    sentences = [head] + [k[0].upper() + k[1:] for k in kept]
    return ". ".join(sentences) + "."


_PHRASES = sorted(
    [(ph.lower(), name, value) for name, levels in _LEVELS.items() for _, value, _, phrases in levels for ph in phrases]
    + [(ph.lower(), "border", b) for b, phrases in _BORDERS.items() for ph in phrases]
    + [("painless", "pain", 0.0)],
    key=lambda t: -len(t[0]))


def read_description(text: str) -> dict[str, float]:
    """What one wound's description states, in the units of :data:`LATENT_FEATURES`
    (``wound_features``); NaN for what it leaves out. Reads the text only."""
    low = " ".join(text.lower().split())
    out = dict.fromkeys(LATENT_FEATURES, math.nan)
    for name, pattern in _NUMBERS.items():
        m = re.search(pattern, low)
        if m:
            value = float(m.group(1))
            if name == "duration_weeks":
                out["log_duration"] = math.log(max(value, 1.0))
            elif name == "size_cm":
                out["log_size"] = math.log(max(value, 0.1))
            else:
                out[name] = value
            low = low[:m.start()] + " " * (m.end() - m.start()) + low[m.end():]
    for phrase, name, level in _PHRASES:
        at = low.find(phrase)
        if at < 0:
            continue
        low = low[:at] + " " * len(phrase) + low[at + len(phrase):]
        if name == "border":
            for b in ("hyperkeratotic", "fibrotic", "scarred"):
                out[f"border_{b}"] = float(level == b)
        elif math.isnan(out[name]):
            out[name] = float(level)
    for word, value in _DEPTH:
        if re.search(rf"\b{word}\b", low):
            out["depth"] = value
            break
    return out


def photo_text(descriptions: list[str]) -> str:
    """A photo's text as the prompts give it: its wounds' descriptions, numbered "Wound n: …"."""
    return "\n".join(f"Wound {n}: {t}" for n, t in enumerate(descriptions, start=1))


def split_photo_text(text: str) -> list[str]:
    """The wound descriptions of a photo's text ("Wound 1: …" lines, as the prompts number them)."""
    parts = [p.strip() for p in re.split(r"(?im)^\s*wound \d+:\s*", text) if p.strip()]
    return parts or [text]


@dataclass(frozen=True)
class DescriptionReader:
    """The phantom text oracle's reading: a photo's text → a latent vector from its
    descriptions alone (each stated value standardised with ``mean``/``std`` and weighted as
    the expert weighs it; unstated values at the mean; mean over the photo's wounds)."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, descriptions: list[str]) -> "DescriptionReader":
        """Standardisation from a corpus of descriptions (NaN-aware; texts only)."""
        raw = np.array([[read_description(t)[f] for f in LATENT_FEATURES] for t in descriptions]).reshape(
            -1, len(LATENT_FEATURES))
        stated = ~np.isnan(raw)
        count = np.maximum(stated.sum(axis=0), 1)
        mean = np.where(stated, raw, 0.0).sum(axis=0) / count
        std = np.sqrt(np.where(stated, (raw - mean) ** 2, 0.0).sum(axis=0) / count)
        return cls(mean, np.where(std > 1e-9, std, 1.0))

    def wound_vector(self, description: str) -> np.ndarray:
        """The standardised latent vector read from one wound's description."""
        read = read_description(description)
        raw = np.array([read[f] for f in LATENT_FEATURES])
        z = np.where(np.isnan(raw), 0.0, (raw - self.mean) / self.std)
        return z * np.asarray(LATENT_WEIGHTS)

    def photo_vector(self, text: str) -> np.ndarray:
        """The mean latent vector of a photo's wound descriptions."""
        return np.mean([self.wound_vector(t) for t in split_photo_text(text)], axis=0)
