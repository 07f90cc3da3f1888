"""On-policy distillation (algo.teacher): the math against a slow loop and hand-computed values, the config's
errors, the tokenizer check, the learner's teacher pass (temperature 1, full vocabulary; packed = padded),
the engine placement's scorer on multi-row episodes, the one builder of the frozen models, and one short real run per placement whose batches'
teacher log-probs and advantages are checked against a loop over the recorded ledger (tests/distill_run.py)."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from agentrl.algo import combine_advantages, distill_advantages, distill_metrics
from agentrl.config import AlgoConfig, ConfigError, LearnerConfig, load_config
from agentrl.types import Episode, TrainBatch

ROOT = Path(__file__).resolve().parent.parent


def loop_advantages(mu, teacher, mask, coef, env=None, env_weight=None):
    """A_t = -coef (mu_t - teacher_t) [+ w env_t] on scored tokens, one position at a time."""
    out = torch.zeros(len(mu), len(mu[0]))
    for b in range(len(mu)):
        for t in range(len(mu[b])):
            if mask[b][t]:
                out[b, t] = -coef * (mu[b][t] - teacher[b][t]) + (env_weight * env[b][t] if env_weight else 0.0)
    return out


def test_distill_advantage_and_metrics_against_hand_values_and_a_loop():
    mu = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, float("nan"), -0.25]])
    teacher = torch.tensor([[0.0, -1.5, -1.0, 0.0], [0.0, -0.5, float("inf"), -1.25]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])  # row 1 position 2: a tool token
    adv = distill_advantages(mu, teacher, mask, coef=2.0)
    # by hand: -2 (mu - teacher): row 0: -2 * 0.5 = -1, -2 * -1 = 2; row 1: 0, -2 * 1 = -2; NaN/inf unscored
    torch.testing.assert_close(adv, torch.tensor([[0.0, -1.0, 2.0, 0.0], [0.0, 0.0, 0.0, -2.0]]), rtol=0, atol=0)
    torch.testing.assert_close(adv, loop_advantages(mu.tolist(), teacher.tolist(), mask.tolist(), 2.0), rtol=0, atol=0)
    env = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, -0.5, 0.0, -0.5]])
    both = combine_advantages(adv, env, 0.5)
    torch.testing.assert_close(both, loop_advantages(mu.tolist(), teacher.tolist(), mask.tolist(), 2.0, env.tolist(), 0.5))
    torch.testing.assert_close(combine_advantages(adv, env, None), adv, rtol=0, atol=0)
    m = distill_metrics(mu, teacher, mask)
    # k1 per token: 0.5, -1, 0, 1 -> mean 0.125; per row sums -0.5 and 1 -> mean 0.25; teacher mean (-1.5-1-0.5-1.25)/4
    assert m["distill/kl_token"] == pytest.approx(0.125)
    assert m["distill/kl_seq"] == pytest.approx(0.25)
    assert m["distill/teacher_logp"] == pytest.approx(-4.25 / 4)


def test_random_batches_match_the_loop():
    g = torch.Generator().manual_seed(0)
    mu, teacher = -torch.rand(5, 9, generator=g) * 3, -torch.rand(5, 9, generator=g) * 3
    mask = (torch.rand(5, 9, generator=g) > 0.4).float()
    env = torch.randn(5, 9, generator=g) * mask
    got = combine_advantages(distill_advantages(mu, teacher, mask, 0.7), env, 1.5)
    want = loop_advantages(mu.tolist(), teacher.tolist(), mask.tolist(), 0.7, env.tolist(), 1.5)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("override, message", [
    ("algo.teacher={model: t, env_weight: 2}", "algo.teacher.env_weight applies only with algo.teacher.env_advantage add"),
    ("algo.teacher={model: t, coef: 0}", "algo.teacher.coef: Input should be greater than 0"),
    ("algo.teacher={model: t, placement: gpu}", "algo.teacher.placement"),
    ("algo.teacher={model: t, env_advantage: mix}", "algo.teacher.env_advantage"),
    ("algo.teacher={coef: 1}", "algo.teacher.model: Field required"),
    ("algo.teacher={model: t, placment: engine}", "did you mean 'algo.teacher.placement'"),
])
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_config(None, [override])


def test_config_defaults_and_add():
    cfg = load_config(None, ["algo.teacher={model: /m, env_advantage: add, env_weight: 0.25}"])
    t = cfg.algo.teacher
    assert (t.coef, t.placement, t.env_scale) == (1.0, "learner", 0.25)
    assert load_config(None, ["algo.teacher={model: /m}"]).algo.teacher.env_scale is None
    assert load_config(None, []).algo.teacher is None


def test_a_teacher_with_another_tokenizer_is_a_start_up_error_naming_both(tmp_path, tiny_model, tiny_tokenizer):
    from agentrl.data.chat import load_tokenizer
    from agentrl.models.teacher import resolve_teacher

    other = tmp_path / "other"
    shutil.copytree(tiny_model, other)
    tok = load_tokenizer(other)
    tok.add_tokens(["<|tool_result|>"], special_tokens=True)
    tok.save_pretrained(other)
    student = load_tokenizer(tiny_model)
    cfg = load_config(None, [f"model.path={tiny_model}", f"algo.teacher={{model: {other}}}"])
    with pytest.raises(ConfigError) as err:
        resolve_teacher(cfg, tiny_model, student)
    assert f"algo.teacher.model={str(other)!r}" in str(err.value) and f"model.path={tiny_model!r}" in str(err.value)
    assert "vocabularies differ" in str(err.value) and "1 only the teacher's" in str(err.value)
    same = load_config(None, [f"model.path={tiny_model}", f"algo.teacher={{model: {tiny_model}}}"])
    assert resolve_teacher(same, tiny_model, student) == tiny_model
    missing = load_config(None, [f"algo.teacher={{model: {tmp_path / 'nope' / 'x'}}}"])
    with pytest.raises(ConfigError, match=r"algo\.teacher\.model='.*nope/x': no such folder"):
        resolve_teacher(missing, tiny_model, student)


def test_the_learner_says_when_the_batch_lacks_the_teachers_log_probs():
    from agentrl.config import TeacherConfig
    from agentrl.learner.teacher import distill_into

    batch = TrainBatch.from_episodes(_episodes(), torch.ones(2), 0)
    with pytest.raises(RuntimeError, match="algo.teacher \\(placement engine\\): the batch has no teacher log-probs"):
        distill_into(batch, TeacherConfig(model="t", placement="engine"))


def _episodes() -> list[Episode]:
    eps = []
    for toks in ([1, 275, 201, 301, 299, 310, 2, 40, 41, 320, 2], [1, 275, 201, 301, 299, 305, 2, 44, 45, 46, 2]):
        ep = Episode(task_id="t", group_id=0)
        ep.append(toks[:5], generated=False)
        ep.append(toks[5:7], generated=True, logprobs=[-0.5, -0.25], versions=[0, 0])
        ep.append(toks[7:9], generated=False)  # a tool result: not scored
        ep.append(toks[9:], generated=True, logprobs=[-1.0, -0.125], versions=[0, 0])
        eps.append(ep)
    return eps


def perturbed_copy(src: str, dst: Path, scale: float = 0.05) -> str:
    from transformers import AutoModelForCausalLM

    from agentrl.data.chat import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    model.save_pretrained(dst)
    load_tokenizer(src).save_pretrained(dst)
    return str(dst)


def hf_loop_logprobs(folder: str, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) log p(ids[t] | ids[:t]) from a plain Hugging Face forward of each row alone, float32, temperature 1."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = torch.zeros(input_ids.shape, dtype=torch.float32)
    with torch.no_grad():
        for b in range(len(input_ids)):
            n = int(attention_mask[b].sum())
            logp = torch.log_softmax(model(input_ids=input_ids[b:b + 1, :n]).logits[0].float(), -1)
            for t in range(1, n):
                out[b, t] = logp[t - 1, input_ids[b, t]]
    return out


@pytest.mark.parametrize("pack", [False, True])
def test_learner_teacher_scores_at_temperature_1_and_fills_the_advantage(tmp_path, tiny_model, pack):
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec

    teacher = perturbed_copy(tiny_model, tmp_path / "teacher")
    algo = AlgoConfig(teacher={"model": teacher, "coef": 0.5, "env_advantage": "add", "env_weight": 2.0})
    cfg = LearnerConfig(lr=1e-4, micro_batch_size=1, pack_sequences=pack, micro_batch_tokens=64 if pack else None)
    learner = Learner(LearnerSpec(tiny_model, cfg, algo, 2, temperature=0.7, top_p=0.9, teacher_path=teacher))
    batch = TrainBatch.from_episodes(_episodes(), None, 0)
    batch.rewards = torch.tensor([1.0, 0.0])
    (m,) = learner.step(batch)
    want = hf_loop_logprobs(teacher, batch.input_ids, batch.attention_mask) * batch.loss_mask
    # float32 forwards of one model: the learner's micro-batched (or packed) pass and a row-by-row loop
    torch.testing.assert_close(batch.teacher_logprobs, want, rtol=0, atol=1e-5)
    from agentrl.algo import ADVANTAGES, AdvantageInputs

    env = ADVANTAGES["grpo"](AdvantageInputs(rewards_B=batch.rewards, group_ids_B=batch.group_ids,
                                             mask_BT=batch.loss_mask)).advantages_BT
    assert float(env.abs().max()) > 0.5  # the env's term is there to be added
    ref = loop_advantages(batch.behav_logprobs.tolist(), want.tolist(), batch.loss_mask.tolist(), 0.5, env.tolist(), 2.0)
    torch.testing.assert_close(batch.advantages, ref, rtol=0, atol=1e-5)
    kl = float(((batch.behav_logprobs - want) * batch.loss_mask).sum() / batch.loss_mask.sum())
    assert m.policy["distill/kl_token"] == pytest.approx(kl, abs=1e-5) and math.isfinite(m.loss)


@pytest.mark.parametrize("offload", [False, True], ids=["zero0", "offloaded-zero3"])
def test_the_reference_and_the_teacher_share_one_frozen_builder(tmp_path, tiny_model, offload):
    """`frozen_causal_lm` (the reference's and the learner-placed teacher's builder): the folder's float32
    weights, frozen, in eval mode, its dropout off, placed as learner.reference_offload says; its logits are
    those of a plain Hugging Face forward of the folder."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.learner.dist import init_single_process_dist
    from agentrl.learner.models import frozen_causal_lm

    folder = perturbed_copy(tiny_model, tmp_path / "teacher")
    config = AutoConfig.from_pretrained(folder)
    config.attention_dropout = 0.25  # a model trained with dropout: frozen passes must not apply it
    config.save_pretrained(folder)
    init_single_process_dist()
    engine = frozen_causal_lm(folder, LearnerConfig(micro_batch_size=2, reference_offload=offload))
    assert engine.zero_optimization_stage() == (3 if offload else 0)
    module = engine.module
    assert not module.training and not any(p.requires_grad for p in module.parameters())
    rates = [m.attention_dropout for m in module.modules() if isinstance(getattr(m, "attention_dropout", None), float)]
    assert rates and set(rates) == {0.0}
    module.train()  # even in train mode (a pass that forgot eval()) nothing is dropped
    ids = torch.tensor([[1, 275, 201, 301, 299, 310, 2, 40]])
    want = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()(input_ids=ids).logits
    with torch.no_grad():
        got = engine(input_ids=ids).logits
    # one model's float32 forward twice (ZeRO-3 gathers the same weights): equal up to summation order
    torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-5 * float(want.abs().max()))


