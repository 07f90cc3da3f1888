"""The `algo` section: RL math as registry names and typed sub-configs that hold only their own keys.

A setting that applies under one choice lives inside that choice (prime-rl's shape): the advantage
estimator, the KL term and the off-policy correction are sub-configs discriminated by `type`, so
`gamma` can only be written inside `advantage: {type: gae}`, a KL setting only inside a `kl` term and a
trust region's bounds only inside `trust_region`: no key is read under one choice and ignored under another.
A bare string is the short form of a sub-config with its defaults (`advantage: grpo` is
`advantage: {type: grpo}`). Keys of the old flat layout (`algo.kl_coef`, ...) are named in
`MOVED_KEYS`: the loader answers them with the new place in one line.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (Discriminator, Field, SerializerFunctionWrapHandler, Tag, field_validator, model_serializer,
                      model_validator)

from agentrl.config.base import StrictModel
from agentrl.config.teacher import TeacherConfig

# Old flat key -> where it lives now (one-line "moved" errors; see agentrl.config.load).
MOVED_KEYS = {
    "rollout.tool_parser": "rollout.tool_format (the same names: hermes, mistral, none, or module:name)",
    "algo.gamma": "algo.advantage.gamma (with algo.advantage.type gae)",
    "algo.lam": "algo.advantage.lam (with algo.advantage.type gae)",
    "algo.value_clip": "algo.advantage.value_clip (with algo.advantage.type gae)",
    "algo.kl_coef": "algo.kl.coef (algo.kl: {type: loss|reward, coef: ...})",
    "algo.kl_estimator": "algo.kl.estimator (with algo.kl.type loss)",
    "algo.kl_mode": "algo.kl.type (loss or reward)",
    "algo.kl_controller": "algo.kl.controller.type (fixed or adaptive)",
    "algo.kl_target": "algo.kl.controller.target (with algo.kl.controller.type adaptive)",
    "algo.kl_horizon": "algo.kl.controller.horizon (with algo.kl.controller.type adaptive)",
    "algo.correction_level": "algo.correction.level (with algo.correction.type tis or mask)",
    "algo.is_low": "algo.correction.low (with algo.correction.type mask)",
    "algo.is_high": "algo.correction.high (with algo.correction.type tis or mask)",
    "algo.m2_tau": "algo.trust_region.tau (with algo.trust_region.type m2)",
}

# Built-in policy losses that take the PPO clipped surrogate, the only place dual_clip acts.
DUAL_CLIP_LOSSES = ("ppo_clip", "gspo")


def moved_error(dotted: str, table: dict[str, str] = MOVED_KEYS) -> str | None:
    """The one-line error for a key of an old layout (`table`: old dotted key -> new place), else None."""
    new = table.get(dotted)
    return f"{dotted} moved: use {new}" if new else None


def short_form(value: Any) -> Any:
    """`grpo` -> `{type: grpo}`: a bare string names a sub-config's type and keeps its defaults."""
    return {"type": value} if isinstance(value, str) else value


def type_of(value: Any) -> Any:
    """The `type` of a sub-config given as a mapping, a bare string or a built model."""
    if isinstance(value, str):
        return value
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


class GaeAdvantage(StrictModel):
    """PPO's GAE: per-token advantages from a learned critic (the `critic` section)."""

    type: Literal["gae"] = Field(description="generalised advantage estimation with a value model")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda")
    value_clip: float = Field(0.2, ge=0.0, description="critic value clipping around the old values; 0 = off")
    whiten: bool = Field(False, description="advantages to mean 0, std 1 over the batch's generated tokens "
                                            "(verl, OpenRLHF); the critic's targets are unchanged")


