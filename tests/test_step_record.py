"""A learner step's metrics.jsonl line (`agentrl.run.step_record`) when a batch has several optimizer steps:
each step's own metrics in `policy_steps`, and policy/* from the last step that has each key (a step that
learner.target_kl skips ran no training pass, and has no loss or grad_norm of its own). The pool, buffer and
batch are stand-ins with only what the record reads: this is a unit test of one function."""

from __future__ import annotations

from types import SimpleNamespace

from agentrl.learner.rl import StepMetrics
from agentrl.run.step_record import step_record


def _pool() -> SimpleNamespace:
    return SimpleNamespace(generated_tokens=100, status_counts={"ok": 2}, scorer=None,
                           spec=SimpleNamespace(server=None), tool_stats=SimpleNamespace(metrics=lambda: {}))


def _step(policy: dict, loss: float, grad_norm: float = 0.5, share: float = 8.0) -> StepMetrics:
    return StepMetrics(loss=loss, grad_norm=grad_norm, step_time_s=1.0, n_episodes=2, n_tokens=8, policy=policy,
                       share=share)


def test_a_batchs_steps_are_each_recorded_and_policy_keys_come_from_the_last_step_that_has_them():
    episodes = [SimpleNamespace(reward=1.0, success=True), SimpleNamespace(reward=0.0, success=False)]
    assembly = SimpleNamespace(episodes=episodes, staleness_hist={"0": 2}, dropped_stale=0)
    buffer = SimpleNamespace(stats=lambda: {"groups_admitted": 1})
    trained = {"entropy": 0.7, "clip_frac": 0.01, "lr": 3e-4}
    stopped = {"step_kl": 0.2, "kl_stopped": 1.0, "lr": 3e-4}
    rec = step_record(3, assembly, [_step(trained, -0.4), _step(stopped, 0.0, float("nan"), 0.0)], [], _pool(),
                      {"tokens": 0, "time": 0.0}, 0, buffer)
    assert rec["policy_steps"] == [trained, stopped]
    assert (rec["policy/entropy"], rec["policy/clip_frac"]) == (0.7, 0.01)  # the first step's: the second ran none
    assert (rec["policy/step_kl"], rec["policy/kl_stopped"]) == (0.2, 1.0)
    assert (rec["loss"], rec["grad_norm"]) == (-0.4, 0.5)  # the step that trained, not the stopped one's 0 and nan
    assert rec["learner_step_s"] == 2.0 and rec["reward_mean"] == 0.5 and rec["buffer/groups_admitted"] == 1

    single = step_record(4, assembly, [_step(trained, -0.4)], [], _pool(), {"tokens": 0, "time": 0.0}, 0, buffer)
    assert "policy_steps" not in single and single["policy/entropy"] == 0.7  # one step a batch: as before
    frozen = step_record(5, assembly, [_step({"actor_frozen": 1.0}, 0.0, float("nan"), 0.0)], [], _pool(),
                         {"tokens": 0, "time": 0.0}, 0, buffer)
    assert frozen["loss"] == 0.0  # no step trained the actor (learner.freeze_actor_steps): the batch's last
