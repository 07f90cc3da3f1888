"""Token-budget micro-batches and packed sequences give the padded path's step: on a ragged batch (rows of 3 to
300 tokens, one far longer than the rest, one with nothing scored, env tokens between turns), for every policy
loss, every advantage estimator (GAE with its critic), both KL modes, the row-wise aggregations, ZeRO 0 and 3,
LoRA and 2 ranks, the loss, the gradients handed to the optimizer, the advantages, values, entropy and every
metric equal those of the padded path run as one micro-batch (the whole batch at once). The critic's passes run
packed too (its values and its optimizer's gradients are compared with a value head that is not zero).

Tolerances: the paths compute the same sums in another order (other matrix shapes, the softmax over a shorter
or block-masked row, micro-batch gradients added one by one), about sqrt(n) * 2^-24 relative per reduction of
n terms; a forward through the tiny model reduces over at most 300 positions and 128 features, a step's
gradient over ~900 tokens: ~1e-6 relative to each quantity's scale (`optimizer_steps.GRAD_ATOL_OF_MAX` for
gradients). Metrics and losses: rtol 1e-5 on top, for values that are themselves sums of such terms.
"""

from __future__ import annotations

import os

import pytest
import torch

from agentrl.config import AlgoConfig, CriticConfig, LearnerConfig, LoraConfig
from agentrl.learner.packing import padding_ratio, plan_micro_batches, row_lengths
from agentrl.learner.spec import LearnerSpec
from agentrl.types import Episode, TrainBatch
from optimizer_steps import assert_same_gradients, gradients_of_each_step

RTOL, ATOL = 1e-5, 1e-6
BUDGET = 320  # tokens: the 300-token row runs alone, the rest in a few micro-batches
MODES = {"budget": {"micro_batch_tokens": BUDGET}, "packed": {"micro_batch_tokens": BUDGET, "pack_sequences": True}}
PADDED = {"micro_batch_size": 8}  # the reference: the whole batch, padded, in one micro-batch
# (prompt, [(generated, env) per turn]) lengths: 3 to 300 tokens, row 3 much longer, row 4 has nothing scored
SHAPES = [(2, [(1, 0)]), (4, [(5, 3), (4, 0)]), (6, [(24, 0)]), (5, [(100, 50), (145, 0)]),
          (8, []), (3, [(20, 10), (12, 0)]), (7, [(13, 0)]), (4, [(30, 6), (20, 0)])]


