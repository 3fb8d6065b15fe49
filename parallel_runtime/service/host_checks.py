"""Checks of a load or sample request that read the model's files on the host, before any worker
starts: dtype and attention names, time limits, every safetensors header (a truncated download
fails here), and the geometry a latent size is checked against."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..models.families.registry import FAMILIES, family
from . import input_checks
from .load_job import torch_dtype

if TYPE_CHECKING:
    from ..models.base import ModelPlan
    from ..parallel.config import ParallelConfig
    from .load_request import LoadRequest


def check_load_request(request: LoadRequest, path: Path) -> None:
    """Everything about a load that can be checked on the host, before any worker starts: dtype,
    attention backend, limits, and the model files' headers (a truncated download fails here)."""
    from ..attention.kernels import check_backend_name
    from ..models.compiled_blocks import check_compile_mode
    from ..models.fp8_matmul import check_fp8_matmul
    from ..models.safetensors_header import read_header

    torch_dtype(request.dtype)
    check_backend_name(request.attention)
    if path.suffix.lower() != ".gguf":
        from ..models.gguf.model_file import check_gguf_request

        check_gguf_request("auto", request.dequant_dtype)  # a known mode, though only GGUF files use it
    check_compile_mode(request.compile)
    check_fp8_matmul(request.fp8_matmul)
    input_checks.positive_seconds("load_timeout_s", request.load_timeout_s)
    if path.is_file() and path.suffix.lower() == ".gguf":
        from ..models.gguf.model_file import check_gguf_request
        from ..models.single_file import inspect_single_file

        check_gguf_request(request.storage, request.dequant_dtype)
        inspect_single_file(path, request.family)  # the GGUF header: every tensor inside the file, its types known
    elif path.is_file():
        from ..models.single_file import inspect_single_file

        read_header(path)  # every tensor's bytes inside the file (a truncated download fails here)
        inspect_single_file(path, request.family)
    else:
        for file in sorted(path.glob("*/*.safetensors")):
            read_header(file)
        _check_folder_family(path, request.family)
    if request.expert_2:
        check_second_expert(request, path)


def check_second_expert(request: LoadRequest, path: Path) -> None:
    """A second expert file (Wan 2.2 A14B's low-noise one) beside a high-noise single file: both Wan
    transformers of one shape, a boundary between 0 and 1."""
    from ..models.expert_files import check_boundary, check_expert_pair
    from ..models.safetensors_header import read_header
    from ..models.single_file import inspect_single_file

    second = Path(request.expert_2 or "").expanduser()
    if not path.is_file() or not second.is_file():
        raise ConfigError(
            f"a second expert {second} with the model {path}",
            "two experts from files are two single transformer files (a diffusers folder brings its own two)",
            "pick the high-noise file as the model and the low-noise file as the second expert",
        )
    if second.suffix.lower() != ".gguf":
        read_header(second)
    first_info, second_info = inspect_single_file(path, request.family), inspect_single_file(second, request.family)
    check_expert_pair(first_info.family, first_info.config, second, second_info.family, second_info.config)
    if request.expert_boundary is not None:
        check_boundary(request.expert_boundary)


def _check_folder_family(path: Path, chosen: str | None) -> None:
    """The family chosen by hand against the one a diffusers folder's transformer config names, and the folder's
    pipeline against those its family refuses."""
    import json

    from ..models.families.registry import check_pipeline_class, confirm_family, family_of_class_name

    config = path / "transformer" / "config.json"
    if not config.is_file():
        return
    spec = family_of_class_name(str(json.loads(config.read_text(encoding="utf-8")).get("_class_name", "")))
    if spec is None:
        return
    index = path / "model_index.json"
    if index.is_file():
        pipeline = str(json.loads(index.read_text(encoding="utf-8")).get("_class_name", ""))
        check_pipeline_class(spec.id, pipeline, path.name)
    if chosen is not None:
        confirm_family(path.name, spec.id, chosen)