class ScalarAdvantage(StrictModel):
    """An estimator of one advantage per episode, from the rewards alone (no critic, no settings)."""

    type: str = Field(description="grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, turn_grpo, "
                                  "state_grpo, or 'package.module:name' for an estimator that module registers "
                                  "with agentrl.algo.register_advantage")

    @classmethod
    def registered(cls) -> list[str]:
        """The names this class stands for: every registered estimator but gae."""
        from agentrl.algo import ADVANTAGES

        return sorted(set(ADVANTAGES) - {"gae"})

    @field_validator("type")
    @classmethod
    def _registered(cls, name: str) -> str:
        from agentrl.algo import ADVANTAGES
        from agentrl.utils.registry import lookup

        lookup(ADVANTAGES, name, "algo.advantage.type")
        return name


# The estimator registry is open (register_advantage), so only gae has a class of its own; every
# other registered name is a ScalarAdvantage.
Advantage = Annotated[Union[Annotated[GaeAdvantage, Tag("gae")], Annotated[ScalarAdvantage, Tag("scalar")]],
                      Discriminator(lambda v: "gae" if type_of(v) == "gae" else "scalar")]


class FixedKL(StrictModel):
    """The KL weight stays algo.kl.coef."""

    type: Literal["fixed"] = Field(description="constant KL weight")


class AdaptiveKL(StrictModel):
    """Ziegler et al.'s controller: the weight starts at algo.kl.coef and follows the measured KL to a target."""

    type: Literal["adaptive"] = Field(description="KL weight adapted towards target")
    target: float = Field(6.0, gt=0, description="target KL per sequence")
    horizon: int = Field(10000, ge=1, description="horizon in episodes")


KLController = Annotated[Union[FixedKL, AdaptiveKL], Field(discriminator="type")]


class _KLTerm(StrictModel):
    type: str  # narrowed to a Literal by each term; declared here so that it is listed first
    coef: float = Field(gt=0.0, le=100.0, description="weight of the KL(pi || reference) term (the adaptive "
                                                      "controller's starting value); a KL term builds a frozen "
                                                      "reference model")
    controller: KLController = Field(default_factory=lambda: FixedKL(type="fixed"),
                                     description="fixed, or adaptive: {type: adaptive, target, horizon}")

    @field_validator("controller", mode="before")
    @classmethod
    def _short(cls, v: Any) -> Any:
        return short_form(v)


class NoKL(StrictModel):
    """No KL term and no reference model."""

    type: Literal["none"] = Field(description="no KL term")


class LossKL(_KLTerm):
    """coef * KL estimate added to the policy loss (GRPO)."""

    type: Literal["loss"] = Field(description="KL estimate in the loss")
    estimator: Literal["k1", "k2", "k3"] = Field("k3", description="per-token KL estimator (GRPO uses k3)")


class RewardKL(_KLTerm):
    """DeepSpeed-Chat's per-token reward -coef * (log pi_old - log pi_ref), the sequence reward at the end."""

    type: Literal["reward"] = Field(description="KL penalty in the reward")


KLTerm = Annotated[Union[NoKL, LossKL, RewardKL], Field(discriminator="type")]


class NoCorrection(StrictModel):
    """The importance weight pi_prox/mu is not applied."""

    type: Literal["none"] = Field(description="no importance weight")


class _Weighted(StrictModel):
    type: str  # narrowed to a Literal by each correction; declared here so that it is listed first
    level: Literal["token", "sequence"] = Field("token", description="per token weight, or per sequence "
                                                                    "(geometric mean of its token weights)")
    ess_step: bool = Field(False, description="multiply the loss by the normalised effective sample size of the "
                                              "raw weights, (sum w)^2 / (n sum w^2) (VCPO's variance-controlled "
                                              "step): a batch dominated by a few weights moves the policy less")


class TISCorrection(_Weighted):
    """Truncated importance sampling: w <- min(w, high)."""

    type: Literal["tis"] = Field(description="truncated importance weight")
    high: float = Field(2.0, ge=1.0, description="truncation cap of the weight")


