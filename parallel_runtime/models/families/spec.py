"""What a model family states about itself: :class:`FamilySpec`, one per folder under ``models/families``.

A family's facts are data (names, numbers, key fragments) and a few functions. The data is light: importing
a spec loads neither torch nor diffusers, so the node layer can list families, their labels and hints at
ComfyUI's start. The heavy parts (the adapter, the original-layout conversion, the text encoders, a VAE file
format) are reached through zero-argument loaders that import the family's own modules on first call.

Everything outside the family folders asks the registry (``families.registry``) for these facts instead of
naming a family; ``tests/test_family_folders.py`` fails when a family name appears anywhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ...parallel.layout import LayoutHints

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..base import Conditioning, ConditioningExtras, ModelAdapter
    from ..latent_formats import LatentFormat
    from ..text_parts import TextComponents
    from ..video_vae import VideoVae

Shape = tuple[int, ...]
Shapes = Mapping[str, Shape]
StateDict = dict[str, "torch.Tensor"]
RGB = tuple[float, float, float]


@dataclasses.dataclass(frozen=True)
class LatentPreview:
    """ComfyUI's latent -> RGB preview factors of one latent format (``comfy.latent_formats.<comfy_class>``):
    a preview pixel is ``bias + sum_c latent[c] * rgb_factors[c]``, on the latent in model space (what the
    sampler holds: the format's ``to_model`` of the raw VAE latent, ComfyUI's ``process_in``)."""

    comfy_class: str
    rgb_factors: tuple[RGB, ...]  # one (r, g, b) row per latent channel
    rgb_bias: RGB | None = None

    @property
    def channels(self) -> int:
        return len(self.rgb_factors)


@dataclasses.dataclass(frozen=True)
class TextFacts:
    """How a family's prompts are encoded (the light facts; the encoder itself is ``FamilySpec.text_encoding``)."""

    max_length: int  # tokens the family's diffusers pipeline encodes a prompt to by default
    comfy_nodes: str  # ComfyUI's own nodes that encode prompts for this family (said in error messages)
    lora_roles: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))  # component -> role
    components: tuple[str, ...] = ()  # diffusers components beyond text_encoder* the encoding runs, loaded with
    # them into ``text_encoders`` (LTX-2's ``connectors``)


@dataclasses.dataclass(frozen=True)
class OriginalLayout:
    """A family's single-file (original) tensor layout: what the weights decide of the diffusers config, which
    shipped variant fits, and the conversion to diffusers names."""

    anchor: str  # a tensor every file of the family has in its original layout (diffusers' layout lacks it)
    config_from_weights: Callable[[Shapes, Mapping[str, Any]], dict[str, Any]]  # (shapes, base config) -> entries
    variant_of: Callable[[Shapes], str]  # the shipped config folder that fits these weights
    to_diffusers: Callable[[StateDict, Mapping[str, Any]], StateDict]  # converted tensors leave the state dict
    skeleton: Callable[[Mapping[str, Any]], dict[str, Shape]] | None = None  # original names/shapes from a config
    # (file name, a .safetensors file's ``__metadata__``) -> config entries the file's metadata decides (ComfyUI
    # reads some families' settings there); None: the metadata decides nothing
    config_from_metadata: Callable[[str, Mapping[str, str]], dict[str, Any]] | None = None


@dataclasses.dataclass(frozen=True)
class TextEncoding:
    """A family's prompt -> Conditioning with a pipeline's own text encoders."""

    encode: Callable[[TextComponents, list[str], int, torch.device], Conditioning]  # (parts, prompts, tokens, device)
    default_length: Callable[[TextComponents], int] | None = None  # when it depends on the pipeline (else max_length)
    loader_options: Callable[[Path], dict[str, Any]] | None = None  # extra from_pretrained options per encoder folder
    on_workers: bool = True  # False: prompts come from ComfyUI's encoders only (a folder's encoders are not loaded)


@dataclasses.dataclass(frozen=True)
class SecondEncoderFile:
    """The second text-encoder file a family reads beside the first (Flux.1's CLIP-L beside its T5-XXL, as ComfyUI's
    DualCLIPLoader reads them); its tokenizer is a folder."""

    what: str  # the file kind, for messages, e.g. "CLIP-L"
    load: Callable[[str, Any], nn.Module]  # (path, device) -> encoder
    check: Callable[[str], None]  # (path): a ConfigError on the host for a wrong file
    recognise: Callable[[str], bool]  # (path): whether a file is of this kind (the two files may come either way)


@dataclasses.dataclass(frozen=True)
class ModelFilePart:
    """A part of a family's prompt encoding that its release keeps inside the MODEL's checkpoint (LTX-2's text
    connectors in ltx-2-19b-dev.safetensors, as later ComfyUI's LTX-2 text-encoder loader reads them from the
    checkpoint): read from the file (or diffusers folder) the Parallel Model Loader loaded, unless a file of its own
    is given beside the text encoder. It has no tokenizer; ``encode`` gets it last among the encoders."""

    what: str  # the part, for messages, e.g. "LTX-2 text connectors"
    load: Callable[..., nn.Module]  # (path, device, dtype, overrides=None) -> the part
    holds: Callable[[str], bool]  # (a file or folder): whether it holds the part (read from its header only)
    nbytes: Callable[[str], int]  # (a file or folder that holds it): the part's bytes in it (placement)
    release: str  # the model file that holds it, for messages, e.g. "ltx-2-19b-dev.safetensors"


