"""Stage datasets -> token samples: `build_sft`, `build_pairs` (RM, DPO), `build_kto`, `build_prm`.

Each reads `data.paths` (mixed by `data.probs`, capped by `data.max_samples`), holds out the eval rows,
tokenises every row as rollouts would (`agentrl.data.render`) and drops, counting them, samples over
`data.max_len`. A row that cannot be used is a DataError naming its file, line and key: a dataset with a
silently skipped row would train on something other than what its author meant.

Row keys (all from `StageDataConfig`):
  * SFT: `messages_key` (a conversation, assistant turns trained), else `input_key` + `output_key`;
  * KTO: as SFT, plus `label_key`: true/false (or 1/0) for desirable or not;
  * RM, DPO: `chosen_key` and `rejected_key`, each a response string (with the prompt at `input_key`)
    or a whole conversation; the two sides may differ in kind;
  * PRM: see `agentrl.data.steps`.
"""

from __future__ import annotations

from agentrl.data.chat import ChatFormat
from agentrl.config.stages import StageDataConfig
from agentrl.data.errors import DataError
from agentrl.data.mixing import build
from agentrl.data.render import conversation, messages_of, prompt_response, tools_of
from agentrl.data.rows import Row, field
from agentrl.data.samples import Built, LabeledSample, PairSample, Sample, StepSample
from agentrl.data.steps import build_prm, prm_sample, prm_text_sample, reward_token_ids

__all__ = ["Built", "LabeledSample", "PairSample", "Sample", "StepSample", "build_kto", "build_pairs", "build_prm",
           "build_sft", "prm_sample", "prm_text_sample", "reward_token_ids", "sft_sample"]

_TEXT = "a string"


def sft_sample(cfg: StageDataConfig, fmt: ChatFormat, row: Row) -> Sample:
    """One SFT/KTO row: its conversation, or its prompt and response."""
    tools = tools_of(row, cfg)
    if cfg.messages_key is not None:
        tokens, mask = conversation(fmt, messages_of(row, cfg.messages_key), tools, row.at)
    else:
        prompt = field(row, cfg.input_key, (str,), _TEXT)
        response = field(row, cfg.output_key, (str,), _TEXT)
        tokens, mask = prompt_response(fmt, cfg, prompt, response, tools, row.at)
    return Sample(tokens, mask, row.where)


def _side(cfg: StageDataConfig, fmt: ChatFormat, row: Row, key: str) -> Sample:
    """One side of a pair: a conversation, or a response to the row's prompt."""
    value = field(row, key, (str, list), "a string or a list of messages")
    tools = tools_of(row, cfg)
    if isinstance(value, list):
        tokens, mask = conversation(fmt, messages_of(row, key), tools, row.at)
    else:
        prompt = field(row, cfg.input_key, (str,), f"a string (the prompt of the string {key!r})")
        tokens, mask = prompt_response(fmt, cfg, prompt, value, tools, row.at)
    return Sample(tokens, mask, row.where)


def _desirable(cfg: StageDataConfig, row: Row) -> bool:
    value = field(row, cfg.label_key, (bool, int), "true/false or 1/0 (desirable or not)")
    if not isinstance(value, bool) and value not in (0, 1):
        raise DataError(f"{row.at}: key {cfg.label_key!r} must be true/false or 1/0 (desirable or not), got {value}")
    return bool(value)


def build_sft(cfg: StageDataConfig, fmt: ChatFormat, seed: int) -> Built:
    """SFT samples: mask 1 on the response / assistant turns."""
    return build(cfg, seed, lambda row: sft_sample(cfg, fmt, row), lambda s: len(s.tokens))


def build_pairs(cfg: StageDataConfig, fmt: ChatFormat, seed: int) -> Built:
    """RM and DPO pairs; a pair is dropped when either side is over max_len."""
    def make(row: Row) -> PairSample:
        return PairSample(_side(cfg, fmt, row, cfg.chosen_key), _side(cfg, fmt, row, cfg.rejected_key))

    return build(cfg, seed, make, lambda p: max(len(p.chosen.tokens), len(p.rejected.tokens)))


def build_kto(cfg: StageDataConfig, fmt: ChatFormat, seed: int) -> Built:
    """KTO samples: an SFT sample and whether it is desirable."""
    def make(row: Row) -> LabeledSample:
        return LabeledSample(sft_sample(cfg, fmt, row), _desirable(cfg, row))

    return build(cfg, seed, make, lambda s: len(s.sample.tokens))
