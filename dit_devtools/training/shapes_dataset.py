"""Procedural scenes of coloured shapes with captions from a small grammar (the data of ``tiny-flux-shapes``).

A scene is one or two shapes (circle, square, triangle) in palette colours on a plain palette-coloured
background, drawn anti-aliased (supersampled coverage) at any size. Its caption says what is drawn:
"a red circle on a blue background", "two yellow squares", "a green triangle and an orange circle on a
white background". Scenes are a pure function of (seed, index), so every machine draws the same data.
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib

import numpy as np

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 35),
    "green": (35, 170, 60),
    "blue": (35, 70, 225),
    "yellow": (245, 220, 35),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
    "purple": (140, 55, 185),
    "orange": (250, 135, 25),
}
COLOURS: tuple[str, ...] = tuple(PALETTE)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
COLOUR_JITTER = 12  # +- per channel, so that the model sees a little variety around each palette colour
SUPERSAMPLE = 4  # coverage is measured on a 4x4 grid per pixel (anti-aliasing)


@dataclasses.dataclass(frozen=True)
class Shape:
    """One shape: kind, colour name, centre and half-extent, as fractions of the image side."""

    kind: str
    colour: str
    cx: float
    cy: float
    half: float


@dataclasses.dataclass(frozen=True)
class Scene:
    """What one picture shows and how its caption says it."""

    shapes: tuple[Shape, ...]
    background: str
    background_named: bool  # whether the caption names the background colour

    @property
    def caption(self) -> str:
        return caption_of(self)


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def caption_of(scene: Scene) -> str:
    """The grammar: ``<shapes> [on a <colour> background]`` where ``<shapes>`` is "a red circle",
    "two red circles" or "a red circle and a blue square"."""
    shapes = scene.shapes
    if len(shapes) == 2 and (shapes[0].kind, shapes[0].colour) == (shapes[1].kind, shapes[1].colour):
        text = f"two {shapes[0].colour} {shapes[0].kind}s"
    else:
        text = " and ".join(f"{_article(s.colour)} {s.colour} {s.kind}" for s in shapes)
    if scene.background_named:
        text += f" on {_article(scene.background)} {scene.background} background"
    return text


def single_shape_triples() -> list[tuple[str, str, str]]:
    """Every (shape colour, shape, background colour) of a one-shape scene (colours differ)."""
    return [(c, s, b) for c, s, b in itertools.product(COLOURS, SHAPES, COLOURS) if c != b]


def is_held_out(colour: str, shape: str, background: str) -> bool:
    """About one in eight one-shape combinations never appears in training (evaluation prompts).

    "a red circle on a blue background" (the README's prompt) is always a training combination."""
    if (colour, shape, background) == ("red", "circle", "blue"):
        return False
    return zlib.crc32(f"{colour}/{shape}/{background}".encode()) % 8 == 0


def held_out_prompts() -> list[str]:
    """Captions of the held-out one-shape combinations (named background)."""
    return [
        caption_of(Scene((Shape(s, c, 0.5, 0.5, 0.2),), b, True))
        for c, s, b in single_shape_triples()
        if is_held_out(c, s, b)
    ]


def sample_scene(rng: np.random.Generator) -> Scene:
    """Draw one training scene (never a held-out one-shape combination)."""
    while True:
        kind = rng.choice(3, p=[0.55, 0.2, 0.25])  # one shape, two alike, two different
        count = 1 if kind == 0 else 2
        colours = [str(rng.choice(COLOURS))]
        shapes = [str(rng.choice(SHAPES))]
        if kind == 1:
            colours.append(colours[0])
            shapes.append(shapes[0])
        elif kind == 2:
            while True:
                colour, shape = str(rng.choice(COLOURS)), str(rng.choice(SHAPES))
                if (colour, shape) != (colours[0], shapes[0]):
                    break
            colours.append(colour)
            shapes.append(shape)
        background = str(rng.choice([c for c in COLOURS if c not in colours]))
        if count == 1 and is_held_out(colours[0], shapes[0], background):
            continue
        placed = _place(rng, count)
        if placed is None:
            continue
        items = tuple(Shape(s, c, cx, cy, h) for s, c, (cx, cy, h) in zip(shapes, colours, placed))
        return Scene(items, background, bool(rng.random() < 0.8))


FOCUSED_COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow", "white", "black")


def sample_focused_scene(rng: np.random.Generator) -> Scene:
    """A scene of the focused grammar (stage 2 of training): one larger shape in one of six colours on a
    named background, never a held-out combination: 6 x 3 x 5 = 90 captions, every word seen often."""
    while True:
        colour, shape = str(rng.choice(FOCUSED_COLOURS)), str(rng.choice(SHAPES))
        background = str(rng.choice([c for c in FOCUSED_COLOURS if c != colour]))
        if is_held_out(colour, shape, background):
            continue
        half = float(rng.uniform(0.22, 0.32))
        cx, cy = (float(v) for v in rng.uniform(half + 0.04, 0.96 - half, size=2))
        return Scene((Shape(shape, colour, cx, cy, half),), background, True)


CENTRE_JITTER = 0.06  # +- offset of a centred shape's centre, as a fraction of the image side


def sample_centred_scene(rng: np.random.Generator) -> Scene:
    """A scene of the centred grammar (stage 3 of training): the focused grammar's one shape, large and near
    the middle, its background named four times in five ("a red circle" leaves the background to the model).

    A shape's place is the hardest thing for a model this small to decide from noise in a few hundred steps:
    with the place nearly fixed, the caption decides what is drawn and the model learns the shapes."""
    while True:
        colour, shape = str(rng.choice(FOCUSED_COLOURS)), str(rng.choice(SHAPES))
        background = str(rng.choice([c for c in FOCUSED_COLOURS if c != colour]))
        if is_held_out(colour, shape, background):
            continue
        half = float(rng.uniform(0.27, 0.33))
        cx, cy = (float(v) for v in 0.5 + rng.uniform(-CENTRE_JITTER, CENTRE_JITTER, size=2))
        return Scene((Shape(shape, colour, cx, cy, half),), background, bool(rng.random() < 0.8))


def focused_held_out_prompts() -> list[str]:
    """The held-out prompts that the focused grammar can say."""
    return [p for p in held_out_prompts() if not {"purple", "orange"} & set(p.split())]


def _place(rng: np.random.Generator, count: int) -> list[tuple[float, float, float]] | None:
    """Centres and half-extents (fractions of the side) that keep shapes inside and apart."""
    lo, hi = (0.16, 0.3) if count == 1 else (0.11, 0.19)
    for _ in range(50):
        out: list[tuple[float, float, float]] = []
        for _ in range(count):
            half = float(rng.uniform(lo, hi))
            margin = half + 0.04
            cx, cy = (float(v) for v in rng.uniform(margin, 1 - margin, size=2))
            if all(np.hypot(cx - x, cy - y) > half + h + 0.06 for x, y, h in out):
                out.append((cx, cy, half))
            else:
                break
        if len(out) == count:
            return out
    return None


def scene_for(seed: int, index: int) -> Scene:
    """Scene number ``index`` of the data set with ``seed``."""
    return sample_scene(np.random.default_rng([seed, index]))


def _coverage(shape: Shape, size: int) -> np.ndarray:
    """Fraction of each pixel of a ``size`` x ``size`` image inside ``shape`` ([size, size] float32)."""
    n = size * SUPERSAMPLE
    coords = (np.arange(n, dtype=np.float32) + 0.5) / n
    x, y = coords[None, :], coords[:, None]
    dx, dy = x - shape.cx, y - shape.cy
    h = shape.half
    if shape.kind == "circle":
        inside = dx * dx + dy * dy <= h * h
    elif shape.kind == "square":
        side = 0.9 * h
        inside = (np.abs(dx) <= side) & (np.abs(dy) <= side)
    elif shape.kind == "triangle":  # apex up, base 2h wide, height 1.8h, centred on its box
        top, bottom = -0.9 * h, 0.9 * h
        half_width = h * (dy - top) / (bottom - top)
        inside = (dy >= top) & (dy <= bottom) & (np.abs(dx) <= half_width)
    else:
        raise ValueError(f"unknown shape {shape.kind!r}")
    return inside.reshape(size, SUPERSAMPLE, size, SUPERSAMPLE).mean(axis=(1, 3), dtype=np.float32)


def _jittered(colour: str, rng: np.random.Generator) -> np.ndarray:
    base = np.asarray(PALETTE[colour], dtype=np.float32)
    return np.clip(base + rng.integers(-COLOUR_JITTER, COLOUR_JITTER + 1, size=3), 0, 255) / 255.0


def render(scene: Scene, size: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """The scene as an RGB float32 image [size, size, 3] in 0..1 (colours jittered when ``rng`` is given)."""
    colour = (lambda c: _jittered(c, rng)) if rng is not None else (lambda c: np.asarray(PALETTE[c]) / 255.0)
    image = np.broadcast_to(colour(scene.background).astype(np.float32), (size, size, 3)).copy()
    for shape in scene.shapes:
        alpha = _coverage(shape, size)[..., None]
        image = image * (1 - alpha) + colour(shape.colour).astype(np.float32) * alpha
    return image


def make_batch(
    seed: int, start: int, count: int, size: int, focused: bool = False, centred: bool = False
) -> tuple[np.ndarray, list[str]]:
    """Images [count, 3, size, size] in -1..1 and captions of scenes ``start .. start+count-1`` (of the
    focused grammar when ``focused``, of the centred grammar when ``centred``)."""
    images, captions = [], []
    for index in range(start, start + count):
        rng = np.random.default_rng([seed, index])
        if centred:
            scene = sample_centred_scene(rng)
        else:
            scene = sample_focused_scene(rng) if focused else sample_scene(rng)
        images.append(render(scene, size, rng).transpose(2, 0, 1) * 2 - 1)
        captions.append(scene.caption)
    return np.stack(images).astype(np.float32), captions


def vocabulary() -> list[str]:
    """Every word the grammar uses (for the tokenizers)."""
    words = {"a", "an", "and", "on", "background", "two"}
    words |= set(COLOURS) | set(SHAPES) | {s + "s" for s in SHAPES}
    return sorted(words)
