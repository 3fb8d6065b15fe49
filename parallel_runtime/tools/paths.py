"""The command line's path arguments, checked before any worker starts: a job that runs for minutes must
not end in a traceback because its output folder is missing, and a model path that does not exist is named
at once."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from ..models.builtin import BUILTIN_MODELS


def check_output_file(value: str, option: str, *, make_folders: bool = False, image: bool = False) -> Path:
    """The file ``option`` (e.g. ``--out``) names, writable now: its folder exists (or, with
    ``make_folders``, can be made: the nearest existing folder above it is writable), it is not a folder
    itself, and an existing file there may be replaced. ``image``: its suffix names a picture format
    Pillow writes. ConfigError (what, why, fix) otherwise."""
    if not value or not value.strip():
        raise ConfigError(f"{option} is empty", f"{option} names the file to write", f"pass {option} PATH")
    path = Path(value).expanduser()
    if path.is_dir():
        raise ConfigError(
            f"{option} {value} is a folder",
            f"{option} names the file to write, inside a folder",
            f"pass a file name, e.g. {option} {path / ('out.png' if image else 'results.json')}",
        )
    if image:
        _check_image_suffix(path, option)
    folder = path.parent if str(path.parent) else Path(".")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing != folder and not make_folders:
        raise ConfigError(
            f"{option} {value}: the folder {folder} does not exist",
            "the file is written at the end of the job; a missing folder would lose the work",
            f"create it first (mkdir -p {folder}) or choose a file in an existing folder",
        )
    if not existing.is_dir():
        raise ConfigError(
            f"{option} {value}: {existing} is a file, not a folder",
            f"{option} is written inside a folder",
            "choose a path whose folders are folders",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{option} {value}: the folder {existing} is not writable",
            "this user may not create files there, so the result could not be saved",
            "choose a folder you may write to, or fix its permissions",
        )
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(
            f"{option} {value} exists and is not writable",
            "the result replaces the file there",
            "choose another file name, or make that file writable",
        )
    return path


def _check_image_suffix(path: Path, option: str) -> None:
    from PIL import Image

    Image.init()
    fmt = Image.registered_extensions().get(path.suffix.lower())
    if fmt is None or fmt not in Image.SAVE:
        raise ConfigError(
            f"{option} {path}: {path.suffix or 'no suffix'!r} is not a picture format this Pillow writes",
            "the picture's format is chosen from the file name's suffix",
            f"end the file name in .png (lossless), e.g. {option} {path.with_suffix('.png')}",
        )


def check_model_argument(value: str, option: str = "--model") -> None:
    """A built-in tiny model's name, or a file or folder that exists."""
    if value in BUILTIN_MODELS or Path(value).expanduser().exists():
        return
    raise ConfigError(
        f"{option} {value!r}: no such file or folder, and not a built-in model",
        f"{option} is a built-in tiny model or a path to a diffusers folder or transformer file",
        f"pass an existing path, or one of {', '.join(BUILTIN_MODELS)}",
    )
