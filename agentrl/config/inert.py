"""Settings that cannot act under the rest of the configuration: each one a start-up warning that names
it and says why, so a setting never does nothing silently. Pure: reads a `Config`, returns sentences.
A setting that belongs to a choice not taken is not warned about here: the config tree rejects it."""

from __future__ import annotations

from agentrl.config.schema import Config

_RATIO_LOSSES = ("ppo_clip", "gspo", "cispo")


def inert_settings(cfg: Config) -> list[str]:
    """One sentence per setting the user gave (or a default that matters) that has no effect here."""
    algo, given = cfg.algo, cfg.algo.model_fields_set
    out: list[str] = []

    def named(*keys: str) -> list[str]:
        return [k for k in keys if k in given]

    one_step = algo.mode == "decoupled" and cfg.learner.mini_batches == 1 and algo.policy_loss in _RATIO_LOSSES
    region = algo.trust_region
    if one_step:
        # The trust region has bounds of its own (algo.trust_region.eps_low, ...): PPO's clip is not read there.
        ratio_keys = (["dual_clip"] if algo.dual_clip is not None else []) + named("clip_low", "clip_high")
        bound = (f"the update is bounded by algo.trust_region={region.type}, which acts on pi_theta/mu with "
                 f"bounds of its own (algo.trust_region.eps_low/eps_high/tau)"
                 if region.type != "none" else
                 "bound the update with algo.trust_region (clip, neg_clip or m2), which acts on pi_theta/mu")
        for key in ratio_keys:
            out.append(f"algo.{key}={getattr(algo, key)} has no effect: with algo.mode=decoupled and "
                       f"learner.mini_batches=1 the ratio pi_theta/pi_prox is exactly 1 where the gradient is taken, "
                       f"so no ratio clip acts; {bound}")
    if not one_step and not named("trust_region") and region.type == "clip":
        # Until the trust region had bounds of its own, clip_low/clip_high also bounded it: say so to a
        # config written then, whose clip now bounds PPO's ratio only.
        for key, eps in (("clip_low", "eps_low"), ("clip_high", "eps_high")):
            if key in given and getattr(algo, key) != getattr(region, eps):
                out.append(f"algo.{key}={getattr(algo, key)} bounds PPO's ratio clip only; the trust region around "
                           f"mu keeps algo.trust_region.{eps}={getattr(region, eps)} (a {key} also set it before "
                           f"the trust region had bounds of its own): write algo.trust_region: {{type: clip, "
                           f"{eps}: {getattr(algo, key)}}} to bound both")
    if algo.mode == "bypass" and "correction" in given:
        out.append(f"algo.correction={algo.correction.type} has no effect: in algo.mode=bypass the ratio's denominator "
                   f"is mu itself, so the importance weight pi_old/mu is 1")
    if algo.mode == "bypass" and algo.policy_loss == "ppo_clip" and named("trust_region") and _within_ppo_clip(algo):
        out.append(f"algo.trust_region={region.type} repeats PPO's own clip in algo.mode=bypass, where the ratio "
                   f"is already taken against mu: its bounds are no tighter than algo.clip_low/clip_high, so every "
                   f"token it drops already has no gradient there; tighten algo.trust_region.eps_low/eps_high or "
                   f"set algo.trust_region=none")
    # Keys of a choice not taken (gamma without gae, a KL setting without a KL term, is_low without
    # mask, tau without m2, dual_clip with cispo) cannot be written any more: see agentrl.config.algo.
    stale, steps = cfg.buffer.max_staleness, cfg.learner.mini_batches
    if 0 < stale < steps:
        # Measured: at 4 steps a batch, bounds 1-3 trained at a mean staleness of 0.00 (docs/benchmarks.md).
        out.append(f"buffer.max_staleness={stale} lets no batch be generated ahead of the learner: a version is one "
                   f"optimizer step and learner.mini_batches={steps} takes {steps} a batch, so a batch generated while "
                   f"the one before trains is {steps} versions old when it trains; the run is synchronous, as at 0. "
                   f"Set it to {steps} or more for one batch of lead ({2 * steps} for two)")
    if cfg.learner.lora.rank > 0 and cfg.learner.lora.dropout > 0:
        out.append(f"learner.lora.dropout={cfg.learner.lora.dropout} has no effect in RL: every learner pass runs "
                   f"without dropout, so pi_prox, pi_theta and the reference are the same function of the weights")
    return out


def _within_ppo_clip(algo) -> bool:
    """A clip or neg_clip trust region drops only tokens that PPO's clip, taken against mu (bypass), already
    cuts off from the gradient: A < 0 below 1 - eps_low (and, for clip, A > 0 above 1 + eps_high)."""
    region = algo.trust_region
    if region.type not in ("clip", "neg_clip") or region.eps_low < algo.clip_low:
        return False
    return region.type == "neg_clip" or region.eps_high >= algo.clip_high