def ragged_batch() -> TrainBatch:
    """8 episodes in 2 groups of 4 (a group shares its prompt's first tokens), ragged as SHAPES."""
    g = torch.Generator().manual_seed(0)
    eps = []
    for i, (prompt, turns) in enumerate(SHAPES):
        ep = Episode(task_id=f"t{i // 4}", group_id=i // 4)
        ep.append([1, 20 + i // 4] + torch.randint(20, 300, (prompt - 2,), generator=g).tolist(), generated=False)
        for gen, env in turns:
            ep.append(torch.randint(20, 300, (gen,), generator=g).tolist(), generated=True,
                      logprobs=(-0.5 - 2 * torch.rand(gen, generator=g)).tolist(), versions=[0] * gen)
            ep.append(torch.randint(20, 300, (env,), generator=g).tolist(), generated=False)
        ep.reward = float((i * 7) % 5) / 4
        eps.append(ep)
    return TrainBatch.from_episodes(eps, None, 0)


def build(model: str, algo: AlgoConfig, critic_path: str | None = None, **cfg):
    """The learner; with GAE its critic starts from `critic_path` (default: the policy's folder, a zero head)
    at the actor's ZeRO stage."""
    from agentrl.learner.rl import Learner

    gae = algo.advantage.type == "gae"
    critic = CriticConfig(lr=1e-3, zero_stage=cfg.get("zero_stage", 0)) if gae else None
    torch.manual_seed(0)  # LoRA's A matrices start random: every path starts from the same ones
    spec = LearnerSpec(model, LearnerConfig(lr=1e-2, **cfg), algo, 8, critic=critic,
                       critic_path=(critic_path or model) if critic else None)
    return Learner(spec)


def one_step(model: str, algo: AlgoConfig, critic_path: str | None = None, **cfg):
    """(step metrics, gradients each optimizer step was handed, the batch's advantages after the step, its
    returns: the critic's targets under GAE, else None)."""
    learner = build(model, algo, critic_path, **cfg)
    batch = ragged_batch()
    with gradients_of_each_step() as grads:
        (m,) = learner.step(batch)
    return m, grads, batch.advantages, batch.returns


def adv_atol_of(algo: AlgoConfig, want) -> float:
    """The advantages' absolute tolerance. Under GAE they carry the critic's values' errors (~ATOL relative
    to the values' scale, a forward's): A_t = sum_k (gamma lam)^k delta_{t+k}, each delta_t = r_t + gamma
    V_{t+1} - V_t holding two values, so a value error e moves an advantage by up to e (1 + gamma) /
    (1 - gamma lam), 18x at 0.99 and 0.9. `want`: a `one_step`; its returns are V + A."""
    if algo.advantage.type != "gae":
        return ATOL
    gamma, lam = algo.advantage.gamma, algo.advantage.lam
    values = want[3] - want[2]
    return ATOL * max(float(values.abs().max()), 1.0) * (1 + gamma) / (1 - gamma * lam)


def assert_same_step(got, want, adv_atol: float = ATOL) -> None:
    (m, grads, adv, _), (m0, grads0, adv0, _) = got, want
    assert m.loss == pytest.approx(m0.loss, rel=RTOL, abs=ATOL)
    assert m.grad_norm == pytest.approx(m0.grad_norm, rel=RTOL, abs=ATOL)
    assert (m.critic_loss is None) == (m0.critic_loss is None)
    if m0.critic_loss is not None:
        assert m.critic_loss == pytest.approx(m0.critic_loss, rel=RTOL, abs=ATOL)
    keys = set(m0.policy) - {"padding_ratio", "lr"}
    assert keys <= set(m.policy), keys - set(m.policy)
    for key in sorted(keys):
        assert m.policy[key] == pytest.approx(m0.policy[key], rel=RTOL, abs=ATOL), key
    torch.testing.assert_close(adv, adv0, rtol=RTOL, atol=adv_atol)
    assert_same_gradients(grads, grads0)


GAE = AlgoConfig(advantage={"type": "gae", "gamma": 0.99, "lam": 0.9})
ALGOS = {
    **{f"loss-{name}": AlgoConfig(policy_loss=name) for name in ("ppo_clip", "gspo", "cispo")},
    **{f"adv-{name}": AlgoConfig(advantage=name) for name in ("dr_grpo", "rloo", "reinforce_pp",
                                                               "reinforce_pp_baseline")},
    "adv-gae": GAE,
    "kl-loss": AlgoConfig(kl={"type": "loss", "coef": 0.1, "estimator": "k3"}, entropy_coef=0.01),
    "kl-reward": AlgoConfig(kl={"type": "reward", "coef": 0.1}),
    "agg-seq-mean": AlgoConfig(agg="seq_mean_token_mean"),
    "agg-constant": AlgoConfig(agg="constant", policy_loss="gspo"),
}


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_budget_and_packed_steps_equal_the_padded_step(tiny_model, name):
    algo = ALGOS[name]
    want = one_step(tiny_model, algo, **PADDED)
    for mode, cfg in MODES.items():
        got = one_step(tiny_model, algo, **cfg)
        assert got[0].policy["padding_ratio"] < want[0].policy["padding_ratio"], mode
        assert_same_step(got, want)


@pytest.mark.parametrize("extra", [{"zero_stage": 3}, {"lora": LoraConfig(rank=4, alpha=8)}], ids=["zero3", "lora"])
def test_zero3_and_lora_steps_equal_the_padded_step(tiny_model, extra):
    algo = AlgoConfig(kl={"type": "loss", "coef": 0.1})
    want = one_step(tiny_model, algo, **PADDED, **extra)
    for cfg in MODES.values():
        assert_same_step(one_step(tiny_model, algo, **cfg, **extra), want)


def test_forward_passes_equal_the_padded_ones(tiny_model):
    """pi_theta, the reference and the critic's values (its head made non-zero) under top-p truncation and with
    a group's prompt run once where the padded and budget paths share it: the padded path's numbers."""
    learner = build(tiny_model, AlgoConfig(advantage={"type": "gae"}, kl={"type": "loss", "coef": 0.1}), **PADDED)
    with torch.no_grad():
        head = next(m for n, m in learner.critic.module.named_modules() if n.endswith("value_head"))
        head.weight.normal_(generator=torch.Generator().manual_seed(1))
    learner.top_p = 0.9
    batch = ragged_batch()

    def passes():
        return learner.logprobs(batch), learner.reference_logprobs(batch), learner.values(batch)

    want = passes()
    assert float(want[2].abs().max()) > 0.1 and float(want[0].abs().max()) > 1.0
    learner.share_min_saved = 0.0  # every group with a common prompt runs it once
    for cfg in ({}, *MODES.values()):
        learner.cfg = learner.cfg.model_copy(update=cfg)
        for got, ref in zip(passes(), want):
            torch.testing.assert_close(got, ref, rtol=RTOL, atol=ATOL * float(ref.abs().max()))


@pytest.fixture(scope="module")
def critic_folder(tiny_model, tmp_path_factory) -> str:
    """A saved critic whose value head is not zero: its values, and so the advantages and the body's
    gradients, are non-zero from the first step (a head of zeros would leave the body's gradient at 0)."""
    from agentrl.learner.models import ValueModel

    critic = ValueModel.from_pretrained(tiny_model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        critic.value_head.weight.normal_(generator=g)
        critic.value_head.bias.fill_(0.25)
    out = tmp_path_factory.mktemp("critic")
    critic.save_pretrained(out)
    return str(out)


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_the_critic_runs_packed_and_its_steps_equal_the_padded_ones(tiny_model, critic_folder, monkeypatch,
                                                                    zero_stage):
    """GAE with a critic of non-zero values, actor and critic at ZeRO `zero_stage`: the packed step's values
    pass and the critic's training pass both run packed over every row, and both optimizer steps (actor, then
    critic), the advantages and every metric (critic/* included) equal the padded step's."""
    from agentrl.learner import micro_passes

    algo = GAE
    want = one_step(tiny_model, algo, critic_folder, **PADDED, zero_stage=zero_stage)
    assert float(want[2].abs().max()) > 0.1 and abs(want[0].policy["critic/value_mean"]) > 0.1
    calls: list[tuple[bool, list[int]]] = []

    def spy(critic, ids_NT, lengths_N):
        calls.append((torch.is_grad_enabled(), lengths_N.tolist()))
        return packed_values(critic, ids_NT, lengths_N)

    packed_values = micro_passes.packed_values
    monkeypatch.setattr(micro_passes, "packed_values", spy)
    got = one_step(tiny_model, algo, critic_folder, **MODES["packed"], zero_stage=zero_stage)
    lengths = sorted(row_lengths(ragged_batch().attention_mask).tolist())
    for grad in (False, True):  # the no-grad values pass, then the critic's micro-steps: every row, packed
        assert sorted(n for g, ns in calls if g == grad for n in ns) == lengths, (grad, calls)
    assert len(want[1]) == len(got[1]) == 2  # the actor's optimizer step and the critic's
    assert_same_step(got, want, adv_atol_of(algo, want))


def test_plans_cover_every_row_once_within_the_budget_balanced_over_ranks():
    lengths = row_lengths(ragged_batch().attention_mask)
    assert sorted(lengths.tolist()) == [3, 8, 16, 20, 30, 45, 60, 300]
    for packed in (False, True):
        for world in (1, 2, 3):
            plan = plan_micro_batches(lengths, range(8), world, 8, BUDGET, packed)
            assert len({len(p) for p in plan}) == 1  # every rank runs as many micro-steps
            rows = torch.cat([m.rows for p in plan for m in p])
            assert sorted(rows.tolist()) == list(range(8))
            for m in (m for p in plan for m in p if not m.empty):
                cost = int(lengths[m.rows].sum()) if packed else len(m.rows) * m.width
                assert m.width == int(lengths[m.rows].max()) and (cost <= BUDGET or len(m.rows) == 1)
            loads = [int(lengths[torch.cat([m.rows for m in p])].sum()) for p in plan]
            assert max(loads) - min(loads) <= 300  # longest first to the least loaded: within one row


def test_padding_ratio_counts_the_positions_each_plan_computes():
    # rows of 4, 2 and 1 tokens: padded to 4 in one micro-batch: 12 positions for 7 real ones; a budget of 8:
    # [4, 2] at width 4 and [1]: 9; packed: all three in one row of 7.
    lengths = torch.tensor([4, 2, 1])
    assert padding_ratio(plan_micro_batches(lengths, range(3), 1, 3, None), lengths) == pytest.approx(12 / 7)
    assert padding_ratio(plan_micro_batches(lengths, range(3), 1, 3, 8), lengths) == pytest.approx(9 / 7)
    assert padding_ratio(plan_micro_batches(lengths, range(3), 1, 3, 8, packed=True), lengths) == 1.0


def test_pack_sequences_without_a_budget_is_refused():
    with pytest.raises(ValueError, match="pack_sequences needs learner.micro_batch_tokens"):
        LearnerConfig(pack_sequences=True, micro_batch_tokens=None)
    with pytest.raises(ValueError, match="pack_sequences needs learner.micro_batch_tokens"):
        LearnerConfig(pack_sequences=True, micro_batch_size=8)  # rows asked for: no budget to pack into


def test_the_default_is_a_token_budget_unless_rows_are_asked_for():
    assert LearnerConfig().micro_batch_tokens == 4096
    assert LearnerConfig(pack_sequences=True).micro_batch_tokens == 4096
    # micro_batch_size alone keeps the meaning it had before the default changed: that many rows a micro-batch
    assert LearnerConfig(micro_batch_size=8).micro_batch_tokens is None
    assert LearnerConfig(micro_batch_size=8, micro_batch_tokens=512).micro_batch_tokens == 512
    # and so does a run's saved config, which writes both keys
    dumped = LearnerConfig(micro_batch_size=8).model_dump()
    assert LearnerConfig.model_validate(dumped).micro_batch_tokens is None
    assert LearnerConfig.model_validate(LearnerConfig().model_dump()).micro_batch_tokens == 4096


# -- 2 ranks ----------------------------------------------------------------------------------------------

TWO_RANK_CASES = {"budget-ppo_clip-zero0": (AlgoConfig(), {**MODES["budget"]}),
                  "packed-gspo-zero3": (AlgoConfig(policy_loss="gspo"), {**MODES["packed"], "zero_stage": 3}),
                  "packed-gae-zero0": (GAE, {**MODES["packed"]})}  # the critic from `critic_folder`


def _critic_of(algo: AlgoConfig, critic_folder: str) -> str | None:
    return critic_folder if algo.advantage.type == "gae" else None


def _rank_main(rank: int, port: int, model: str, critic_folder: str, queue) -> None:
    """One of 2 learner ranks (a spawned process): each case's step, sent back to the test."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    for name, (algo, cfg) in TWO_RANK_CASES.items():
        m, grads, adv, _ = one_step(model, algo, _critic_of(algo, critic_folder), **cfg)
        # numpy arrays travel by value; a tensor would travel as shared memory this process frees on exit
        grads = [[g.numpy() for g in step] for step in grads] if cfg.get("zero_stage", 0) == 0 else None
        m.token_values = {k: v.numpy() for k, v in m.token_values.items()}  # the viewer's (B, T) values, by value
        queue.put((rank, name, m, grads, adv.numpy()))


def test_two_ranks_equal_the_padded_step_of_one(tiny_model, critic_folder):
    import multiprocessing

    from agentrl.learner.dist import free_port
    from agentrl.learner.ray_ranks import merge_rank_metrics

    ctx = multiprocessing.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, tiny_model, critic_folder, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(2 * len(TWO_RANK_CASES)):
            rank, name, m, grads, adv = queue.get(timeout=240)
            grads = None if grads is None else [[torch.from_numpy(g) for g in step] for step in grads]
            got.setdefault(name, {})[rank] = (m, grads, torch.from_numpy(adv))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    for name, (algo, cfg) in TWO_RANK_CASES.items():
        want = one_step(tiny_model, algo, _critic_of(algo, critic_folder), **PADDED, zero_stage=cfg.get("zero_stage", 0))
        (merged,) = merge_rank_metrics([[got[name][r][0]] for r in range(2)])
        grads = got[name][0][1]
        if grads is None:  # ZeRO-3: each rank holds a partition; the global norm stands for the gradient
            grads, want = want[1], want
        assert_same_step((merged, grads, got[name][0][2], None), want, adv_atol_of(algo, want))
        torch.testing.assert_close(got[name][1][2], got[name][0][2])  # both ranks computed the same advantages
        for key, value in got[name][0][0].token_values.items():  # every rank returns the whole batch's, gathered
            assert (got[name][1][0].token_values[key] == value).all(), key
