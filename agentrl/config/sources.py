"""Reward sources: a typed union on `type` (env | rule | http | reward_model | prm), each with its own settings.

The settings of remote endpoints (`EndpointConfig`, shared by verifiers and tool servers) and of
reward models live here rather than next to their clients, so a wrong key such as
`http: {read_timeot_s: 3}` fails at config load with the nearest valid key, like every other key,
and `agentrl.config` imports nothing from `rewards/`.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentrl.config.base import StrictModel


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class EndpointConfig(_Frozen):
    """One HTTP endpoint and how hard to try it."""

    url: str = Field(description="URL of the endpoint.")
    connect_timeout_s: float = Field(5.0, gt=0, le=300, description="TCP/TLS connect deadline per attempt.")
    read_timeout_s: float = Field(30.0, gt=0, le=3600, description="Max wait between bytes of the response.")
    write_timeout_s: float = Field(10.0, gt=0, le=3600, description="Max wait while sending the request.")
    pool_timeout_s: float = Field(10.0, gt=0, le=3600, description="Max wait for a pooled connection.")
    max_retries: int = Field(3, ge=0, le=20, description="Retries after the first attempt (attempts = 1 + this).")
    backoff_base_s: float = Field(0.25, ge=0, le=60, description="Backoff scale: sleep ~ U(0, base * 2**retry).")
    backoff_max_s: float = Field(10.0, ge=0, le=600, description="Cap on one backoff sleep and on Retry-After.")
    max_concurrency: int = Field(64, ge=1, le=4096, description="Requests in flight to this endpoint at most.")
    auth_env: str | None = Field(
        None, description="Name of an env var holding a bearer token (sent as Authorization: Bearer ...)."
    )
    max_response_bytes: int = Field(1 << 20, ge=64, le=1 << 30, description="Larger response bodies are an error.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        return url

    @model_validator(mode="after")
    def _backoff_order(self) -> "EndpointConfig":
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s must be >= backoff_base_s")
        return self


class VerifierConfig(EndpointConfig):
    """One verifier endpoint and how hard to try it."""

    url: str = Field(description="Full URL the episode is POSTed to, e.g. http://host:8000/verify.")


class RewardModelConfig(StrictModel):
    """One reward model and how its requests are batched."""

    path: str = Field(description="local Hugging Face folder of a sequence classifier with num_labels=1")
    max_batch_size: int = Field(32, ge=1, le=4096, description="requests scored by one forward pass at most")
    max_wait_s: float = Field(0.01, ge=0.0, le=10.0,
                              description="longest a request waits for others to join its batch")
    max_length: int = Field(512, ge=1, le=1_048_576,
                            description="tokens scored per episode; longer ones keep their last max_length")
    timeout_s: float = Field(60.0, gt=0.0, le=86_400.0,
                             description="a request without a score this long after the call is a timeout")
    device: str = Field("cpu", description="torch device of the model, e.g. 'cpu', 'cuda', 'cuda:1'")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="weights dtype")
    deepspeed: bool = Field(False, description="run the frozen model in a DeepSpeed eval-only engine, as the "
                                               "learner's reference (ZeRO-0, or ZeRO-3 with offload)")
    offload: bool = Field(False, description="with deepspeed: ZeRO-3 with the parameters kept on CPU")
    scale: float = Field(1.0, allow_inf_nan=False, description="reward = scale * score + shift")
    shift: float = Field(0.0, allow_inf_nan=False, description="reward = scale * score + shift")


class PRMScorerConfig(StrictModel):
    """One process reward model (a causal LM trained by `python -m agentrl.prm`) and how its step scores
    become an episode's reward. The reward tokens must be the ones it was trained with (`prm.reward_tokens`)."""

    path: str = Field(description="local Hugging Face folder of a causal LM saved by the prm stage")
    aggregate: Literal["min", "last", "mean"] = Field(
        "min", description="episode reward from the step scores: min (one bad step spoils the episode), "
                           "last (the final step's score) or mean")
    reward_tokens: list[str] = Field(default_factory=lambda: ["+", "-"], min_length=2, max_length=64,
                                     description="label tokens as trained, the good label first; a step's score "
                                                 "is the softmax over their logits, at the good one")
    max_length: int = Field(2048, ge=8, le=1_048_576,
                            description="tokens per episode at most (the prm stage's data.max_len default); a "
                                        "longer episode is an error result, never cut: every step reads its context")
    device: str = Field("cpu", description="torch device of the model, e.g. 'cpu', 'cuda', 'cuda:1'")


class _SourceBase(StrictModel):
    name: str = Field(description="label in metrics (reward/<name>/...) and in episode.info['rewards']")
    weight: float = Field(1.0, ge=-1000, le=1000, description="multiplier of this source's value")


class EnvSource(_SourceBase):
    """The env's own step rewards, summed over the episode."""

    type: Literal["env"] = Field(description="env: the env's own step rewards")


class RuleSource(_SourceBase):
    """A rule function `(completion, answer) -> float` imported by path."""

    type: Literal["rule"] = Field(description="rule: a function (completion, answer) -> float")
    rule: str = Field(description="'package.module:function', e.g. rewards.rules:numeric_match")
    answer_key: str = Field("answer", description="the task field holding the reference answer")


class HttpSource(_SourceBase):
    """A remote verifier URL (`rewards.http_verifier.HttpVerifier`)."""

    type: Literal["http"] = Field(description="http: a verifier URL")
    http: VerifierConfig = Field(description="the verifier endpoint: url, timeouts, retries, concurrency cap")


class RewardModelSource(_SourceBase):
    """A local sequence classifier (`rewards.reward_model.RewardModelScorer`)."""

    type: Literal["reward_model"] = Field(description="reward_model: a local sequence classifier")
    reward_model: RewardModelConfig = Field(description="the reward model folder and its batching")


class PRMSource(_SourceBase):
    """A local process reward model scoring each assistant turn (`rewards.prm.PRMScorer`)."""

    type: Literal["prm"] = Field(description="prm: a local process reward model, one score per assistant turn")
    prm: PRMScorerConfig = Field(description="the PRM folder, its reward tokens and the step-score aggregate")


RewardSourceConfig = Annotated[Union[EnvSource, RuleSource, HttpSource, RewardModelSource, PRMSource],
                               Field(discriminator="type")]
SOURCE_TYPES: dict[str, type[_SourceBase]] = {
    "env": EnvSource, "rule": RuleSource, "http": HttpSource, "reward_model": RewardModelSource, "prm": PRMSource}


class RewardsConfig(StrictModel):
    """Where rewards come from and what happens when a source fails."""

    sources: list[RewardSourceConfig] = Field(default_factory=list,
                                              description="reward sources; empty = the env's own reward")
    on_failure: Literal["retry", "drop"] = Field(
        "retry", description="a failed source is asked again (retry) or the episode is dropped at once (drop)")
    max_retries: int = Field(2, ge=0, le=20, description="episode-level re-asks of a failed source (retry)")

    @model_validator(mode="after")
    def _unique_names(self) -> "RewardsConfig":
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"reward source names must be unique, got {names}")
        return self