@dataclasses.dataclass(frozen=True)
class TextEncoderFile:
    """A text encoder read from a file (ComfyUI's ``models/text_encoders``) and how it encodes prompts. With a
    ``second`` file (and ``more``), ``encode`` gets (first, second, ...) encoders and tokenizers."""

    what: str  # the file kind, for messages, e.g. "Qwen2.5-VL"
    load: Callable[..., nn.Module]  # (path, device, dtype, overrides=None) -> encoder
    encode: Callable[..., Conditioning]  # (encoder, tokenizer, prompts, max_sequence_length) -> Conditioning
    default_length: int
    # (encoder file, tokenizer folder or None) -> tokenizer, for files that carry their own (None: the
    # tokenizer is a folder, read with transformers' AutoTokenizer, and one is required)
    tokenizer: Callable[[str, str | None], Any] | None = None
    check: Callable[[str], None] | None = None  # (encoder file): a ConfigError on the host for a wrong file
    second: SecondEncoderFile | None = None  # a second file the family needs (None: one file)
    more: tuple[SecondEncoderFile, ...] = ()  # files it needs beyond the second (HiDream's four): ``encode`` gets
    # (first, second, *more) encoders and tokenizers
    # (paths of every file given) -> their indices in the order (first, second, *more) (a ConfigError when they
    # are not the kinds needed); None: the second file is told by its kind's ``recognise``
    arrange: Callable[[Sequence[str]], tuple[int, ...] | None] | None = None
    # (paths of the files given, fewer than it reads) -> the reader of just those files (SD3's T5-XXL, CLIP-L
    # and CLIP-G: any of them may be left out, as ComfyUI's DualCLIPLoader / CLIPLoader read them; a
    # ConfigError when those cannot go together); None: every file is needed
    subset: Callable[[Sequence[str]], TextEncoderFile] | None = None
    # ``encode`` takes ``vision=`` {"states": [images, tokens, width] vision tokens in the text model's width (a
    # CLIP_VISION_OUTPUT's mm_projected), "interleave": int}: an image's tokens inside the prompt
    takes_vision: bool = False
    # a part read from the loaded model's own file unless a file of it is given as the next text_encoder_N (None:
    # the text-encoder files are the whole encoding); ``encode`` gets (encoder(s)..., part) as its encoders
    model_part: ModelFilePart | None = None

    @property
    def extra_files(self) -> tuple[SecondEncoderFile, ...]:
        """The files read beside the first, in order (second, *more)."""
        return (*((self.second,) if self.second is not None else ()), *self.more)

    def for_files(self, paths: Sequence[str]) -> TextEncoderFile:
        """The reader of the files ``paths``: this one, or the one of a subset of its files (``subset``)."""
        if self.subset is None or not 0 < len(paths) < 1 + len(self.extra_files):
            return self
        return self.subset(paths)


@dataclasses.dataclass(frozen=True)
class VaeFileFormat:
    """A VAE file layout a family brings (read by ``vae.file``): how to recognise it, its diffusers config, and
    the VAE module built from its tensors."""

    matches: Callable[[Shapes, str], bool]  # (shapes of the whole file, tensor prefix)
    config: Callable[[Shapes], dict[str, Any]]  # (shapes under the prefix) -> diffusers VAE config
    build: Callable[[StateDict, dict[str, Any], str], nn.Module]  # (state, config, file name) -> VAE on the CPU
    # (config, the checkpoint's safetensors metadata) -> the config with what the metadata states (as ComfyUI's
    # Load Checkpoint reads it; a lone VAE file, as VAELoader reads it, gives {}); None: metadata is not read
    metadata: Callable[[dict[str, Any], Mapping[str, str]], dict[str, Any]] | None = None


@dataclasses.dataclass(frozen=True)
class ComfyConditioning:
    """ComfyUI CONDITIONING options this family takes beyond text (e.g. WanImageToVideo's start image)."""

    keys: tuple[str, ...]  # option names the family uses (others beyond text are refused)
    to_extras: Callable[[Mapping[str, Any], Mapping[str, Any], str], ConditioningExtras | None]  # options, expected,
    # where -> the family's Conditioning.extras (None when the options hold none of its keys)
    check_extras: Callable[[ConditioningExtras | None, Mapping[str, Any], str], None] | None = None  # extras,
    # expected, where: raises when a conditioning's extras do not suit the model (the API's, which no parse saw)