class MaskCorrection(_Weighted):
    """Tokens (or sequences) whose weight leaves [low, high] are dropped (weight 0)."""

    type: Literal["mask"] = Field(description="weights outside [low, high] masked out")
    low: float = Field(0.5, ge=0.0, le=1.0, description="lower bound of the weight")
    high: float = Field(2.0, ge=1.0, description="upper bound of the weight")


Correction = Annotated[Union[NoCorrection, TISCorrection, MaskCorrection], Field(discriminator="type")]


class NoTrustRegion(StrictModel):
    """Every token is kept, however far pi_theta has moved from mu."""

    type: Literal["none"] = Field(description="no trust region around mu")


class ClipTrustRegion(StrictModel):
    """PPO's clip anchored at mu: drop tokens whose rho = pi_theta/mu has left [1 - eps_low, 1 + eps_high]
    the way their advantage pushes (A < 0 below, A > 0 above). Its own bounds: PPO's ratio clip
    (algo.clip_low / clip_high) acts on pi_theta/pi_old, a different ratio."""

    type: Literal["clip"] = Field(description="both sides, in the advantage's direction")
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="A < 0 tokens with rho < 1 - eps_low are dropped")
    eps_high: float = Field(0.2, ge=0.0, le=10.0, description="A > 0 tokens with rho > 1 + eps_high are dropped")
    half_life: float | None = Field(None, gt=0.0, description="bounds that tighten with a token's age a (learner "
                                                              "version minus the version that sampled it): "
                                                              "eps(a) = eps * 2^(-a / half_life); None = fixed")
    level: Literal["token", "sequence"] = Field("token", description="sequence: rho_i = exp(mean_t log rho_t) and "
                                                                     "the sequence's mean advantage decide for all "
                                                                     "its tokens (a trust region for GSPO)")

    @model_validator(mode="after")
    def _one_refinement(self) -> "ClipTrustRegion":
        if self.half_life is not None and self.level == "sequence":
            raise ValueError("algo.trust_region.half_life applies per token: use it with level token, or drop it")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The two refinements are written only when set, so a plain clip dumps (and a run's saved config
        # reads) as it did before they existed.
        out = handler(self)
        if out.get("half_life") is None:
            out.pop("half_life", None)
        if out.get("level") == "token":
            out.pop("level", None)
        return out


class NegClipTrustRegion(StrictModel):
    """Only the A < 0 side of `clip`: pushing a token down is not self-limiting, pushing one up is."""

    type: Literal["neg_clip"] = Field(description="only A < 0 tokens cut below mu")
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="A < 0 tokens with rho < 1 - eps_low are dropped")


class M2TrustRegion(StrictModel):
    """M2PO: drop the tokens with the largest (log rho)^2 until the mean over the kept ones is <= tau."""

    type: Literal["m2"] = Field(description="bound on the second moment of log pi_theta/mu")
    tau: float = Field(0.04, gt=0.0, description="bound on the mean squared log ratio")


TrustRegion = Annotated[Union[NoTrustRegion, ClipTrustRegion, NegClipTrustRegion, M2TrustRegion],
                        Field(discriminator="type")]