def host_geometry(path: Path) -> dict[str, Any]:
    """The load info fields ``check_latent_size`` reads, told on the host from the model's config: no
    worker needed. The family's plan is made from the config's fields as they are (a diffusers folder's
    config.json, or a single file's inspected config, holds every field the plan reads), so the host does not
    import diffusers (seconds of a cold start, on a CPU the workers need); only a config that leaves a field
    to the transformer class's default is read through the class (a transformer with no weights)."""
    import json

    if path.is_file():
        from ..models.single_file import inspect_single_file

        config = inspect_single_file(path).config
    else:
        config = json.loads((path / "transformer" / "config.json").read_text(encoding="utf-8"))
    plan = _plan_from_config(dict(config)) or _plan_from_class(dict(config))
    return {
        "family": plan.family,
        "patch_size": plan.patch_size,
        "spatial_factor": plan.vae_scale_factor,
        "pads_to_patch": plan.pads_to_patch,
        "max_grid_side": plan.max_grid_side,
    }


def _plan_from_class(config: dict[str, Any]) -> ModelPlan:
    """The plan of a transformer of ``config`` built with no weights (diffusers fills in the defaults)."""
    from ..models.registry import diffusers_class, get_adapter
    from ..models.weights import meta_model

    return get_adapter(meta_model(diffusers_class(str(config["_class_name"])), config)).plan


