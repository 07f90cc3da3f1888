"""agentrl.utils.padding, the one right-padding helper, against hand-written tensors."""

from __future__ import annotations

import torch

from agentrl.utils.padding import pad_right, pad_tokens


def test_pad_right_fills_after_each_row():
    out = pad_right([[1.5, 2.0], [], [3.0]], -1.0, torch.float32)
    assert out.dtype == torch.float32
    assert out.tolist() == [[1.5, 2.0], [-1.0, -1.0], [3.0, -1.0]]


def test_pad_right_to_a_given_width():
    assert pad_right([[7], [8, 9]], 0, torch.long, width=4).tolist() == [[7, 0, 0, 0], [8, 9, 0, 0]]


def test_pad_tokens_gives_ids_and_attention():
    ids, attn = pad_tokens([[5, 6, 7], [8]], pad_id=2)
    assert ids.tolist() == [[5, 6, 7], [8, 2, 2]] and ids.dtype == torch.long
    assert attn.tolist() == [[1, 1, 1], [1, 0, 0]] and attn.dtype == torch.long
