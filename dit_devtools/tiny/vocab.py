"""Real tokenizers over tiny vocabularies for the tiny test models: CLIP's byte-level BPE and T5's
Unigram, learned deterministically from a fixed corpus (every machine builds the same files)."""

from __future__ import annotations

import collections
import re
import string

# Words the tiny tokenizers learn from (lower- and upper-case forms are both seen by T5).
CORPUS = """
a photo of a cat sitting on a red chair in the garden, highly detailed, 4k
an astronaut riding a horse on the moon, digital art, trending on artstation
portrait of an old man with a beard, oil painting, dramatic lighting
a beautiful landscape with mountains and a lake at sunset, photorealistic
a small house in the forest, snow, winter, cozy light in the window
cyberpunk city street at night, neon lights, rain, reflections
a bowl of fruit on a wooden table, still life, soft shadows
a dog running on the beach, waves, blue sky, summer
the quick brown fox jumps over the lazy dog
A Photo Of The Sea And The Sky With Clouds And Birds
"""


# -- tokenizers --------------------------------------------------------------------------------
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP reversible byte -> printable character table, in CLIP's vocabulary order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def learn_bpe_merges(
    words: collections.Counter[tuple[str, ...]], vocab: list[str], num_merges: int
) -> list[tuple[str, str]]:
    """Learn up to ``num_merges`` BPE merges from word frequencies, deterministically (ties broken by
    the pair itself); each merged symbol not yet in ``vocab`` is appended to it."""
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += freq
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        if best[0] + best[1] not in vocab:
            vocab.append(best[0] + best[1])
        merged: collections.Counter[tuple[str, ...]] = collections.Counter()
        for word, freq in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += freq
        words = merged
    return merges


def _clip_vocab(corpus: str, num_merges: int = 200) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A CLIP-style byte-level BPE vocabulary: 256 bytes, 256 end-of-word bytes, merges learned from
    ``corpus``, then <|startoftext|> and <|endoftext|> (as in openai/clip-vit-large-patch14's vocab.json)."""
    table = bytes_to_unicode()
    base = list(table.values())
    vocab = base + [c + "</w>" for c in base]
    words: collections.Counter[tuple[str, ...]] = collections.Counter()
    for word in re.findall(r"[a-z]+|[0-9]|[^\sa-z0-9]+", corpus.lower()):
        symbols = [table[b] for b in word.encode("utf-8")]
        symbols[-1] += "</w>"
        words[tuple(symbols)] += 1
    merges = learn_bpe_merges(words, vocab, num_merges)
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    return {tok: i for i, tok in enumerate(vocab)}, merges


def build_clip_tokenizer(pad_token: str = "<|endoftext|>", corpus: str = CORPUS):
    """A real ``CLIPTokenizer`` (byte-level BPE, 77 tokens) over a tiny vocabulary learned from ``corpus``.

    ``pad_token="!"`` mimics SD3's second CLIP tokenizer, which pads with "!" (id 0)."""
    from transformers import CLIPTokenizer

    vocab, merges = _clip_vocab(corpus)
    return CLIPTokenizer(vocab=vocab, merges=merges, pad_token=pad_token, model_max_length=77)


def _t5_pieces(corpus: str) -> list[tuple[str, float]]:
    """Unigram pieces: T5's specials (<pad>=0, </s>=1, <unk>=2), the words of ``corpus``, single characters."""
    pieces: dict[str, float] = {"<pad>": 0.0, "</s>": 0.0, "<unk>": 0.0, "▁": -3.0}
    counts = collections.Counter(re.findall(r"\w+|[^\w\s]", corpus))
    for rank, (word, _) in enumerate(counts.most_common()):
        pieces.setdefault("▁" + word, -4.0 - 0.01 * rank)
        pieces.setdefault(word, -6.0 - 0.01 * rank)
    for ch in string.ascii_letters + string.digits + string.punctuation + "éèêàâäöüñçßøåæ":
        pieces.setdefault(ch, -10.0)
        pieces.setdefault("▁" + ch, -11.0)
    return list(pieces.items())


def build_t5_tokenizer(model_max_length: int = 512, corpus: str = CORPUS):
    """A real T5 tokenizer (SentencePiece-style Unigram over the words of ``corpus``, appends </s>, pads
    with <pad>=0)."""
    from transformers import T5TokenizerFast

    return T5TokenizerFast(vocab=_t5_pieces(corpus), extra_ids=0, model_max_length=model_max_length)