class _ConfigFields(dict):
    """A transformer's config read as attributes, as a family's ``make_plan`` reads a model's ``config``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _plan_from_config(config: dict[str, Any]) -> ModelPlan | None:
    """The family's plan of this config (None: no family names its class, or a field is left to the class's
    default, which only the class knows)."""
    from ..models.families.registry import family_of_class_name

    spec = family_of_class_name(str(config.get("_class_name", "")))
    if spec is None:
        return None
    try:
        return spec.adapter().make_plan(_ConfigFields(config), None)
    except AttributeError:
        return None


def check_pipefusion_request(request: LoadRequest, config: ParallelConfig, path: Path | None = None) -> None:
    """Reject PipeFusion settings that cannot work with ``config`` (before any model is loaded), and a model
    file at ``path`` that cannot run in stages."""
    if config.pp <= 1:
        return
    if path is not None:
        check_pipefusion_model(path, request.family, config)
    if request.expert_2:
        raise ConfigError(
            f"a second expert file with the layout {config.describe()}",
            "PipeFusion stages load one transformer's blocks; the second expert would be left out",
            "use Ulysses / Ring / CFG parallelism for a two-expert model",
        )
    if request.pp_patches is not None and (
        isinstance(request.pp_patches, bool)
        or not isinstance(request.pp_patches, int)
        or request.pp_patches < config.pp
    ):
        raise ConfigError(
            f"pp_patches={request.pp_patches!r} with {config.pp} PipeFusion stages",
            "each stage needs a patch of its own to work on, so there are at least as many patches as stages",
            f"use pp_patches >= {config.pp}, or None for the automatic choice",
        )
    if isinstance(request.pp_warmup, bool) or not isinstance(request.pp_warmup, int) or request.pp_warmup < 0:
        raise ConfigError(
            f"pp_warmup={request.pp_warmup!r}",
            "warmup counts the first steps that run synchronously on the whole image",
            "use a whole number >= 0 (1 is a good default)",
        )
    weights = request.pp_stage_weights
    if weights is not None and len(tuple(weights)) != config.pp:
        raise ConfigError(
            f"{len(tuple(weights))} pp_stage_weights for {config.pp} PipeFusion stages",
            "each stage needs one weight (its relative share of the transformer blocks)",
            f"give {config.pp} positive numbers, or None for an equal split",
        )


def check_pipefusion_model(path: Path, family: str | None, config: ParallelConfig) -> None:
    """Refuse PipeFusion for a single file whose transformer cannot run in stages (its family's
    ``pipefusion_refusal``, e.g. a transformer with control hint blocks)."""
    if config.pp <= 1 or not path.is_file():
        return
    from ..models.families.registry import family as family_spec
    from ..models.single_file import inspect_single_file

    info = inspect_single_file(path, family)
    refusal = family_spec(info.family).pipefusion_refusal
    reason = refusal(info.config) if refusal is not None else None
    if reason is not None:
        raise ConfigError(*reason)


def check_text_encoder_file(reader: Any, encoder_path: str, tokenizer_dir: str | None) -> None:
    """A text-encoder file and its tokenizer, on the host: the family's own check of the file, and a tokenizer
    folder when the file does not carry its tokenizer (``reader``: the family's ``TextEncoderFile``)."""
    name = Path(encoder_path).name
    if reader.tokenizer is None and not tokenizer_dir:
        raise ConfigError(
            f"no tokenizer found for {name}",
            f"a {reader.what} text encoder needs its tokenizer folder (ComfyUI ships some in comfy/text_encoders)",
            f"put the tokenizer files in a folder {Path(encoder_path).stem}_tokenizer next to the encoder file",
        )
    if reader.check is not None:
        reader.check(encoder_path)


FileChoice = tuple[str, str | None]  # (a text-encoder file, its tokenizer folder or None)


def check_text_encoder_files(
    reader: Any,
    first: FileChoice,
    second: FileChoice | None,
    family_id: str,
    more: tuple[FileChoice, ...] = (),
) -> tuple[FileChoice, ...]:
    """The (file, tokenizer folder) pairs a family's ``TextEncoderFile`` reads, checked on the host and in its
    order (first, second, *more): a family reading several (Flux.1's T5-XXL and CLIP-L, as ComfyUI's
    DualCLIPLoader; HiDream's four, as its QuadrupleCLIPLoader) takes them in any order. A ConfigError for fewer
    or more files than the family reads."""
    given = [first, *((second,) if second is not None else ()), *more]
    reader = reader.for_files([f[0] for f in given])
    extra = reader.extra_files
    names = ", ".join(Path(f[0]).name for f in given)
    if len(given) != 1 + len(extra):
        kinds = [reader.what, *(e.what for e in extra)]
        count = {1: "one", 2: "two", 3: "three", 4: "four"}
        raise ConfigError(
            f"{count.get(len(given), len(given))} text-encoder file{'s' * (len(given) > 1)} ({names}) for a "
            f"{family_id} model",
            f"a {family_id} model reads "
            + (f"one {reader.what} text-encoder file" if not extra else f"{' + '.join(kinds)}, one file each"),
            "leave text_encoder_2 at (none)"
            if not extra
            else f"choose the {' / '.join(kinds)} files as text_encoder"
            + "".join(f" / text_encoder_{i + 2}" for i in range(len(extra))),
        )
    if reader.arrange is not None:
        given = [given[i] for i in reader.arrange([f[0] for f in given])]
    elif extra and extra[0].recognise(given[0][0]) and not extra[0].recognise(given[1][0]):
        given[0], given[1] = given[1], given[0]
    check_text_encoder_file(reader, *given[0])
    for kind, (path, tokenizer) in zip(extra, given[1:]):
        if not tokenizer:
            raise ConfigError(
                f"no tokenizer found for {Path(path).name}",
                f"a {kind.what} text encoder needs its tokenizer folder (ComfyUI ships it in comfy/)",
                f"put the tokenizer files in a folder {Path(path).stem}_tokenizer next to the encoder file",
            )
        kind.check(path)
    return tuple(given)


def text_encoder_files(
    family_id: str,
    first: FileChoice | None,
    second: FileChoice | None,
    more: tuple[FileChoice | None, ...] = (),
    vision: object | None = None,
    model_file: str | os.PathLike | None = None,
) -> tuple[FileChoice, ...] | None:
    """Parallel Text Encode's (file, tokenizer folder) choices for a ``family_id`` model (``more``: the third and
    fourth, None where not chosen), checked on the host and in the family's order (``check_text_encoder_files``);
    None: the model's own encoders. ``vision`` (an image's tokens for the prompt) needs files that read it. A family
    whose encoding has a part in the model's own file (``TextEncoderFile.model_part``) gets it last, as (file, None):
    a given file that holds it, else ``model_file`` (the file or folder the Parallel Model Loader loaded)."""
    reader = family(family_id).text_encoder_file
    if vision is not None and (first is None or reader is None or not reader().takes_vision):
        raise ConfigError(
            f"an image's vision tokens for a {family_id} prompt"
            + ("" if first is not None else " with the model's own text encoders"),
            "the image goes into the prompt of a text-encoder file that reads vision tokens (a LLaVA's Llama)",
            "choose those text-encoder files (text_encoder, text_encoder_2) from models/text_encoders",
        )
    more = tuple(f for f in more if f is not None)
    if first is None and (second is not None or more):
        other = second if second is not None else more[0]
        raise ConfigError(
            f"a second text-encoder file ({Path(other[0]).name}) without a first",
            "text_encoder_2 (and _3, _4) are the further files of a family that reads several (Flux.1: T5-XXL and "
            "CLIP-L; HiDream: Llama-3.1, T5-XXL, CLIP-L and CLIP-G)",
            "choose the first file as text_encoder too, or leave the others at (none)",
        )
    spec = family(family_id)
    if first is None:
        if not spec.text_encoding().on_workers:
            files = spec.text_encoder_file
            kinds = [files().what, *(e.what for e in files().extra_files)] if files is not None else []
            raise ConfigError(
                f"{spec.label} prompts cannot be encoded by Parallel Text Encode with the model's own encoders",
                f"{spec.label}'s text encoders are not loaded from its folder",
                (
                    f"choose its {' / '.join(kinds)} file(s) as text_encoder"
                    + f" .. text_encoder_{len(kinds)}" * (len(kinds) > 1)
                    + ", or "
                    if kinds
                    else ""
                )
                + f"encode the prompt in ComfyUI ({spec.text.comfy_nodes}) and give that CONDITIONING to the "
                "Parallel Sampler",
            )
        return None
    reader = spec.text_encoder_file
    if reader is None:
        readers = [f"{f.label}'s {f.text_encoder_file().what}" for f in FAMILIES if f.text_encoder_file]
        raise ConfigError(
            f"a text-encoder file ({Path(first[0]).name}) for a {family_id} model",
            f"Parallel Text Encode reads only {' and '.join(readers)} from models/text_encoders so far",
            "choose \"(the model's own)\" with a diffusers folder, or ComfyUI's own text-encode nodes",
        )
    files = reader()
    if files.model_part is not None:
        return _with_model_part(files, [first, *((second,) if second is not None else ()), *more], spec, model_file)
    return check_text_encoder_files(files, first, second, family_id, more)


def _with_model_part(
    reader: Any, given: list[FileChoice], spec: Any, model_file: str | os.PathLike | None
) -> tuple[FileChoice, ...]:
    """The text-encoder files checked (``check_text_encoder_files``), then the source of the reader's
    ``model_part``: the one given file that holds it, else the loaded model's own file or folder."""
    part = reader.model_part
    own = [f for f in given if part.holds(f[0])]
    rest = [f for f in given if f not in own]
    if len(own) > 1 or not rest:
        names = ", ".join(Path(f[0]).name for f in own)
        raise ConfigError(
            f"{len(own)} files holding the {part.what} ({names}) and {len(rest)} {reader.what} file(s)",
            f"{spec.label} encodes prompts with one {reader.what} file and its {part.what} (read from the loaded "
            "model's own file unless one file of them is given)",
            f"choose the {reader.what} file as text_encoder (and at most one {part.what} file as text_encoder_2)",
        )
    if own:
        source = own[0][0]
    elif model_file is not None and part.holds(str(model_file)):
        source = str(model_file)
    else:
        name = Path(model_file).name if model_file is not None else "(none)"
        raise ConfigError(
            f"the loaded model's file {name} holds no {part.what}, and no file of them was given",
            f"{spec.label} encodes prompts with {reader.what} and its {part.what}, which its release keeps in the "
            f"model's checkpoint ({part.release}); this file (a transformer-only or GGUF file) lacks them",
            f"load {part.release} with the Parallel Model Loader, or give a file holding the {part.what} as "
            "text_encoder_2",
        )
    checked = check_text_encoder_files(reader, rest[0], rest[1] if len(rest) > 1 else None, spec.id, tuple(rest[2:]))
    return (*checked, (source, None))
