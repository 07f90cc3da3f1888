"""Cutting text (a tool's result, say) to a token budget, on a seam that never splits a character."""

from __future__ import annotations

from typing import Any


def truncate_to_tokens(text: str, tokenizer: Any, budget: int, marker: str = " …[truncated]") -> str:
    """`text` cut so that it encodes to at most `budget` tokens, ending with `marker` when cut.

    The tokenizer is a Hugging Face tokenizer (anything with encode/decode). `None` bounds UTF-8 bytes
    instead: a byte-level BPE never spends more than one token per byte, so the budget still holds.
    """
    if budget <= 0:
        return ""
    encode = _encoder(tokenizer)
    ids = encode(text)
    if len(ids) <= budget:
        return text
    tail = marker if len(encode(marker)) < budget else ""
    keep = budget - len(encode(tail))
    # Re-encoding a decoded prefix plus the marker can merge differently across the seam, so shrink
    # until the whole result fits (a few steps at most).
    while keep > 0:
        head = _decode(tokenizer, ids[:keep]).rstrip("\ufffd")  # no half of a split character
        out = head.rstrip() + tail if tail else head
        if len(encode(out)) <= budget:
            return out
        keep -= 1
    return tail if len(encode(tail)) <= budget else ""


def _encoder(tokenizer: Any):
    if tokenizer is None:
        return lambda s: list(s.encode("utf-8"))
    return lambda s: list(tokenizer.encode(s, add_special_tokens=False))


def _decode(tokenizer: Any, ids: list[int]) -> str:
    if tokenizer is None:
        return bytes(ids).decode("utf-8", "replace")
    return tokenizer.decode(ids)