class FakeTeacherEngine:
    """prompt_logprobs as a function of the ids, so alignment is checked by value: -(id / 1000) at t >= 1."""

    def __init__(self):
        self.calls = []

    async def prompt_logprobs(self, token_ids):
        self.calls.append(list(token_ids))
        return [-tok / 1000 for tok in token_ids[1:]]


def test_engine_scorer_aligns_every_row_and_reaches_the_batch():
    import asyncio

    from agentrl.rollout.teacher import TeacherScorer

    eps = _episodes()
    eps[1].start_segment("agent rewrote history")  # two rows: the closed segment and a new one
    eps[1].append([1, 275, 299], generated=False)
    eps[1].append([330, 2], generated=True, logprobs=[-0.75, -0.5], versions=[1, 1])
    engine = FakeTeacherEngine()
    scorer = TeacherScorer(engine)
    for ep in eps:
        asyncio.run(scorer.score(ep))
    assert len(engine.calls) == 3 and [len(r) for r in eps[1].teacher_logprobs] == [11, 5]
    assert eps[1].teacher_logprobs[1] == [0.0, -0.275, -0.299, -0.33, -0.002]
    batch = TrainBatch.from_episodes(eps, None, 0)
    assert batch.size == 3
    want = torch.where(batch.loss_mask > 0, -batch.input_ids.float() / 1000, 0.0)
    torch.testing.assert_close(batch.teacher_logprobs, want, rtol=0, atol=1e-7)
    # the rollout records keep them (the viewer and replay read the same ledger)
    from agentrl.rollout.records import episode_from_record, episode_to_record

    back = episode_from_record(json.loads(json.dumps(episode_to_record(eps[1]))))
    assert back.teacher_logprobs == eps[1].teacher_logprobs
    # without the teacher on every episode there are no teacher log-probs (the learner then says so)
    eps[0].teacher_logprobs = None
    assert TrainBatch.from_episodes(eps, None, 0).teacher_logprobs is None


