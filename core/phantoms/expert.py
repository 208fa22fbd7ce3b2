"""The simulated expert: a calibrated noisy oracle on the photos' latent truth, and its reload."""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from scipy.spatial.distance import cdist
from scipy.special import ndtr

from core.phantoms.descriptions import DescriptionReader
from core.phantoms.world import LATENT_FEATURES

ANNOTATOR = "phantom-expert"


TARGET_AGREEMENT = 0.85


TARGET_SKIP = 0.05


ANSWER_STREAM = 7  # default_rng([seed, 7]) answers triplets.csv in file order


CEILINGS = ("vision", "text", "fusion", "expert")


# --------------------------------------------------------------------------- expert oracle
def _margins(latent: np.ndarray, triplets: np.ndarray) -> np.ndarray:
    """Δ = d(i,k) − d(i,j) in latent space for rows (i, j, k)."""
    i, j, k = triplets.T
    return (np.linalg.norm(latent[i] - latent[k], axis=1) - np.linalg.norm(latent[i] - latent[j], axis=1))


def _skip_probability(delta: np.ndarray, sigma: float, skip_scale: float) -> np.ndarray:
    return np.minimum(skip_scale * np.exp(-0.5 * (delta / sigma) ** 2), 0.5)


EXACT_AGREEMENT_MAX = 150  # photos; all_triplets(n) holds n³ indices while it enumerates
AGREEMENT_SAMPLE = 1_000_000


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
        return distances(self.latent)

    def ceilings(self) -> dict[str, Any]:
        """truth/ceilings.json: the planted ceiling of each modality and of the fusion."""
        if self.root is None:
            raise ValueError("this PhantomTruth was not loaded from a folder; no ceilings")
        return load_ceilings(self.root)

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

    def expected_agreement(self, triplets: np.ndarray | None = None, D: np.ndarray | None = None) -> float:
        """Expected agreement with the expert's non-skip answers (over the noise) of the perfect
        embedding, or of the distance matrix ``D`` (ties count half); by default over all triplets,
        or, above ``EXACT_AGREEMENT_MAX`` photos (memory grows as n³), over ``AGREEMENT_SAMPLE``
        seeded uniform triplets."""
        if triplets is None:
            n = len(self.image_ids)
            triplets = (all_triplets(n) if n <= EXACT_AGREEMENT_MAX
                        else uniform_triplets(np.random.default_rng([self.seed, 12]), n, AGREEMENT_SAMPLE))
        triplets = np.asarray(triplets)
        delta = _margins(self.latent, triplets)
        keep = 1.0 - _skip_probability(np.abs(delta), self.sigma, self.skip_scale)
        p_j = ndtr(delta / self.sigma)
        if D is None:
            agree = np.maximum(p_j, 1 - p_j)
        else:
            i, j, k = triplets.T
            says_j = np.sign(D[i, k] - D[i, j])
            agree = np.where(says_j > 0, p_j, np.where(says_j < 0, 1 - p_j, 0.5))
        return float((keep * agree).sum() / keep.sum())


def distances(latent: np.ndarray) -> np.ndarray:
    """Euclidean distance matrix of the rows of ``latent``."""
    return cdist(latent, latent)


def uniform_triplets(rng: np.random.Generator, n: int, m: int) -> np.ndarray:
    """``m`` uniform (anchor, j, k) of three distinct photos, drawn with replacement (vectorised)."""
    a = rng.integers(0, n, m)
    j = (a + rng.integers(1, n, m)) % n
    k = (a + rng.integers(1, n - 1, m)) % n  # n − 2 offsets; the one landing on j moves to offset n − 1
    k = np.where(k == j, (a + n - 1) % n, k)
    return np.stack([a, j, k], axis=1)


def all_triplets(n: int) -> np.ndarray:
    """Every (anchor, j, k) with j < k, all distinct."""
    a, j, k = np.meshgrid(np.arange(n), np.arange(n), np.arange(n), indexing="ij")
    keep = (j < k) & (a != j) & (a != k)
    return np.stack([a[keep], j[keep], k[keep]], axis=1)


