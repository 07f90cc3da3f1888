"""Learner ranks as Ray actors: one step on 2 ranks equals one step of the local (one-process) learner on
the same batch (fp32, weights within 1e-5), across ZeRO stages and with the reference, the critic and
mini-batches; a dead rank ends the call with a clear error; rank metrics merge by their token shares."""

from __future__ import annotations

import os
import re
import signal
import threading
from functools import partial

import pytest
import torch
from safetensors.torch import load_file

from agentrl.config import AlgoConfig, ClusterConfig, CriticConfig, LearnerConfig
from agentrl.learner.rl import StepMetrics
from agentrl.types import Episode, TrainBatch

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # never a leftover cluster
    yield
    ray.shutdown()


def batch_of_two_groups() -> TrainBatch:
    """8 episodes, 2 groups of 4, ragged lengths, distinct rewards and behaviour logprobs."""
    g = torch.Generator().manual_seed(0)
    eps = []
    for i in range(8):
        ep = Episode(task_id=f"t{i // 4}", group_id=i // 4)
        prompt = [1] + torch.randint(20, 300, (3 + i % 3,), generator=g).tolist()
        gen = torch.randint(20, 300, (2 + (i * 5) % 4,), generator=g).tolist() + [2]
        ep.append(prompt, generated=False)
        ep.append(gen, generated=True, logprobs=(-1.0 - torch.rand(len(gen), generator=g)).tolist(),
                  versions=[0] * len(gen))
        ep.reward = float((i * 7) % 5) / 4
        eps.append(ep)
    return TrainBatch.from_episodes(eps, None, 0)


def build(model: str, zero: int, algo: AlgoConfig, mini_batches: int, max_step_kl: float | None = None):
    """What each rank runs to build its Learner (by reference to importable names: rank processes
    cannot import this test module)."""
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec

    cfg = LearnerConfig(lr=5e-3, zero_stage=zero, micro_batch_size=1, mini_batches=mini_batches,
                        max_step_kl=max_step_kl)
    critic = CriticConfig(zero_stage=zero) if algo.advantage.type == "gae" else None
    return partial(Learner, LearnerSpec(model, cfg, algo, 8, critic=critic, critic_path=model if critic else None))


def weights_after_step(model: str, ranks: int, zero: int, algo: AlgoConfig, mini_batches: int,
                       max_step_kl: float | None = None):
    """The weights, metrics and version after one step on the batch: on `ranks` Ray actors, or with
    ranks=0 in this process as the local backend runs it (the reference: a one-rank actor proved nothing
    more and cost an actor's cold imports of torch, DeepSpeed and transformers in each case)."""
    import ray
    from safetensors.torch import load

    from agentrl.learner.ray_ranks import RayLearner

    if ranks == 0:
        learner = build(model, zero, algo, mini_batches, max_step_kl)()
        metrics = learner.step(batch_of_two_groups())
        return learner.state_dict_cpu(), metrics, learner.version
    learner = RayLearner(build(model, zero, algo, mini_batches, max_step_kl), ClusterConfig(
        backend="ray", learner_ranks=ranks))
    learner.start()
    try:
        metrics = learner.step(batch_of_two_groups())
        ref, _ = learner.publish(learner.version, None)
        return load(ray.get(ref).tobytes()), metrics, learner.version
    finally:
        learner.shutdown()


@pytest.mark.parametrize("zero,algo,mini_batches,max_step_kl", [
    (0, AlgoConfig(kl={"type": "loss", "coef": 0.1}), 2, None),  # reference logprobs gathered; two optimizer steps
    # learner.max_step_kl: each rank measures the step on the gathered rows, so each shortens it alike
    (0, AlgoConfig(), 2, 1e-3),
    (2, AlgoConfig(advantage="gae", mode="bypass"), 1, None),  # critic values gathered; returns from GAE
    # ZeRO-3 partitions and gathers parameters across ranks; a KL loss at one optimizer step takes
    # pi_prox from the training pass, each rank its own rows, gathered for the KL metric
    (3, AlgoConfig(entropy_coef=0.01, kl={"type": "loss", "coef": 0.1}), 1, None),
], ids=["zero0-kl-2mini", "zero0-2mini-bounded", "zero2-gae", "zero3-entropy-kl"])
def test_two_ranks_step_like_one(ray_local, tiny_model, zero, algo, mini_batches, max_step_kl):
    one, m1, v1 = weights_after_step(tiny_model, 0, zero, algo, mini_batches, max_step_kl)
    two, m2, v2 = weights_after_step(tiny_model, 2, zero, algo, mini_batches, max_step_kl)
    assert v1 == v2 == mini_batches
    assert one.keys() == two.keys()
    diff = max(float((one[k] - two[k]).abs().max()) for k in one)
    start = load_file(os.path.join(tiny_model, "model.safetensors"))
    moved = max(float((one[k] - start[k]).abs().max()) for k in start if k in one)
    assert moved > 1e-4  # the step changed the weights, so agreeing is not trivial
    assert diff < 1e-5, diff
    for a, b in zip(m1, m2):
        assert b.loss == pytest.approx(a.loss, abs=1e-5)
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)
        assert b.n_tokens == a.n_tokens and b.share == pytest.approx(a.share)
        assert b.policy["prox_reused"] == a.policy["prox_reused"]
        assert (b.critic_loss is None) == (a.critic_loss is None) == (algo.advantage.type != "gae")
        if a.critic_loss is not None:  # each rank's is its share of the step's: they add up to the one rank's
            assert b.critic_loss == pytest.approx(a.critic_loss, abs=1e-5)
        if max_step_kl is not None:
            assert 0.0 < a.policy["step_scale"] < 1.0  # shortened (lr 5e-3 moves this model by a KL near 1)
            assert b.policy["moved_kl"] == pytest.approx(a.policy["moved_kl"], rel=1e-4)
            assert b.policy["step_scale"] == pytest.approx(a.policy["step_scale"], rel=1e-4)
        if algo.has_kl:
            assert b.policy["kl_seq_k1"] == pytest.approx(a.policy["kl_seq_k1"], abs=1e-6)
    if zero == 3:
        # The actor starts as the reference: KL 0 over the whole batch, on 2 ranks only if each took the
        # other's pi_prox rows (a row left out would count as 0 - log pi_ref, several nats).
        assert m2[0].policy["prox_reused"] == 1.0 and abs(m2[0].policy["kl_seq_k1"]) < 1e-6


