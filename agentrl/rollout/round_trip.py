"""Whether a finished episode's ledger is its conversation rendered at once (`agentrl.check`).

Rollout builds the ledger piece by piece: the first prompt, then each model turn as sampled, then only
the suffix the template adds for the env's reply (`agentrl.data.chat.ChatFormat`). It round-trips when it is
the tokenizer's encoding of the chat template's rendering of the whole conversation (`Episode.messages`,
with the tools that episode's env declared), ending with the generation prompt when the conversation ends
on a non-assistant message; when it ends on the model's turn, the rendering may go on only with what the
template writes after that turn (the EOS of a turn cut at max_tokens, then `ChatFormat.after_eos`). A
ledger trimmed to the context length is compared up to where it ends.

Each model turn's tokens must decode to the text the conversation holds, and are compared as the
tokenizer writes that text: a model that sampled another tokenisation of it ("1", "2" for "12"), or whose
text joins the template's in one token at the turn's edge (a turn starting with "\\n" after the
template's "\\n"), gets a note, not a failure: that is the model's doing, and the ledger keeps what it
sampled. AgentEnv episodes are not compared: their session renders each request against the ledger and
starts a new segment where the two differ (`agentrl.rollout.session`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.data.chat import common_prefix_len
from agentrl.types import Episode


@dataclasses.dataclass
class RoundTrip:
    failure: str = ""  # why the ledger is not the template's rendering; "" when it is, or was not compared
    notes: list[str] = dataclasses.field(default_factory=list)
    compared: bool = True


def decode(fmt: Any, ids: list[int]) -> str:
    return fmt.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _canonical(ep: Episode, fmt: Any) -> tuple[list[int], list[tuple[str, int]], list[str], str]:
    """The ledger with each model turn as the tokenizer writes its text (EOS kept where sampled), the
    place of each of its tokens (("prompt", 0), ("turn", k), or ("env", k): the reply after turn k), a
    note per turn sampled otherwise, and why a turn's tokens are not its text ("" when all are)."""
    canon: list[int] = []
    where: list[tuple[str, int]] = []
    notes: list[str] = []
    pos = 0
    for k, turn in enumerate(ep.turns, 1):
        canon += ep.tokens[pos:turn.start]
        where += [("prompt", 0) if k == 1 else ("env", k - 1)] * (turn.start - pos)
        sampled = ep.tokens[turn.start:turn.start + turn.n_generated]
        eos = [fmt.eos_id] if sampled and sampled[-1] == fmt.eos_id else []
        said = fmt.tokenizer.decode(sampled[:len(sampled) - len(eos)])  # as rollout decodes a turn
        if said != turn.text:
            return canon, where, notes, f"turn {k}'s tokens decode to {said[:40]!r}, the conversation holds " \
                                        f"{turn.text[:40]!r}"
        written = fmt.encode(turn.text) + eos
        if written != sampled:
            notes.append(f"turn {k}: the model sampled {len(sampled)} tokens for text the tokenizer writes in "
                         f"{len(written)}; the ledger keeps the sampled ones")
        canon += written
        where += [("turn", k)] * len(written)
        pos = turn.start + turn.n_generated
    canon += ep.tokens[pos:]
    where += [("env", len(ep.turns)) if ep.turns else ("prompt", 0)] * (len(ep.tokens) - pos)
    return canon, where, notes, ""


def _place(where: tuple[str, int]) -> str:
    kind, k = where
    return {"prompt": "the prompt", "turn": f"turn {k}", "env": f"the env's reply after turn {k}"}[kind]


def round_trip(ep: Episode, fmt: Any, tools: list | None, is_agent: bool) -> RoundTrip:
    """Whether the ledger is the template's rendering of the whole conversation, tokenised at once."""
    if is_agent:
        return RoundTrip(notes=["an AgentEnv's session renders each request against the ledger"], compared=False)
    if not ep.messages:
        return RoundTrip(notes=["nothing to compare: the env gave no first observation"], compared=False)
    canon, where, notes, wrong = _canonical(ep, fmt)
    if wrong:
        return RoundTrip(wrong, notes)
    ends_open = ep.messages[-1]["role"] != "assistant"
    text = fmt.render(ep.messages, generation_prompt=ends_open, tools=tools)
    whole = fmt.encode(text)
    last = ep.turns[-1] if ep.turns else None
    if (last.start + last.n_generated + last.env_tokens if last else ep.prompt_len) > len(ep.tokens):
        notes.append("compared up to max_model_len, where the ledger was cut")
        whole = whole[:len(canon)]
    n = common_prefix_len(canon, whole)
    if n == len(canon):
        rest = decode(fmt, whole[n:])
        cut = last is not None and not ends_open and ep.tokens[-1] != fmt.eos_id
        if rest in ("", "" if ends_open else (fmt.eos_text if cut else "") + fmt.after_eos):
            return RoundTrip(notes=notes)
        return RoundTrip(f"the template's rendering goes on after the ledger ends: {rest[:60]!r}", notes)
    held = decode(fmt, canon)
    if not text.startswith(held):
        c = common_prefix_len(held, text)
        return RoundTrip(f"the template renders other text than the ledger holds at char {c} (in {_place(where[n])})"
                         f": the ledger has {held[c:c + 40]!r}, the template {text[c:c + 40]!r}", notes)
    at = f"token {n} (in {_place(where[n])}): the ledger has {decode(fmt, canon[n:n + 6])!r}, the whole " \
         f"conversation {decode(fmt, whole[n:n + 6])!r}"
    edge = [k for kind, k in where[n:n + 2] if kind == "turn"]
    if edge:
        notes.append(f"turn {edge[0]}'s text joins the template's in other tokens when the conversation is "
                     f"tokenised at once, at {at}; not compared past it")
        return RoundTrip(notes=notes)
    return RoundTrip(f"the template's pieces tokenise differently than the whole conversation at {at}", notes)
