"""Parallel VAE Decode: the model's VAE decodes a LATENT across the workers (exact, in row bands)."""

from __future__ import annotations

from typing import Any

from .declare import DeclaredNode, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle


class ParallelVAEDecode(DeclaredNode):
    """Decodes latents with the VAE that came with the parallel model."""

    SPEC = NodeSpec(
        node_id="DiTParallelVAEDecode",
        display_name="Parallel VAE Decode",
        description="Decodes a LATENT with the parallel model's VAE, split across the workers (same result as one GPU).",
        inputs=(
            Socket("parallel_model", PARALLEL_MODEL, "From Parallel Model Loader (its VAE decodes)."),
            Socket("samples", "LATENT", "The latent to decode."),
        ),
        outputs=(
            Output(
                "IMAGE",
                "The decoded images [batch, height, width, 3], values 0..1; a video's frames one after another "
                "(Wan: 4*T-3 frames per latent of T frames) for SaveAnimatedWEBP / CreateVideo.",
            ),
        ),
        function="decode",
    )

    def decode(self, parallel_model: ParallelModelHandle, samples: dict) -> tuple[Any]:
        from parallel_runtime.service.comfy_graph import decode

        model = parallel_model.model()
        status, pool = self.context.status, parallel_model.pool_id
        status.job(pool, "decode", "running")
        try:
            image = decode(model, samples)
        except BaseException as exc:
            status.job(pool, "decode", "error", str(exc))
            raise
        status.job(pool, "decode", "done")
        return (image,)
