"""Chat-template rendering for the token ledger: the first prompt, then only suffixes.

Earlier turns are never re-tokenised. After the model's turn (which ends with the EOS token it
sampled), the env's new messages are rendered with the chat template and only the text that the
template adds after that EOS is tokenised and appended. The suffix is found by rendering a fixed
dummy conversation with and without the new messages, so any Qwen/ChatML-style template works.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Message = dict[str, Any]

# tokenizer_config classes that mean "tokenizer.json is the whole tokenizer" (what agentrl saves).
_FILE_BACKED = {"PreTrainedTokenizerFast", "TokenizersBackend"}


def load_tokenizer(path: str | Path) -> Any:
    """Load a model folder's tokenizer exactly as it was saved.

    transformers 5 swaps in its own Qwen2 pre-tokenizer for folders whose config says qwen2 (it
    re-splits digits), so a tokenizer saved as a plain tokenizer.json, like the embedded default's,
    would tokenize differently from how the model was trained. Such folders load from the file;
    everything else goes through AutoTokenizer as usual.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(path) / "tokenizer_config.json"
    if config.exists() and json.loads(config.read_text()).get("tokenizer_class") in _FILE_BACKED:
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)

_DUMMY = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]


class ChatFormat:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_id: int = tokenizer.eos_token_id
        self.eos_text: str = tokenizer.eos_token
        base = self.render(_DUMMY, generation_prompt=False)
        if self.eos_text not in base:
            raise ValueError(f"chat template never emits the EOS token {self.eos_text!r} after a turn")
        self._base = base
        # What the template writes between the assistant's EOS and the next message (ChatML: "\n").
        self._after_eos = base[base.rindex(self.eos_text) + len(self.eos_text):]
        self.continuation([{"role": "user", "content": "u"}])  # fail at start-up, not in every episode

    def render(self, messages: list[Message], generation_prompt: bool, tools: list | None = None) -> str:
        kwargs = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def initial(self, messages: list[Message], tools: list | None = None) -> list[int]:
        """Tokens of the first prompt, ending with the assistant generation header."""
        return self.encode(self.render(messages, generation_prompt=True, tools=tools))

    def continuation(self, new_messages: list[Message]) -> list[int]:
        """Tokens to append after an assistant turn that ended with EOS: the template's text after
        the EOS, the new messages, and the next assistant generation header."""
        full = self.render(_DUMMY + list(new_messages), generation_prompt=True)
        if not full.startswith(self._base):
            raise ValueError("chat template is not append-only: rendering more messages changed earlier text")
        return self.encode(self._after_eos + full[len(self._base):])

    def assistant_tokens(self, content: str) -> list[int]:
        """Tokens a model would emit for `content` (used for demonstrations): content then EOS."""
        return self.encode(content) + [self.eos_id]


def ledger_from_messages(fmt: ChatFormat, messages: list[Message]) -> tuple[list[int], list[int]]:
    """(tokens, loss_mask) for a finished conversation: assistant turns are trained (mask 1),
    everything else is context (mask 0). Mirrors rollout.episode.run_episode's ledger."""
    first_asst = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    tokens = fmt.initial(messages[:first_asst])
    mask = [0] * len(tokens)
    i = first_asst
    while i < len(messages):
        turn = fmt.assistant_tokens(messages[i]["content"])
        tokens += turn
        mask += [1] * len(turn)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if i + 1 < j:
            suffix = fmt.continuation(messages[i + 1:j])
            tokens += suffix
            mask += [0] * len(suffix)
        i = j
    return tokens, mask
