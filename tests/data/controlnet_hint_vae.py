"""A stand-in for the VAE on ComfyUI's ControlNet apply node, shared by the reference generator
(make_comfy_controlnet_reference.py) and the tests: ``encode`` maps ComfyUI pixels [B, H, W, 3] to a
16-channel latent at 1/8 size (8x8 mean, a fixed 3 -> 16 map, tanh x 2). ComfyUI's own Flux VAE is full
size; what matters here is that both sides encode the same scaled, cropped hint image with the same VAE
object, which this stands for. Pure torch: importable without ComfyUI."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class HintVAE:
    """``encode(pixels)`` and ``spacial_compression_encode()`` as ComfyUI's VAE has them."""

    def __init__(self, channels: int = 16, seed: int = 26, frame_axis: bool = False):
        self.frame_axis = frame_axis  # a video VAE's latent [B, C, 1, h, w] (Qwen-Image's Wan VAE), else [B, C, h, w]
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(channels, 3, generator=g)
        self.bias = 0.1 * torch.randn(channels, generator=g)
        self.calls: list[list[int]] = []

    def spacial_compression_encode(self) -> int:
        return 8

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls.append(list(pixels.shape))
        x = F.avg_pool2d(pixels.movedim(-1, 1).float(), 8)
        latent = 2.0 * torch.tanh(torch.einsum("bchw,oc->bohw", x, self.weight) + self.bias[:, None, None])
        return latent.unsqueeze(2) if self.frame_axis else latent


def hint_image(seed: int, height: int, width: int) -> torch.Tensor:
    """A deterministic IMAGE [1, H, W, 3] in 0..1 (smooth bands plus noise, like an edge or depth map)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.linspace(0, 1, height)[:, None, None]
    cols = torch.linspace(0, 1, width)[None, :, None]
    base = torch.sin(6.0 * rows + 4.0 * cols + torch.tensor([0.0, 1.0, 2.0])) * 0.5 + 0.5
    return (0.8 * base + 0.2 * torch.rand(height, width, 3, generator=g)).clamp(0, 1).unsqueeze(0)