def test_a_dead_rank_ends_the_step_with_a_clear_error(ray_local, tiny_model):
    from agentrl.learner.ray_ranks import LearnerRankDied, RayLearner

    learner = RayLearner(build(tiny_model, 0, AlgoConfig(), 1), ClusterConfig(backend="ray",
                                                                                       learner_ranks=2))
    learner.start()
    os.kill(learner.where[1]["pid"], signal.SIGKILL)
    outcome: dict = {}

    def step():
        try:
            learner.step(batch_of_two_groups())
        except LearnerRankDied as exc:
            outcome["error"] = str(exc)

    t = threading.Thread(target=step, daemon=True)
    t.start()
    t.join(timeout=300)  # a hang would keep it alive
    assert not t.is_alive()
    assert re.search(r"learner rank 1 on node [0-9a-f]{12} failed during a learner step", outcome["error"]), outcome
    assert outcome["error"].endswith("Run the same command with train.resume=auto to go on from the newest "
                                     "checkpoint, once the cluster can hold the learner ranks again")
    assert learner.ranks == []  # the survivors were ended too, not left waiting in a collective


def test_rank_metrics_merge_by_token_share():
    from agentrl.learner.ray_ranks import merge_rank_metrics

    r0 = [StepMetrics(-0.5, 2.0, 1.0, 8, 30, {"is_weight_mean": 1.0, "ratio_max": 1.1, "stale0/tokens": 30.0},
                      10, critic_loss=0.5)]
    r1 = [StepMetrics(-0.25, 2.0, 1.5, 8, 30, {"is_weight_mean": 1.3, "ratio_max": 1.4, "stale0/tokens": 30.0},
                      20, critic_loss=0.25)]
    (m,) = merge_rank_metrics([r0, r1])
    assert m.loss == pytest.approx(-0.75)  # each rank's loss is already its share of the step's
    assert m.policy["is_weight_mean"] == pytest.approx((10 * 1.0 + 20 * 1.3) / 30)
    assert m.policy["ratio_max"] == 1.4 and m.policy["stale0/tokens"] == 30.0
    assert m.critic_loss == pytest.approx(0.75)  # like `loss`, each rank's part of the step's
    assert (m.step_time_s, m.n_tokens, m.share, m.grad_norm) == (1.5, 30, 30, 2.0)


def test_two_ranks_resume_from_a_checkpoint_and_take_the_same_step(tiny_model, tmp_path, ray_local):
    """ZeRO-2 on 2 ranks: each rank writes its optimizer shard; fresh ranks load them and the next step
    gives the same weights as the ranks that never stopped."""
    import ray
    from safetensors.torch import load

    from agentrl.learner.ray_ranks import RayLearner

    def start():
        learner = RayLearner(build(tiny_model, 2, AlgoConfig(), 1), ClusterConfig(backend="ray", learner_ranks=2))
        learner.start()
        return learner

    def weights(learner):
        ref, _ = learner.publish(learner.version, None)
        return load(ray.get(ref).tobytes())

    a = start()
    try:
        a.step(batch_of_two_groups())
        a.save_checkpoint(str(tmp_path / "ckpt"))
        assert sorted(p.name for p in (tmp_path / "ckpt" / "actor").glob("zero_pp_rank_*")) == [
            "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
        a.step(batch_of_two_groups())
        expected = weights(a)
    finally:
        a.shutdown()
    b = start()
    try:
        digest = b.load_checkpoint(str(tmp_path / "ckpt"))
        assert b.version == 1 and digest["adam_step"] == 1
        b.step(batch_of_two_groups())
        got = weights(b)
    finally:
        b.shutdown()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
