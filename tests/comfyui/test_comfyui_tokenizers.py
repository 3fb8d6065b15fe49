"""The tokenizers ComfyUI ships, used with our text-encoder file loading (Parallel Text Encode)."""

from __future__ import annotations

from transformers import AutoTokenizer

from parallel_runtime.models.families.qwen_image.text import qwen_prefix_tokens


def test_comfyuis_own_qwen_tokenizer_drops_the_34_template_tokens(comfy_snapshot):
    """A qwen_2.5_vl_7b file with no tokenizer beside it is used with the tokenizer ComfyUI ships
    (comfy/text_encoders/qwen25_tokenizer): it loads with transformers and counts the template's prefix as
    QwenImagePipeline hard-codes it (34 tokens)."""
    tokenizer = AutoTokenizer.from_pretrained(
        comfy_snapshot / "comfy/text_encoders/qwen25_tokenizer", local_files_only=True
    )
    assert qwen_prefix_tokens(tokenizer) == 34
