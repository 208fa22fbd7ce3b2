"""Procedural rendering of phantom photos and their wound label maps."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from scipy import ndimage
from scipy.special import expit

from core.phantoms.world import DISTRACTORS, SIZES, Photo

_FITZPATRICK_RGB = np.array([
    (0.95, 0.80, 0.71), (0.90, 0.72, 0.61), (0.81, 0.60, 0.47),
    (0.66, 0.46, 0.33), (0.47, 0.31, 0.21), (0.31, 0.20, 0.14)], dtype=np.float32)


_SHEETS = np.array([
    (0.72, 0.80, 0.88), (0.90, 0.90, 0.88), (0.42, 0.60, 0.55),
    (0.80, 0.82, 0.84), (0.55, 0.70, 0.82)], dtype=np.float32)


# --------------------------------------------------------------------------- rendering
def _noise(rng: np.random.Generator, h: int, w: int, scale: float) -> np.ndarray:
    """Smooth value noise (≈ unit std) with feature size ``scale`` pixels (bicubic upsampling)."""
    scale = max(float(scale), 1.0)
    gh, gw = int(math.ceil(h / scale)) + 3, int(math.ceil(w / scale)) + 3
    grid = rng.standard_normal((gh, gw), dtype=np.float32)
    if scale <= 1.0:
        out = grid[:h, :w]
    else:
        big = Image.fromarray(grid, mode="F").resize((int(gw * scale), int(gh * scale)), Image.Resampling.BICUBIC)
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


def _place(rng: np.random.Generator, photo: Photo, safe: np.ndarray, h: int, w: int
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
                if not (bound < cx < w - bound and bound < cy < h - bound) and bound * 2 < min(h, w) * 0.9:
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
            draw.text((x - 3, lh * 0.5), str(mm // 10), fill=255, font=font(max(8, int(lh * 0.35))))
    angle = float(rng.uniform(0, 180))
    tape_a = np.asarray(tape.rotate(angle, resample=Image.Resampling.BILINEAR, expand=True), np.float32) / 255
    ink_a = np.asarray(ink.rotate(angle, resample=Image.Resampling.BILINEAR, expand=True), np.float32) / 255
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


def render_photo(rng: np.random.Generator, photo: Photo, fitz: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """RGB uint8 image, label map, fibrin label map, planted-region map and nuisance parameters.

    The planted-region map holds, per pixel, 0, a nodule (1) or a distractor (2 + its index in
    DISTRACTORS); the wounds' described-only attributes (pain, itch, bleeding, duration) are never
    read here, so no photo shows them."""
    w, h = SIZES[int(rng.choice(len(SIZES), p=[0.25, 0.15, 0.15, 0.1, 0.1, 0.15, 0.1]))]
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
            widths = max(2.5, 0.2 * geo.r) * (0.8 + 0.35 * _noise(rng, bh, bw, max(3, geo.r / 4)))
            rim = np.clip(1 - t / np.maximum(widths, 1), 0, 1) ** 0.6 * (d >= 0.97)
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

    nodule_map = _nodules(rng, photo, geos, labels, col, height, wet)
    distractor_map = _dressings_and_markers(rng, photo, geos, labels, col, height, wet, nodule_map)

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
    _glare(rng, photo, geos, labels, col, distractor_map, nodule_map)

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
    planted = np.where(nodule_map, np.uint8(1), distractor_map).astype(np.uint8)
    return img, labels, fibrin_map, planted, nuisance


def _wound_box(geo: _Geometry, labels: np.ndarray, pad: float) -> tuple[slice, slice]:
    h, w = labels.shape
    reach = geo.bound * pad + 4
    return (slice(max(0, int(geo.cy - reach)), min(h, int(geo.cy + reach) + 1)),
            slice(max(0, int(geo.cx - reach)), min(w, int(geo.cx + reach) + 1)))


def _nodules(rng: np.random.Generator, photo: Photo, geos: list[_Geometry], labels: np.ndarray,
             col: np.ndarray, height: np.ndarray, wet: np.ndarray) -> np.ndarray:
    """Raise the clinically decisive nodule (pearly, lobulated, glossy) inside each wound that has one,
    taking its ``nodule`` share of the bed; return the boolean map of nodule pixels."""
    out = np.zeros(labels.shape, bool)
    for n, (geo, wd) in enumerate(zip(geos, photo.wounds), start=1):
        if wd.nodule <= 0:
            continue
        ys, xs = _wound_box(geo, labels, 1.0)
        mine = labels[ys, xs] == n
        inner = ndimage.distance_transform_edt(mine)
        if not mine.any():
            continue
        r = math.sqrt(wd.nodule * mine.sum() / math.pi)
        cand = np.argwhere(inner >= min(r * 0.8, inner.max()))
        cy, cx = cand[int(rng.integers(len(cand)))]
        bh, bw = mine.shape
        yy, xx = np.mgrid[0:bh, 0:bw].astype(np.float32)
        lobes = _noise(rng, bh, bw, max(1.5, r / 2.5))
        d = np.hypot(yy - cy, xx - cx) / max(r, 1.0) + 0.12 * lobes
        blob = _smoothstep((1.0 - d) / 0.25) * mine
        tone = np.array([0.96, 0.80, 0.78], np.float32) * (1 + 0.06 * lobes[..., None])
        patch = col[ys, xs]
        patch[:] = patch * (1 - blob[..., None]) + tone * blob[..., None]
        height[ys, xs] += 4.0 * blob + 0.8 * blob * lobes
        wet[ys, xs] += 0.6 * blob
        out[ys, xs] |= blob > 0.5
    return out


def _dressings_and_markers(rng: np.random.Generator, photo: Photo, geos: list[_Geometry], labels: np.ndarray,
                           col: np.ndarray, height: np.ndarray, wet: np.ndarray, nodules: np.ndarray) -> np.ndarray:
    """Lay a dressing edge (a meshed, cream band over part of the bed and the skin next to it) and
    draw a tattoo-like marker-ink mark across the wounds that have them, never over a nodule;
    return a uint8 map (2 + DISTRACTORS index where one lies, 0 elsewhere)."""
    out = np.zeros(labels.shape, np.uint8)
    for n, (geo, wd) in enumerate(zip(geos, photo.wounds), start=1):
        ys, xs = _wound_box(geo, labels, 1.3)
        mine = labels[ys, xs] == n
        if not mine.any():
            continue
        bh, bw = mine.shape
        yy, xx = np.mgrid[ys, xs].astype(np.float32)
        clear = ~ndimage.binary_dilation(nodules[ys, xs], iterations=3)
        if "dressing" in wd.distractors:
            theta = rng.uniform(0, 2 * math.pi)
            proj = (xx - geo.cx) * math.cos(theta) + (yy - geo.cy) * math.sin(theta)
            thr = np.quantile(proj[mine], 1 - rng.uniform(0.25, 0.45))
            band = _smoothstep((proj - thr) / 1.5) * clear
            period = max(3.0, geo.r / 8)
            mesh = ((np.mod(xx + yy, period) < 1.0) | (np.mod(xx - yy, period) < 1.0)).astype(np.float32)
            gauze = np.array([0.94, 0.93, 0.86], np.float32) * (1 - 0.12 * mesh[..., None])
            shadow = np.exp(-np.clip(thr - proj, 0, None) / 2.5) * (1 - band)
            patch = col[ys, xs]
            patch *= (1 - 0.35 * shadow)[..., None]
            patch[:] = patch * (1 - band[..., None]) + gauze * band[..., None]
            height[ys, xs] = height[ys, xs] * (1 - band) + 1.5 * band
            wet[ys, xs] *= (1 - band)
            out[ys, xs][band > 0.5] = 2 + DISTRACTORS.index("dressing")
        if "marker" in wd.distractors:
            ink = Image.new("L", (bw, bh), 0)
            draw = ImageDraw.Draw(ink)
            width = max(2, int(round(0.1 * geo.r)))
            cy, cx = geo.cy - ys.start, geo.cx - xs.start
            for _stroke in range(int(rng.integers(2, 4))):
                a = rng.uniform(0, math.pi)
                off = rng.uniform(-0.4, 0.4) * geo.r
                dx, dy = math.cos(a) * geo.r * 1.1, math.sin(a) * geo.r * 1.1
                ox, oy = -math.sin(a) * off, math.cos(a) * off
                draw.line((cx + ox - dx, cy + oy - dy, cx + ox + dx, cy + oy + dy), fill=255, width=width)
            mark = ndimage.gaussian_filter(np.asarray(ink, np.float32) / 255, 0.6) * 0.85 * clear
            dye = np.array([0.28, 0.2, 0.52], np.float32)
            patch = col[ys, xs]
            patch[:] = patch * (1 - mark[..., None]) + dye * patch.mean() * 1.3 * mark[..., None]
            out[ys, xs][mark > 0.4] = 2 + DISTRACTORS.index("marker")
    return out


def _glare(rng: np.random.Generator, photo: Photo, geos: list[_Geometry], labels: np.ndarray,
           col: np.ndarray, planted: np.ndarray, nodules: np.ndarray) -> None:
    """A blown-out specular highlight over part of each wound that has one, off its nodule (after
    the lighting)."""
    for n, (geo, wd) in enumerate(zip(geos, photo.wounds), start=1):
        if "glare" not in wd.distractors:
            continue
        ys, xs = _wound_box(geo, labels, 1.0)
        mine = labels[ys, xs] == n
        if not mine.any():
            continue
        pts = np.argwhere(mine)
        cy, cx = pts[int(rng.integers(len(pts)))]
        bh, bw = mine.shape
        yy, xx = np.mgrid[0:bh, 0:bw].astype(np.float32)
        clear = ~ndimage.binary_dilation(nodules[ys, xs], iterations=3)
        r = geo.r * rng.uniform(0.3, 0.45)
        a = rng.uniform(0, math.pi)
        u = ((xx - cx) * math.cos(a) + (yy - cy) * math.sin(a)) / (1.6 * r)
        v = (-(xx - cx) * math.sin(a) + (yy - cy) * math.cos(a)) / (0.7 * r)
        spot = np.exp(-2.0 * (u * u + v * v) ** 1.5) * clear
        col[ys, xs] += np.float32(1.1) * spot[..., None]
        planted[ys, xs][(spot > 0.5) & (planted[ys, xs] == 0)] = 2 + DISTRACTORS.index("glare")


def font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's default font at ``size`` (unsized where Pillow cannot size it)."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType sizing
        return ImageFont.load_default()
