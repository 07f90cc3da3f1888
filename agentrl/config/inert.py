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
    if one_step:
        # trust_region clip reads both bounds (around mu), neg_clip only clip_low
        used = {"clip": ("clip_low", "clip_high"), "neg_clip": ("clip_low",)}.get(algo.trust_region, ())
        ratio_keys = ["dual_clip"] if algo.dual_clip is not None else []
        ratio_keys += [k for k in named("clip_low", "clip_high") if k not in used]
        bound = (f"the update is bounded by algo.trust_region={algo.trust_region}, which acts on pi_theta/mu"
                 if algo.trust_region != "none" else
                 "bound the update with algo.trust_region (clip, neg_clip or m2), which acts on pi_theta/mu")
        for key in ratio_keys:
            out.append(f"algo.{key}={getattr(algo, key)} has no effect: with algo.mode=decoupled and "
                       f"learner.mini_batches=1 the ratio pi_theta/pi_prox is exactly 1 where the gradient is taken, "
                       f"so no ratio clip acts; {bound}")
    if algo.mode == "bypass" and "correction" in given:
        out.append(f"algo.correction={algo.correction.type} has no effect: in algo.mode=bypass the ratio's denominator "
                   f"is mu itself, so the importance weight pi_old/mu is 1")
    if algo.mode == "bypass" and algo.policy_loss == "ppo_clip" and algo.trust_region in ("clip", "neg_clip") \
            and named("trust_region"):
        out.append(f"algo.trust_region={algo.trust_region} repeats PPO's own clip in algo.mode=bypass, where the "
                   f"ratio is already taken against mu")
    # Keys of a choice not taken (gamma without gae, a KL setting without a KL term, is_low without
    # mask, m2_tau without m2, dual_clip with cispo) cannot be written any more: see agentrl.config.algo.
    if cfg.learner.lora.rank > 0 and cfg.learner.lora.dropout > 0:
        out.append(f"learner.lora.dropout={cfg.learner.lora.dropout} has no effect in RL: every learner pass runs "
                   f"without dropout, so pi_prox, pi_theta and the reference are the same function of the weights")
    return out
