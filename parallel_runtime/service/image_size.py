"""The picture size a model makes of a width and height asked for in pixels.

A model's VAE shrinks the picture by its factor (8 px for every family here), so each side becomes a whole
number of latent pixels: a side that is not a multiple of it is rounded down, as ComfyUI's empty-latent
nodes do (``width // 8``) and as the nodes' widgets step by 8. Rounding is never silent: the caller is
told at the start, before any job (the API: a :class:`SizeAdjusted` warning and a log line; the CLI: a
``warning:`` line), and a side smaller than the factor, which would round to nothing, is refused.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings

from ..errors import ConfigError

log = logging.getLogger("parallel_runtime")


class SizeAdjusted(UserWarning):
    """A width or height was rounded to what the model can make."""


@dataclasses.dataclass(frozen=True)
class FittedSize:
    """``width`` x ``height``: the picture the model makes when ``asked_width`` x ``asked_height`` is asked."""

    width: int
    height: int
    asked_width: int
    asked_height: int
    factor: int
    family: str

    @property
    def adjusted(self) -> bool:
        return (self.width, self.height) != (self.asked_width, self.asked_height)

    def message(self) -> str:
        """What changed and why, with the sizes to ask for instead (empty when nothing changed)."""
        if not self.adjusted:
            return ""
        f = self.factor
        sides = [
            f"{name} {asked} px -> {got} px (or ask for {got + f})"
            for name, asked, got in (
                ("width", self.asked_width, self.width),
                ("height", self.asked_height, self.height),
            )
            if asked != got
        ]
        return (
            f"the picture will be {self.width}x{self.height} px, not {self.asked_width}x{self.asked_height}: "
            f"{'; '.join(sides)}; the {self.family} model's VAE works in blocks of {f} px, so sides are rounded "
            f"down to a multiple of {f}"
        )

    def announce(self, stacklevel: int = 3) -> FittedSize:
        """Warn (a SizeAdjusted warning and a log line) when the size changed; returns self."""
        if self.adjusted:
            text = self.message()
            log.warning("dit-parallel: %s", text)
            warnings.warn(text, SizeAdjusted, stacklevel=stacklevel)
        return self


def fit_image_size(width: int, height: int, factor: int, family: str = "this") -> FittedSize:
    """``width`` x ``height`` px rounded down to multiples of ``factor`` (ConfigError for a side smaller
    than the factor: it would hold no latent pixel)."""
    for name, side in (("width", width), ("height", height)):
        if side < factor:
            raise ConfigError(
                f"{name} {side} px is smaller than {factor} px",
                f"the {family} model's VAE makes a picture in blocks of {factor} px; a side of {side} px holds none",
                f"ask for a {name} of at least {factor} px (a multiple of {factor})",
            )
    return FittedSize(width // factor * factor, height // factor * factor, width, height, factor, family)