def balanced_agreement(D: np.ndarray, triplets: np.ndarray, choices: list[str]) -> float:
    """Balanced (anchor) agreement of ``D`` with answered triplets (skips dropped, ties wrong):
    the tables' metric (``core.eval.metrics.agreement``), restated here because phantoms import no
    other part of core."""
    t = np.asarray(triplets).reshape(-1, 3)
    answered = np.array([c in ("j", "k") for c in choices], bool)
    if not answered.any():
        return math.nan
    t, chose_j = t[answered], np.array([c == "j" for c in choices])[answered]
    dj, dk = D[t[:, 0], t[:, 1]], D[t[:, 0], t[:, 2]]
    correct = np.where(chose_j, dj < dk, dk < dj).astype(float)
    anchors = np.unique(t[:, 0])
    return float(np.mean([correct[t[:, 0] == a].mean() for a in anchors]))


def load_ceilings(truth_dir: str | Path) -> dict[str, Any]:
    """The planted ceilings (truth/ceilings.json) of a phantom dataset folder or its truth/."""
    return json.loads((truth_root(truth_dir) / "ceilings.json").read_text(encoding="utf-8"))


@dataclass
class TextOracle:
    """The phantom text oracle's parameters (truth/oracle.json ``text_oracle``): how it reads a
    description and its answer noise. Nothing here describes any particular wound."""

    reader: DescriptionReader
    sigma: float
    skip_scale: float

    def __post_init__(self) -> None:
        self._vectors: dict[str, np.ndarray] = {}

    def vector(self, text: str) -> np.ndarray:
        """A photo text's vector as the oracle reads it (memoised per text)."""
        if text not in self._vectors:
            self._vectors[text] = self.reader.photo_vector(text)
        return self._vectors[text]

    def probabilities(self, anchor_text: str, j_text: str, k_text: str) -> tuple[float, float]:
        """(P(skip), P(choose j | not skipped)) from the three photos' description texts alone."""
        a, j, k = (self.vector(t) for t in (anchor_text, j_text, k_text))
        delta = float(np.linalg.norm(a - k) - np.linalg.norm(a - j))
        return (float(_skip_probability(np.array([delta]), self.sigma, self.skip_scale)[0]),
                float(ndtr(delta / self.sigma)))


def truth_root(truth_dir: str | Path) -> Path:
    """``DIR/truth`` when it exists, else DIR itself."""
    root = Path(truth_dir)
    return root / "truth" if (root / "truth").is_dir() else root


def read_oracle(truth_dir: str | Path) -> tuple[Path, dict]:
    """(path, content) of ``oracle.json`` in the truth folder of ``truth_dir``."""
    path = truth_root(truth_dir) / "oracle.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: not a phantom truth folder")
    return path, json.loads(path.read_text(encoding="utf-8"))


def load_text_oracle(truth_dir: str | Path) -> TextOracle:
    """The text oracle of a phantom dataset: reads only ``oracle.json``'s ``text_oracle`` block."""
    path, oracle = read_oracle(truth_dir)
    block = oracle.get("text_oracle")
    if block is None:
        raise FileNotFoundError(f"{path} has no text_oracle block (a phantom v1 dataset: rebuild it)")
    return TextOracle(DescriptionReader(np.array(block["mean"]), np.array(block["std"])),
                      float(block["sigma"]), float(block["skip_scale"]))


def expert_rng(seed: int) -> np.random.Generator:
    """The random stream that answered triplets.csv (in file order) for ``seed``."""
    return np.random.default_rng([seed, ANSWER_STREAM])


def load_truth(truth_dir: str | Path) -> PhantomTruth:
    """Load ``DIR/truth`` (or DIR itself) written by :func:`core.phantoms.dataset.build`."""
    oracle_path, oracle = read_oracle(truth_dir)
    root = oracle_path.parent
    with open(root / "images.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    latent = np.array([[float(r[f"z_{f}"]) for f in LATENT_FEATURES] for r in rows], dtype=np.float64)
    with open(root / "wounds.csv", newline="", encoding="utf-8") as fh:
        wounds = list(csv.DictReader(fh))
    return PhantomTruth([r["image_id"] for r in rows], latent, float(oracle["sigma"]),
                        float(oracle["skip_scale"]), int(oracle["seed"]), wounds, root)


def sample_triplets(rng: np.random.Generator, n: int, m: int) -> np.ndarray:
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

