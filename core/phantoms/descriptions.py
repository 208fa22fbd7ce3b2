"""Clinical free-text descriptions generated from a phantom wound's attributes.
"""
from __future__ import annotations

import numpy as np

from core.phantoms.world import THRESHOLDS, Wound


# --------------------------------------------------------------------------- descriptions
def _pick(rng: np.random.Generator, options: tuple[str, ...] | list[str]) -> str:
    return options[int(rng.integers(len(options)))]


def describe(w: Wound, rng: np.random.Generator) -> str:
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

