"""Process-reward rows -> `StepSample`s: one scored position and one label per reasoning step.

Two row kinds. OpenRLHF's: `input_key` text with `prm.placeholder_token` ending each step and
`label_key` one label per placeholder; the text is tokenised piece by piece with the placeholder's own
tokens between pieces, so the placeholder is always the same tokens whatever text surrounds it, and its
last token is the scored position. And conversations (`messages_key`) with one label per assistant
message, scored at the EOS ending each assistant turn: the ledger rollouts build, so a PRM trained on
it scores an agent's own episodes (`prm_sample` without labels) at the tokens it was trained on.

A label is a reward-token string (its index in `prm.reward_tokens`), a bool, or 1/0: true and 1 mean
good (index 0), false and 0 bad (index 1).
"""

from __future__ import annotations

from typing import Any

from agentrl.data.chat import ChatFormat
from agentrl.config.stages import PRMConfig, StageDataConfig
from agentrl.data.errors import DataError
from agentrl.data.mixing import build
from agentrl.data.render import conversation, messages_of, template_text, tools_of
from agentrl.data.rows import Row, field
from agentrl.data.samples import Built, StepSample


def reward_token_ids(prm: PRMConfig, fmt: ChatFormat) -> list[int]:
    """The token id of each reward token; each must be exactly one token (its logit is the score)."""
    if len(prm.reward_tokens) < 2:
        raise DataError(f"prm.reward_tokens: need at least two (good first), got {prm.reward_tokens}")
    ids = []
    for token in prm.reward_tokens:
        encoded = fmt.encode(token)
        if len(encoded) != 1:
            raise DataError(f"prm.reward_tokens: {token!r} is {len(encoded)} tokens for this tokenizer "
                            f"({encoded}); each reward token must encode to exactly one token")
        ids.append(encoded[0])
    if len(set(ids)) != len(ids):
        raise DataError(f"prm.reward_tokens: {prm.reward_tokens} encode to repeated token ids {ids}")
    return ids


def _label(value: Any, prm: PRMConfig, at: str, key: str, i: int) -> int:
    if isinstance(value, bool):
        return 0 if value else 1
    if isinstance(value, int) and value in (0, 1):
        return 1 - value
    if isinstance(value, str) and value in prm.reward_tokens:
        return prm.reward_tokens.index(value)
    raise DataError(f"{at}: key {key!r} item {i}: {value!r} is not a step label (one of "
                    f"{prm.reward_tokens}, true/false or 1/0)")


def eos_positions(mask: list[int]) -> list[int]:
    """The last index of each run of 1s in a ledger mask: the EOS that ends each assistant turn."""
    return [i for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]


def prm_sample(fmt: ChatFormat, messages: list[dict], labels: list[int] | None, where: str,
               tools: list | None = None) -> StepSample:
    """A conversation's StepSample: the rollout ledger, one position per assistant turn (its EOS).
    `labels` None (a scorer) gives no labels; given, there must be one per assistant message."""
    tokens, mask = conversation(fmt, messages, tools, where)
    positions = eos_positions(mask)
    if labels is not None and len(labels) != len(positions):
        raise DataError(f"{where}: {len(labels)} step labels for {len(positions)} assistant messages")
    return StepSample(tokens, positions, list(labels or []), where)


def prm_text_sample(fmt: ChatFormat, text: str, placeholder: str, labels: list[int] | None, where: str,
                    first: str | None = None) -> StepSample:
    """OpenRLHF's row kind: `text` split on `placeholder`, each piece tokenised on its own and followed by
    the placeholder's tokens; step i is scored at the last token of its placeholder. `first` replaces
    the first piece's text (the prompt through `input_template`)."""
    mark = fmt.encode(placeholder)
    if not mark:
        raise DataError(f"prm.placeholder_token: {placeholder!r} encodes to no tokens")
    pieces = text.split(placeholder)
    if first is not None:
        pieces[0] = first
    if labels is not None and len(labels) != len(pieces) - 1:
        raise DataError(f"{where}: {len(labels)} step labels for {len(pieces) - 1} steps (each step ends with "
                        f"the placeholder {placeholder!r})")
    tokens: list[int] = []
    positions = []
    for i, piece in enumerate(pieces):
        tokens += fmt.encode(piece)
        if i < len(pieces) - 1:
            tokens += mark
            positions.append(len(tokens) - 1)
    return StepSample(tokens, positions, list(labels or []), where)


def build_prm(cfg: StageDataConfig, prm: PRMConfig, fmt: ChatFormat, seed: int) -> Built:
    """The PRM stage's samples: conversations when `messages_key` is set, else placeholder text."""
    reward_token_ids(prm, fmt)  # a config error, before reading any row
    if cfg.messages_key is None and cfg.apply_chat_template:
        raise DataError("data.apply_chat_template: PRM rows of placeholder text are tokenised raw or through "
                        "data.input_template; for chat-formatted steps set data.messages_key")

    def make(row: Row) -> StepSample:
        raw = field(row, cfg.label_key, (list,), "a list of step labels")
        labels = [_label(v, prm, row.at, cfg.label_key, i) for i, v in enumerate(raw)]
        if cfg.messages_key is not None:
            messages = messages_of(row, cfg.messages_key)
            sample = prm_sample(fmt, messages, None, row.at, tools_of(row, cfg))
            if len(labels) != len(sample.positions):
                raise DataError(f"{row.at}: key {cfg.label_key!r} has {len(labels)} step labels for "
                                f"{len(sample.positions)} assistant messages in {cfg.messages_key!r}")
            return StepSample(sample.tokens, sample.positions, labels, row.where)
        text = field(row, cfg.input_key, (str,), "a string (steps ending with the placeholder)")
        head = text.split(prm.placeholder_token, 1)[0]
        first = template_text(cfg, head, row.at) if cfg.input_template is not None else None
        if len(labels) != text.count(prm.placeholder_token):
            raise DataError(f"{row.at}: key {cfg.label_key!r} has {len(labels)} step labels for "
                            f"{text.count(prm.placeholder_token)} steps in {cfg.input_key!r} (each ends with "
                            f"the placeholder {prm.placeholder_token!r})")
        return prm_text_sample(fmt, text, prm.placeholder_token, labels, row.where, first)

    return build(cfg, seed, make, lambda s: len(s.tokens))
