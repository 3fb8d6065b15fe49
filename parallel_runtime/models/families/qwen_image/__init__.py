"""Qwen-Image (QwenImageTransformer2DModel), with the Qwen2.5-VL 7B text encoder and Wan 2.1's VAE."""

ID = "qwen-image"
QWEN_IMAGE = "qwen-image"  # the shipped config (configs/qwen-image/)
