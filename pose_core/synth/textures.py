"""Procedural, feature-rich, non-repeating textures for the synthetic scene.

A texture is multi-scale value noise (luminance and colour) under a few thousand random
anti-aliased shapes (discs, ellipses, rectangles, triangles, strokes) whose sizes are drawn
log-uniformly in metres, so corners exist at every viewing distance and nothing tiles or aliases
into a periodic pattern. Everything is deterministic given the numpy `Generator`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import cv2
import numpy as np
from numpy.typing import NDArray

__all__ = ["TextureOptions", "make_texture"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TextureOptions:
    """Knobs of the procedural texture generator."""

    # Wavelengths of the luminance noise octaves, metres (coarse to fine).
    noise_wavelengths_m: tuple[float, ...] = (0.8, 0.3, 0.12, 0.05, 0.02, 0.008)
    # Standard deviation of each octave, as a fraction of full scale (same order as the wavelengths).
    noise_amplitudes: tuple[float, ...] = (0.10, 0.08, 0.07, 0.06, 0.05, 0.04)
    # Wavelength of the slow colour drift, metres, and its amplitude per channel (fraction of full scale).
    colour_wavelength_m: float = 0.5
    colour_amplitude: float = 0.06
    # Random shapes per square metre of surface.
    shapes_per_m2: float = 220.0
    # Shape size range (diameter or side), metres; sizes are log-uniform in this range.
    shape_size_range_m: tuple[float, float] = (0.012, 0.25)
    # Fraction of shapes drawn as outlines or strokes instead of filled areas.
    outline_fraction: float = 0.35
    # Shape colour = base colour times a log-uniform brightness factor in this range ...
    shape_brightness_range: tuple[float, float] = (0.25, 2.2)
    # ... mixed with a uniformly random colour by a weight drawn in [0, this].
    shape_colour_mix_max: float = 0.6


def make_texture(
    shape_px: tuple[int, int],
    texel_m: float,
    base_rgb: tuple[float, float, float],
    rng: np.random.Generator,
    opts: TextureOptions,
) -> NDArray[np.uint8]:
    """Make one texture image.

    Args:
        shape_px: `(rows, columns)` of the texture.
        texel_m: size of one texel on the surface, metres.
        base_rgb: mean colour, each channel in [0, 1].
        rng: random source; the same state gives the same texture.
        opts: generator knobs.

    Returns:
        RGB texture, `(height_px, width_px, 3)` uint8.

    Raises:
        ValueError: if a side is smaller than 2 texels or the octave lists differ in length.
    """
    height_px, width_px = shape_px
    if height_px < 2 or width_px < 2:
        raise ValueError(f"texture must be at least 2x2 texels, got {height_px}x{width_px}")
    if len(opts.noise_wavelengths_m) != len(opts.noise_amplitudes):
        raise ValueError("noise_wavelengths_m and noise_amplitudes must have the same length")
    img = np.empty((height_px, width_px, 3), np.float32)
    img[:] = np.asarray(base_rgb, np.float32)
    luminance = np.zeros((height_px, width_px), np.float32)
    for wavelength, amplitude in zip(opts.noise_wavelengths_m, opts.noise_amplitudes, strict=True):
        luminance += amplitude * _value_noise(height_px, width_px, wavelength / texel_m, 1, rng)[..., 0]
    img += luminance[..., None]
    img += opts.colour_amplitude * _value_noise(
        height_px, width_px, opts.colour_wavelength_m / texel_m, 3, rng
    )
    canvas = np.clip(img * 255.0, 0.0, 255.0).astype(np.uint8)
    _draw_shapes(canvas, texel_m, base_rgb, rng, opts)
    return canvas


def _value_noise(
    height_px: int, width_px: int, wavelength_px: float, channels: int, rng: np.random.Generator
) -> np.ndarray:
    """Smooth zero-mean unit-variance-ish noise with the given wavelength, `(H, W, channels)` float32."""
    rows = max(2, int(np.ceil(height_px / wavelength_px)) + 2)
    cols = max(2, int(np.ceil(width_px / wavelength_px)) + 2)
    grid = rng.standard_normal((rows, cols, channels)).astype(np.float32)
    if wavelength_px <= 1.0:
        return cv2.resize(grid, (width_px, height_px), interpolation=cv2.INTER_NEAREST).reshape(
            height_px, width_px, channels
        )
    # Sample the coarse grid at a random sub-cell offset so octaves do not share lattice lines.
    map_x = (np.arange(width_px, dtype=np.float32) / wavelength_px + rng.uniform(0.0, 1.0)).astype(np.float32)
    map_y = (np.arange(height_px, dtype=np.float32) / wavelength_px + rng.uniform(0.0, 1.0)).astype(
        np.float32
    )
    mx, my = np.meshgrid(map_x, map_y)
    out = cv2.remap(grid, mx, my, interpolation=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT)
    return out.reshape(height_px, width_px, channels)


def _draw_shapes(
    canvas: NDArray[np.uint8],
    texel_m: float,
    base_rgb: tuple[float, float, float],
    rng: np.random.Generator,
    opts: TextureOptions,
) -> None:
    """Draw `shapes_per_m2` random anti-aliased shapes per square metre onto `canvas` in place."""
    height_px, width_px = canvas.shape[:2]
    count = int(round(opts.shapes_per_m2 * height_px * width_px * texel_m**2))
    lo, hi = opts.shape_size_range_m
    sizes_px = np.exp(rng.uniform(np.log(lo), np.log(hi), count)) / texel_m
    centres = rng.uniform((0.0, 0.0), (width_px, height_px), (count, 2))
    kinds = rng.integers(0, 5, count)
    outlines = rng.uniform(size=count) < opts.outline_fraction
    log_lo, log_hi = np.log(opts.shape_brightness_range)
    brightness = np.exp(rng.uniform(log_lo, log_hi, (count, 1)))
    mix = rng.uniform(0.0, opts.shape_colour_mix_max, (count, 1))
    colours = np.clip(
        (1.0 - mix) * brightness * np.asarray(base_rgb) * 255.0 + mix * rng.uniform(0.0, 255.0, (count, 3)),
        0,
        255,
    )
    angles = rng.uniform(0.0, 180.0, count)
    for size, centre, kind, outline, colour, angle in zip(
        sizes_px, centres, kinds, outlines, colours, angles, strict=True
    ):
        half = max(1.0, size / 2.0)
        thickness = max(1, int(round(half * rng.uniform(0.08, 0.25)))) if outline else cv2.FILLED
        col = tuple(float(c) for c in colour)
        c = (int(centre[0]), int(centre[1]))
        if kind == 0:
            cv2.circle(canvas, c, int(half), col, thickness, cv2.LINE_AA)
        elif kind == 1:
            axes = (int(half), max(1, int(half * rng.uniform(0.3, 0.9))))
            cv2.ellipse(canvas, c, axes, float(angle), 0.0, 360.0, col, thickness, cv2.LINE_AA)
        elif kind in (2, 3):
            n_corners = 4 if kind == 2 else 3
            theta = np.deg2rad(angle) + np.sort(rng.uniform(0.0, 2.0 * np.pi, n_corners))
            radius = half * rng.uniform(0.6, 1.0, n_corners)
            pts = np.stack([centre[0] + radius * np.cos(theta), centre[1] + radius * np.sin(theta)], axis=1)
            poly = [pts.round().astype(np.int32)]
            if thickness == cv2.FILLED:
                cv2.fillPoly(canvas, poly, col, cv2.LINE_AA)
            else:
                cv2.polylines(canvas, poly, True, col, thickness, cv2.LINE_AA)
        else:
            direction = np.array([np.cos(np.deg2rad(angle)), np.sin(np.deg2rad(angle))]) * half
            p0 = tuple(int(v) for v in centre - direction)
            p1 = tuple(int(v) for v in centre + direction)
            cv2.line(canvas, p0, p1, col, max(1, int(round(half * 0.12))), cv2.LINE_AA)
