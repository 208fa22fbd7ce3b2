"""Wound concept vocabulary, description tagger (with negation) and text aspects.

The vocabulary lives in the editable data file ``core/concepts/concept_vocab.json``: curated
RDEB/wound concepts (group ``wound``), SkinCon's 22 and Derm7pt's 7 (METHODS.md §4).
Each concept has tagger ``terms`` and ``positive``/``negative`` zero-shot prompts.

The tagger turns a free-text wound description into concept labels — +1 mentioned,
−1 negated ("no fibrin", "without crusts", "fibrin absent"), absent from the result when
not mentioned. These are the labels for concept-annotation AUROC and the concept aspect
text of MAKE (Yan et al., 2025, §2.1); ``sub_captions`` is MAKE's sentence decomposition.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

VOCAB_PATH = Path(__file__).with_name("concept_vocab.json")
GROUPS = ("wound", "skincon", "derm7pt")

# Negation cues (NegEx-style). Pre-cues negate concept terms that follow them in the same
# clause; post-cues negate the term right before them.
_PRE_CUES = (
    "no evidence of", "no signs of", "no sign of", "absence of", "free of", "lack of",
    "lacking", "without", "negative for", "neither", "nor", "not", "no", "none of", "never",
)
_POST_CUES = ("absent", "not seen", "not present", "not visible", "not observed", "none", "resolved", "free")
# Words that close a negation scope (a new clause starts).
_TERMINATORS = ("but", "however", "although", "though", "yet", "whereas", "while", "except", "with", "and has", "and shows")
_CLAUSE_SPLIT = re.compile(r"[.;!?\n]+")
_MAX_LIST_WORDS = 3  # a comma continues a negated list only while items stay this short
# A comma-separated item holding one of these words states a finding: it leaves the negation scope.
_OR = re.compile(r"\b(or|nor)\b", re.IGNORECASE)
_AFFIRM = re.compile(r"\b(present|seen|visible|noted|shows?|showing|covers?|covering|has|have)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Concept:
    """One vocabulary entry."""

    name: str
    label: str
    group: str
    terms: tuple[str, ...]
    positive: tuple[str, ...]
    negative: tuple[str, ...]


def _validate_entry(entry: Mapping, i: int, path: Path) -> Concept:
    for field in ("name", "label", "group", "terms", "positive", "negative"):
        if field not in entry:
            raise ValueError(f"{path}: concept #{i} lacks the field {field!r}")
    if entry["group"] not in GROUPS:
        raise ValueError(f"{path}: concept {entry['name']!r} has group {entry['group']!r}; expected one of {GROUPS}")
    for field in ("terms", "positive", "negative"):
        vals = entry[field]
        if not isinstance(vals, list) or not vals or not all(isinstance(v, str) and v.strip() for v in vals):
            raise ValueError(f"{path}: concept {entry['name']!r} field {field!r} must be a non-empty list of strings")
    return Concept(
        name=str(entry["name"]),
        label=str(entry["label"]),
        group=str(entry["group"]),
        terms=tuple(t.lower() for t in entry["terms"]),
        positive=tuple(entry["positive"]),
        negative=tuple(entry["negative"]),
    )


def load_vocab(path: str | Path | None = None, groups: Iterable[str] = ("wound",)) -> list[Concept]:
    """Concepts of the chosen ``groups`` from the vocabulary file (default: the packaged one)."""
    path = Path(path) if path is not None else VOCAB_PATH
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read concept vocabulary {path}: {exc}") from exc
    groups = tuple(groups)
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown concept group(s) {sorted(unknown)}; expected some of {GROUPS}")
    concepts = [_validate_entry(e, i, path) for i, e in enumerate(data.get("concepts", []))]
    names = [c.name for c in concepts]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"{path}: duplicate concept names {sorted(dup)}")
    return [c for c in concepts if c.group in groups]


def _term_pattern(term: str) -> str:
    return r"(?<![\w-])" + r"[\s-]+".join(re.escape(w) for w in re.split(r"[\s-]+", term)) + r"(?![\w-])"


class ConceptTagger:
    """Find which vocabulary concepts a description mentions, and whether negated.

    >>> tagger = ConceptTagger(load_vocab())
    >>> tagger.tag("Granulating wound bed, no fibrin or crust.")
    {'granulation': 1, 'fibrin': -1, 'crust': -1}
    """

    def __init__(self, concepts: Sequence[Concept]) -> None:
        if not concepts:
            raise ValueError("ConceptTagger needs at least one concept")
        self.concepts = list(concepts)
        # Longest terms first so "hyperkeratotic border" wins over "hyperkeratotic".
        pairs = sorted(((t, c.name) for c in concepts for t in c.terms), key=lambda p: -len(p[0]))
        self._term_to_name: dict[str, str] = {}
        for t, n in pairs:
            self._term_to_name.setdefault(t, n)
        self._terms = re.compile("|".join(f"({_term_pattern(t)})" for t, _ in pairs), re.IGNORECASE)
        self._pair_terms = [t for t, _ in pairs]
        cue_alt = "|".join(_term_pattern(c) for c in sorted(_PRE_CUES, key=len, reverse=True))
        self._pre = re.compile(cue_alt, re.IGNORECASE)
        post_alt = "|".join(_term_pattern(c) for c in sorted(_POST_CUES, key=len, reverse=True))
        self._post = re.compile(r"^[\s,:]*(?:is|are|was|were)?\s*(?:" + post_alt + ")", re.IGNORECASE)
        term_alt = "|".join(_term_pattern(t) for t in _TERMINATORS)
        self._term_split = re.compile(term_alt, re.IGNORECASE)

    def _negated(self, clause: str, start: int, end: int) -> bool:
        if self._post.match(clause[end:]):
            return True
        before = clause[:start]
        cues = list(self._pre.finditer(before))
        if not cues:
            return False
        between = before[cues[-1].end():]
        if "," not in between:
            return True
        # A comma ends the scope unless the term continues a list of short negated items.
        # A comma ends the scope unless the term sits in a short "or"-list ("no fibrin, slough or crust").
        next_comma = clause.find(",", end)
        own_end = next_comma if next_comma >= 0 else len(clause)
        own = between.rsplit(",", 1)[1] + clause[start:own_end]
        items = between.split(",")[1:-1] + [own]
        following = clause[own_end + 1:].split(",", 1)[0] if next_comma >= 0 else ""
        is_or_list = bool(_OR.search(between + clause[start:own_end] + "," + following))
        return is_or_list and not _AFFIRM.search(own) and all(len(i.split()) <= _MAX_LIST_WORDS for i in items)

    def mentions(self, description: str) -> list[tuple[str, int, int, int]]:
        """Every concept term found: (name, start, end, ±1) with character offsets into
        ``description`` and −1 when negated."""
        out = []
        text = description or ""
        for sent in re.finditer(r"[^.;!?\n]+", text):
            s0, sentence = sent.start(), sent.group()
            bounds = [0, *(b for m in self._term_split.finditer(sentence) for b in (m.start(), m.end())), len(sentence)]
            for c0, c1 in zip(bounds[::2], bounds[1::2]):
                clause = sentence[c0:c1]
                for m in self._terms.finditer(clause):
                    idx = next(i for i, g in enumerate(m.groups()) if g is not None)
                    name = self._term_to_name[self._pair_terms[idx]]
                    value = -1 if self._negated(clause, m.start(), m.end()) else 1
                    out.append((name, s0 + c0 + m.start(), s0 + c0 + m.end(), value))
        return out

    def tag(self, description: str) -> dict[str, int]:
        """Concept name → +1 (mentioned) or −1 (negated); a concept both affirmed and
        negated somewhere counts as mentioned (+1)."""
        out: dict[str, int] = {}
        for name, _, _, value in self.mentions(description):
            out[name] = max(out.get(name, -1), value)
        return out

    def labels(self, descriptions: Sequence[str]) -> tuple[list[str], list[list[int]]]:
        """Label matrix rows = descriptions, columns = concept names: 1, 0 (negated) or −1 (unknown)."""
        names = [c.name for c in self.concepts]
        rows = []
        for d in descriptions:
            tags = self.tag(d)
            rows.append([1 if tags.get(n) == 1 else 0 if tags.get(n) == -1 else -1 for n in names])
        return names, rows

    def concept_aspect(self, description: str) -> str:
        """MAKE's concept-aspect text: the concepts present, from the vocabulary labels."""
        labels = {c.name: c.label for c in self.concepts}
        present = [labels[n] for n, v in self.tag(description).items() if v == 1]
        return "wound showing " + ", ".join(present) if present else "wound without notable concepts"


def sub_captions(description: str, max_k: int = 8, min_words: int = 2) -> list[str]:
    """MAKE sentence decomposition: split a description into clauses (sentences, ';' and
    ',' separated parts) of at least ``min_words`` words, keeping at most ``max_k``."""
    parts = [p.strip() for p in re.split(r"[.;!?\n]+|,\s+", description or "")]
    return [p for p in parts if len(p.split()) >= min_words][:max_k]


def disease_aspect(metadata: Mapping[str, object], keys: Sequence[str]) -> str:
    """MAKE's disease-aspect text built from metadata columns (e.g. wound type, diagnosis)."""
    vals = [f"{k.replace('_', ' ')}: {metadata[k]}" for k in keys if metadata.get(k) not in (None, "")]
    return "; ".join(vals) if vals else "skin wound"