def run_distill(tmp_path: Path, model_dir: str, teacher: str, placement: str) -> list[dict]:
    """A short real run (tests/distill_run.py: `python -m agentrl.train` with each batch saved after its step)."""
    from test_e2e import warm_python

    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "tests" / "distill_run.py"), "--config", "examples/agents/distill.yaml",
           f"model.path={model_dir}", f"train.out_dir={out}", "data.eval_tasks=4", "train.steps=2",
           "buffer.batch_size=8", "rollout.n_samples=4", "buffer.max_staleness=0", "train.eval_before=false",
           "train.eval_every=0",
           f"algo.teacher={{model: {teacher}, coef: 1.0, placement: {placement}}}"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "CI": "true"}
    proc = warm_python.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    batches = [torch.load(p, weights_only=True) for p in sorted((out / "batches").glob("*.pt"))]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(batches) == 2 and len(records) == 2
    return batches, records


@pytest.mark.e2e
@pytest.mark.parametrize("placement", ["learner", "engine"])
def test_a_real_run_distills_from_the_teacher(tmp_path, model_dir, placement):
    # learner: a perturbed copy (non-zero advantages); engine: the student's own folder, so the teacher's
    # prompt log-probs equal mu (vLLM at temperature 1 both times) and the advantage is 0 within float32 error
    teacher = perturbed_copy(model_dir, tmp_path / "teacher", 0.02) if placement == "learner" else model_dir
    batches, records = run_distill(tmp_path, model_dir, teacher, placement)
    for b, rec in zip(batches, records):
        mask = b["loss_mask"]
        want = hf_loop_logprobs(teacher, b["input_ids"], b["attention_mask"]) * mask
        torch.testing.assert_close(b["teacher_logprobs"], want, rtol=0, atol=1e-4)  # vLLM or learner vs HF, float32
        ref = loop_advantages(b["behav_logprobs"].tolist(), b["teacher_logprobs"].tolist(), mask.tolist(), 1.0)
        torch.testing.assert_close(b["advantages"], ref, rtol=0, atol=1e-6)  # env_advantage none: distillation alone
        assert rec["policy/distill/kl_token"] == pytest.approx(
            float(((b["behav_logprobs"] - b["teacher_logprobs"]) * mask).sum() / mask.sum()), abs=1e-5)
        if placement == "engine":
            assert float(b["advantages"].abs().max()) < 1e-3  # the same model: nothing to distil
        else:
            assert float(b["advantages"].abs().max()) > 1e-2