@dataclasses.dataclass(frozen=True)
class GGUFFacts:
    """How ComfyUI-GGUF's tools store the family in a GGUF file (its ``tools/convert.py`` and llama.cpp patch)."""

    architecture: str  # the files' ``general.architecture``
    required: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))  # tensor -> fix
    # when a file lacks it (e.g. a tensor the quantiser cannot hold, added back by a tool)
    quantiser_keeps: tuple[str, ...] = ()  # diffusers-name prefixes the quantiser leaves in the converted type
    q4_k_m: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))  # diffusers-name
    # regex -> the K type Q4_K_M gives it instead of Q4_K (value / feed-forward output / fused q-k-v projections)


def default_geometry(latent_channels: int | None) -> tuple[int, int]:
    """(image pixels per token side, video frames per latent frame) of an image family: 16 (VAE 8 x patch 2), 0."""
    return 16, 0


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """Everything one model family states (see the module doc). Fields that hold ``Callable[[], X]`` are loaders
    of the family's heavy modules."""

    id: str  # what the loader node, ModelPlan.family and the layout planner call the family
    label: str  # the name users read, e.g. "FLUX.2"
    transformer_class: str  # the diffusers transformer class the family's adapter drives
    pipeline_class: str  # the diffusers pipeline a transformer-only load stands for
    adapter: Callable[[], type[ModelAdapter]]
    markers: tuple[str, ...]  # tensor-name fragments, any one of which marks the family's files (either layout)
    variants: tuple[str, ...]  # shipped configs, ``<folder>/configs/<variant>/`` (single files)
    folder: Path  # the family's folder
    original_layout: Callable[[], OriginalLayout]
    text: TextFacts
    text_encoding: Callable[[], TextEncoding]
    layout: LayoutHints  # the planner's assumptions before the sampler's values are known
    head_dim: int  # the usual attention head width (heads of a header-only file: width / head_dim)
    previews: tuple[LatentPreview, ...] = ()  # ComfyUI's preview factors of each latent format the family uses
    detection_priority: int = 0  # tried highest first: above the families whose markers its files also hold
    geometry: Callable[[int | None], tuple[int, int]] = default_geometry  # (latent channels) -> token px, frames
    distilled_guidance: bool = False  # takes an embedded guidance value (FluxGuidance) instead of true CFG only
    generate_cfg: float = 1.0  # ``python -m parallel_runtime generate``'s CFG scale when none is given
    pick_preview: Callable[[LatentFormat], LatentPreview | None] | None = None  # among ``previews`` (None: by channels)
    lora_markers: tuple[str, ...] = ()  # LoRA module-name fragments that suggest this family (error messages)
    # starts of dotted name parts of the transformer parameters the adapter never runs (LTX-2's audio stream): the
    # loaders leave them on "meta" unread and byte accounting does not count them (``models.registry.idle_weights``)
    idle_modules: tuple[str, ...] = ()
    more_transformer_classes: tuple[str, ...] = ()  # further diffusers classes the adapter drives (Wan VACE)
    pipefusion_refusal: Callable[[Mapping[str, Any]], tuple[str, str, str] | None] | None = None  # a config ->
    # the (what, why, fix) of why it cannot run in PipeFusion stages (None: it can)
    extra_modules: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None  # a config -> modules (name ->
    # nn.Module on meta) the diffusers class lacks but the file holds (Wan Fun-Control's ref_conv)
    lora_aliases: Callable[[str], tuple[str, ...]] | None = None  # an original-layout module -> more LoRA module
    # names that patch it (beyond diffusion_model.<name> and lora_unet_<name>), e.g. ComfyUI's own module names
    lora_prefixes: tuple[str, ...] = ()  # more prefixes LoRA files put before the diffusers layout's names
    default_size: tuple[int, ...] = (1024, 1024)  # the release's usual (width, height[, frames]), for benchmarks
    text_encoder_file: Callable[[], TextEncoderFile] | None = None
    # two experts switched by noise level (Wan 2.2 A14B), read from two files: the default boundary sigma for
    # a transformer config (None: the family has no such pairs)
    expert_boundary: Callable[[Mapping[str, Any]], float] | None = None
    vae_file: Callable[[], VaeFileFormat] | None = None
    video_vae: Callable[[], VideoVae] | None = None  # a causal 3-D VAE decoded whole, band-parallel (vae.causal3d)
    comfy_conditioning: ComfyConditioning | None = None
    gguf: GGUFFacts | None = None  # ComfyUI-GGUF's files of the family (None: it has none)
    # diffusers pipelines whose folders hold the family's transformer but that the service (the nodes) does not run
    # -> (why, fix); refused on the host before any worker starts (the engine's loader still reads them)
    refused_pipelines: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def preview_for(self, latent_format: LatentFormat) -> LatentPreview | None:
        """The preview factors of a model of this family whose latents have ``latent_format`` (None: the family
        states none for it)."""
        if self.pick_preview is not None:
            return self.pick_preview(latent_format)
        return next((p for p in self.previews if p.channels == latent_format.channels), None)

    def config_folder(self, variant: str) -> Path:
        """Where the shipped configs of ``variant`` (one of :attr:`variants`) are."""
        return self.folder / "configs" / variant