class AlgoConfig(StrictModel):
    """RL math: registry names and their settings (agentrl.algo); a choice's own settings live inside it."""

    advantage: Advantage = Field(default_factory=lambda: ScalarAdvantage(type="grpo"),
                                 description="estimator: a name in agentrl.algo.ADVANTAGES (short form) or "
                                             "{type: gae, gamma, lam, value_clip}")
    policy_loss: str = Field("ppo_clip", description="ppo_clip, gspo, cispo, or 'package.module:name' for a loss "
                                                      "that module registers with agentrl.algo.register_policy_loss")
    mode: Literal["decoupled", "bypass"] = Field(
        "decoupled", description="decoupled: learner recomputes pi_prox; bypass: vLLM's mu is the old policy")
    clip_low: float = Field(0.2, ge=0.0, le=1.0, description="PPO ratio lower clip epsilon, on pi_theta/pi_old "
                                                            "(the trust region around mu has its own bounds)")
    clip_high: float = Field(0.2, ge=0.0, le=10.0, description="PPO ratio upper clip epsilon, on pi_theta/pi_old")
    dual_clip: float | None = Field(None, gt=1.0, description="dual-clip PPO constant c > 1 (None = off); only "
                                                              "with the clipped surrogate (ppo_clip, gspo)")
    correction: Correction = Field(default_factory=lambda: TISCorrection(type="tis"),
                                   description="importance weight pi_prox/mu: none, tis {level, high} or "
                                               "mask {level, low, high}")
    trust_region: TrustRegion = Field(
        default_factory=lambda: ClipTrustRegion(type="clip"),
        description="trust region around the behaviour policy mu, acting on rho = pi_theta/mu at any number of "
                    "mini-batches: clip {eps_low, eps_high} drops tokens pushed past [1-eps_low, 1+eps_high] the "
                    "way their advantage points, neg_clip {eps_low} only those with A < 0, m2 {tau} the largest "
                    "(log rho)^2 until their mean is <= tau (M2PO), or none; clip's half_life tightens its bounds "
                    "with a token's age, its level: sequence takes it per sequence (GSPO)")
    agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant"] = Field(
        "token_mean", description="loss aggregation")
    constant_norm: float = Field(1.0, gt=0.0, description="'constant' aggregation divides the token sum by "
                                                          "B * constant_norm")
    entropy_coef: float = Field(0.0, ge=0.0, le=1.0, description="entropy bonus coefficient")
    kl: KLTerm = Field(default_factory=lambda: NoKL(type="none"),
                       description="KL(pi || reference): none, loss {coef, estimator, controller} or reward "
                                   "{coef, controller}")
    reward_clip: float | None = Field(None, gt=0, description="clamp episode rewards to [-c, c] (None = off)")
    reward_norm: bool = Field(False, description="divide rewards by a running std over all batches, mean removed")
    dynamic_filter: bool = Field(False, description="drop groups whose rewards are all equal and sample more "
                                                    "until the batch is full (DAPO); the drop rate is a metric; the "
                                                    "run ends (NoLearningSignal) after max(256, 16 x groups a "
                                                    "batch) dropped in a row")
    teacher: TeacherConfig | None = Field(None, description="on-policy distillation: {model, coef, env_advantage, "
                                                            "env_weight, placement}; None = off")

    @model_validator(mode="before")
    @classmethod
    def _moved_or_misplaced(cls, data: Any) -> Any:
        # Python callers (AlgoConfig(kl_coef=...)) get the loader's one-line answers too.
        from agentrl.config.variants import misplaced, variants

        for key, value in data.items() if isinstance(data, dict) else ():
            field = cls.model_fields.get(key)
            members = variants(field.annotation) if field is not None else []
            msg = moved_error(f"algo.{key}") or (misplaced(short_form(value), members, f"algo.{key}")
                                                 if members else None)
            if msg:
                raise ValueError(msg)
        return data

    @field_validator("advantage", "kl", "correction", "trust_region", mode="before")
    @classmethod
    def _short(cls, v: Any) -> Any:
        return short_form(v)

    @model_validator(mode="after")
    def _applies(self) -> "AlgoConfig":
        from agentrl.algo import POLICY_LOSSES
        from agentrl.utils.registry import lookup

        lookup(POLICY_LOSSES, self.policy_loss, "algo.policy_loss")
        # A registered loss of your own may read dual_clip; of the built-ins only the clipped surrogate does.
        if self.dual_clip is not None and self.policy_loss in ("cispo",):
            raise ValueError(f"algo.dual_clip applies only with algo.policy_loss {' or '.join(DUAL_CLIP_LOSSES)} "
                             f"(the clipped surrogate), not {self.policy_loss}")
        return self

    @property
    def has_kl(self) -> bool:
        """A KL term is configured: the learner builds a frozen reference model."""
        return self.kl.type != "none"
