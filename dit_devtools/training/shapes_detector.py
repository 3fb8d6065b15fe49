"""A simple detector for pictures of coloured shapes: does the picture show what the caption asks for?

Each pixel gets the nearest palette colour (or none when no palette colour is near); the background is
the commonest colour of the border; blobs are the connected regions of one colour of at least 1% of the
picture. A blob's shape is told from how much of its bounding box it fills (circle pi/4 = 0.79, square
1.0, triangle 0.5) and its aspect ratio.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from .shapes_dataset import COLOURS, PALETTE, SHAPES

MAX_COLOUR_DISTANCE = 90.0  # RGB distance (0..255 scale) beyond which a pixel has no palette colour
MIN_BLOB_FRACTION = 0.01


@dataclasses.dataclass(frozen=True)
class Blob:
    colour: str
    area: int
    box: tuple[int, int, int, int]  # top, left, bottom, right (exclusive)
    centre: tuple[float, float]  # row, col

    @property
    def fill(self) -> float:
        """Area over bounding-box area."""
        top, left, bottom, right = self.box
        return self.area / max(1, (bottom - top) * (right - left))

    @property
    def aspect(self) -> float:
        top, left, bottom, right = self.box
        return (right - left) / max(1, bottom - top)

    @property
    def shape(self) -> str:
        """circle, square or triangle by fill ratio; "blob" when it fits none (or is far from round)."""
        if not 0.6 <= self.aspect <= 1.65:
            return "blob"
        if self.fill >= 0.9:
            return "square"
        if self.fill >= 0.68:
            return "circle"
        if 0.38 <= self.fill <= 0.62:
            return "triangle"
        return "blob"


@dataclasses.dataclass(frozen=True)
class Detection:
    background: str
    blobs: tuple[Blob, ...]

    def of_colour(self, colour: str) -> list[Blob]:
        return [b for b in self.blobs if b.colour == colour]


def colour_labels(image: np.ndarray) -> np.ndarray:
    """Index into COLOURS of the nearest palette colour per pixel, -1 where none is near ([H,W] int)."""
    rgb = np.asarray(image, dtype=np.float32)
    if rgb.max() <= 1.0:
        rgb = rgb * 255.0
    palette = np.asarray([PALETTE[c] for c in COLOURS], dtype=np.float32)
    dist = np.linalg.norm(rgb[:, :, None, :] - palette[None, None], axis=-1)
    labels = dist.argmin(axis=-1)
    labels[dist.min(axis=-1) > MAX_COLOUR_DISTANCE] = -1
    return labels


def detect(image: np.ndarray) -> Detection:
    """Background colour and blobs of an RGB image ([H,W,3], 0..1 floats or 0..255)."""
    from scipy import ndimage

    labels = colour_labels(image)
    h, w = labels.shape
    border = np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])
    border = border[border >= 0]
    background = COLOURS[int(np.bincount(border, minlength=len(COLOURS)).argmax())] if border.size else "none"
    blobs = []
    for index, colour in enumerate(COLOURS):
        if colour == background:
            continue
        regions, count = ndimage.label(labels == index)
        for region, box in enumerate(ndimage.find_objects(regions), start=1):
            mask = regions[box] == region
            area = int(mask.sum())
            if area < MIN_BLOB_FRACTION * h * w:
                continue
            rows, cols = np.nonzero(mask)
            blobs.append(
                Blob(
                    colour,
                    area,
                    (box[0].start, box[1].start, box[0].stop, box[1].stop),
                    (float(rows.mean() + box[0].start), float(cols.mean() + box[1].start)),
                )
            )
    return Detection(background, tuple(sorted(blobs, key=lambda b: -b.area)))


@dataclasses.dataclass(frozen=True)
class Request:
    """What a caption of the grammar asks for: [(colour, shape), ...] and the background (or None)."""

    shapes: tuple[tuple[str, str], ...]
    background: str | None


_ITEM = re.compile(rf"(a|an|two) ({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})s?")


def parse_caption(caption: str) -> Request:
    """Parse a caption of the grammar in ``shapes_dataset``."""
    body, _, background = caption.partition(" on ")
    shapes: list[tuple[str, str]] = []
    for part in body.split(" and "):
        match = _ITEM.fullmatch(part.strip())
        if match is None:
            raise ValueError(f"not a caption of the shapes grammar: {caption!r}")
        count = 2 if match.group(1) == "two" else 1
        shapes += [(match.group(2), match.group(3))] * count
    bg = re.fullmatch(rf"an? ({'|'.join(COLOURS)}) background", background.strip()) if background else None
    if background and bg is None:
        raise ValueError(f"not a caption of the shapes grammar: {caption!r}")
    return Request(tuple(shapes), bg.group(1) if bg else None)


@dataclasses.dataclass(frozen=True)
class Verdict:
    background_ok: bool
    colours_ok: bool  # a blob of each asked colour (as many as asked)
    shapes_ok: bool  # ... and each has the asked shape

    @property
    def ok(self) -> bool:
        return self.background_ok and self.colours_ok and self.shapes_ok


def judge(image: np.ndarray, caption: str) -> Verdict:
    """Whether ``image`` shows what ``caption`` asks for."""
    request = parse_caption(caption)
    found = detect(image)
    background_ok = request.background is None or found.background == request.background
    colours_ok = shapes_ok = True
    for colour in {c for c, _ in request.shapes}:
        wanted = sorted(s for c, s in request.shapes if c == colour)
        blobs = found.of_colour(colour)
        if len(blobs) != len(wanted):
            colours_ok = shapes_ok = False
            continue
        if sorted(b.shape for b in blobs) != wanted:
            shapes_ok = False
    return Verdict(background_ok, colours_ok, shapes_ok)
