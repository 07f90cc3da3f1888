"""RewardModelScorer against a tiny Qwen2 reward model trained here on synthetic preferences.

The model learns "What is a + b?" -> the assistant's reply is the correct sum (Bradley-Terry loss,
chosen = correct sum, rejected = a wrong number) and must rank correct above wrong on questions it
never saw. Scores from the micro-batched scorer are checked against unbatched forwards of the
model itself (its own pooling on an unpadded sequence is the last token).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time

import pytest
import torch
from pydantic import ValidationError

from agentrl.types import Episode
from rewards.reward_model import RewardModelConfig, RewardModelScorer

SEED = 0
HELD_OUT = 10  # questions never trained on
MAX_SUM = 9  # single-digit answers: every training text has the same length


@contextlib.contextmanager
def _torch_threads(n: int):
    # Training a 1-layer model is fastest on one thread, and a second thread fighting a busy core is
    # far slower; the previous setting is restored for the rest of the session.
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _messages(a: int, b: int, answer: int | str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"What is {a} + {b}?"}, {"role": "assistant", "content": str(answer)}]


def _token_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    return tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]


def _episode(messages: list[dict[str, str]]) -> Episode:
    return Episode(task_id="t", group_id=0, messages=messages)


def _wrong(a: int, b: int, rng: random.Random) -> int:
    w = a + b
    while w == a + b:
        w = rng.randint(0, MAX_SUM)
    return w


def _train(config, tokenizer, steps: int = 600, pairs_per_step: int = 32, lr: float = 3e-3):
    """Train a reward model with -log sigmoid(r_chosen - r_rejected); returns (model, held-out questions)."""
    from transformers import Qwen2ForSequenceClassification

    rng = random.Random(SEED)
    questions = [(a, b) for a in range(10) for b in range(10) if a + b <= MAX_SUM]
    rng.shuffle(questions)
    train_q, held_out = questions[:-HELD_OUT], questions[-HELD_OUT:]
    ids = {(a, b, s): _token_ids(tokenizer, _messages(a, b, s)) for a, b in train_q for s in range(MAX_SUM + 1)}
    assert len({len(v) for v in ids.values()}) == 1  # one length: no padding needed while training
    torch.manual_seed(SEED)
    model = Qwen2ForSequenceClassification(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # 30 warm-up steps, then a cosine decay to 10% of lr.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: min(1.0, (t + 1) / 30) * (0.55 + 0.45 * math.cos(math.pi * t / steps)))
    for _ in range(steps):
        batch = [rng.choice(train_q) for _ in range(pairs_per_step)]
        keys = [(a, b, a + b) for a, b in batch] + [(a, b, _wrong(a, b, rng)) for a, b in batch]
        r_B = model(input_ids=torch.tensor([ids[k] for k in keys])).logits.squeeze(-1)
        loss = -torch.nn.functional.logsigmoid(r_B[:pairs_per_step] - r_B[pairs_per_step:]).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
    return model.eval(), held_out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """(folder of the trained reward model, held-out questions, the folder's tokenizer).

    Training uses the tokenizer as `agentrl.data.chat.load_tokenizer` loads it back from the model folder,
    which is how the scorer (and every rollout) loads it. It splits digits (`split_digits`), which
    sums need.
    """
    from transformers import Qwen2Config

    from agentrl.data.chat import load_tokenizer
    from agentrl.config import DefaultModelConfig
    from agentrl.models.default import build_tokenizer

    out = tmp_path_factory.mktemp("reward_model")
    tiny_tokenizer = build_tokenizer(DefaultModelConfig(split_digits=True), tmp_path_factory.mktemp("rm-tokenizer"))
    config = Qwen2Config(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=512, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
                         initializer_range=0.05, pad_token_id=tiny_tokenizer.pad_token_id, num_labels=1)
    config.save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    tokenizer = load_tokenizer(out)
    with _torch_threads(1):
        model, held_out = _train(config, tokenizer)
    model.save_pretrained(out)
    return out, held_out, tokenizer


@pytest.fixture(scope="module")
def reference(trained):
    """Unbatched score of one episode: the saved model's own forward on the unpadded token sequence."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(trained[0]).eval()

    def score(messages: list[dict[str, str]], keep_last: int | None = None) -> float:
        ids = _token_ids(trained[2], messages)
        if keep_last is not None:
            ids = ids[-keep_last:]
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids])).logits[0, 0].item()

    return score


def _scorer(path, engine_factory=None, **overrides) -> RewardModelScorer:
    return RewardModelScorer(RewardModelConfig(path=str(path), **overrides), engine_factory)


def _ragged_conversations() -> list[list[dict[str, str]]]:
    """Conversations of different token lengths (one- and two-token answers, extra turns, long text)."""
    convs = [_messages(3, 4, 7), _messages(9, 8, 17), _messages(2, 2, "The answer is 4, I am quite sure.")]
    convs.append([{"role": "system", "content": "Reply with one number."}, *_messages(5, 6, 11)])
    convs.append([*_messages(1, 1, 3), {"role": "user", "content": "Wrong. Try again."},
                  {"role": "assistant", "content": "2"}])
    return convs


def test_trained_model_ranks_correct_above_wrong_on_held_out_questions(trained):
    path, held_out, _ = trained
    pairs = [(a, b, w) for a, b in held_out for w in range(MAX_SUM + 1) if w != a + b]

    async def main():
        scorer = _scorer(path, max_batch_size=64)
        chosen = await asyncio.gather(*(scorer(_episode(_messages(a, b, a + b))) for a, b, _ in pairs))
        rejected = await asyncio.gather(*(scorer(_episode(_messages(a, b, w))) for a, b, w in pairs))
        await scorer.aclose()
        return chosen, rejected

    chosen, rejected = asyncio.run(main())
    assert all(r.ok for r in chosen + rejected)
    accuracy = sum(c.value > r.value for c, r in zip(chosen, rejected)) / len(pairs)
    assert accuracy >= 0.8, accuracy


def test_batched_scores_match_unbatched_reference_on_ragged_lengths(trained, reference):
    convs = _ragged_conversations()
    lengths = {len(_token_ids(trained[2], c)) for c in convs}
    assert len(lengths) == len(convs)  # every row is padded differently

    async def main():
        scorer = _scorer(trained[0], max_batch_size=len(convs), max_wait_s=5.0, scale=2.0, shift=-1.0)
        results = await asyncio.gather(*(scorer(_episode(c)) for c in convs))
        stats = scorer.stats()
        await scorer.aclose()
        return results, stats

    results, stats = asyncio.run(main())
    assert stats.batches == 1 and stats.items == len(convs)  # full batch closes before max_wait_s
    for conv, result in zip(convs, results):
        expected = reference(conv)
        assert result.status == "ok"
        assert result.info["batch_size"] == len(convs) and result.info["truncated"] is False
        assert abs(result.info["raw_score"] - expected) < 1e-5
        assert abs(result.value - (2.0 * expected - 1.0)) < 2e-5


def test_concurrent_calls_share_forward_passes_and_each_gets_its_own_score(trained, reference):
    convs = [_messages(a, b, s) for a, b, s in [(i % 10, (3 * i) % 7, i % 16) for i in range(50)]]
    convs[7] = _ragged_conversations()[2]
    convs[31] = _ragged_conversations()[4]

    async def main():
        scorer = _scorer(trained[0], max_batch_size=16, max_wait_s=0.05)
        results = await asyncio.gather(*(scorer(_episode(c)) for c in convs))
        stats = scorer.stats()
        await scorer.aclose()
        return results, stats

    results, stats = asyncio.run(main())
    assert stats.items == 50 and stats.ok == 50 and stats.errors == 0
    assert stats.batches < 50 and stats.mean_batch_size > 1 and stats.max_batch_size <= 16
    for conv, result in zip(convs, results):
        assert result.ok
        assert abs(result.value - reference(conv)) < 1e-5


def test_long_episodes_keep_their_last_max_length_tokens(trained, reference):
    long_conv = [{"role": "system", "content": "Reply with one number. " * 6}, *_messages(4, 5, 9)]
    n_tokens = len(_token_ids(trained[2], long_conv))
    short_conv = _messages(1, 2, 3)
    max_length = 20
    assert n_tokens > max_length >= len(_token_ids(trained[2], short_conv))

    async def main():
        scorer = _scorer(trained[0], max_length=max_length, max_batch_size=2, max_wait_s=1.0)
        results = await asyncio.gather(scorer(_episode(long_conv)), scorer(_episode(short_conv)))
        stats = scorer.stats()
        await scorer.aclose()
        return results, stats

    (long_r, short_r), stats = asyncio.run(main())
    assert long_r.ok and long_r.info["truncated"] is True and long_r.info["n_tokens"] == n_tokens
    assert abs(long_r.value - reference(long_conv, keep_last=max_length)) < 1e-5
    assert abs(long_r.value - reference(long_conv)) > 1e-4  # the dropped prefix mattered
    assert short_r.ok and short_r.info["truncated"] is False
    assert abs(short_r.value - reference(short_conv)) < 1e-5
    assert stats.truncated == 1


def _on_first_forward(monkeypatch, scorer: RewardModelScorer, first_call) -> None:
    """Run `first_call()` before the backbone's first forward pass only (a crash or a stall)."""
    backbone = scorer.model.model
    real_forward = backbone.forward
    calls = {"n": 0}

    def forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            first_call()
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(backbone, "forward", forward)


def test_forward_failure_fails_every_request_of_its_batch_then_recovers(trained, reference, monkeypatch):
    scorer = _scorer(trained[0], max_batch_size=4, max_wait_s=1.0)

    def crash():
        raise RuntimeError("CUDA error: device-side assert triggered")

    _on_first_forward(monkeypatch, scorer, crash)
    convs = [_messages(a, a, 2 * a) for a in range(4)]

    async def main():
        failed = await asyncio.gather(*(scorer(_episode(c)) for c in convs))
        recovered = await asyncio.gather(*(scorer(_episode(c)) for c in convs))
        await scorer.aclose()
        return failed, recovered

    failed, recovered = asyncio.run(main())
    for result in failed:
        assert result.status == "error" and not result.ok
        assert math.isnan(result.value)  # never a plausible 0.0
        assert "RuntimeError" in result.info["error"] and "device-side assert" in result.info["error"]
        assert result.info["batch_size"] == 4
    for conv, result in zip(convs, recovered):
        assert result.ok and abs(result.value - reference(conv)) < 1e-5
    stats = scorer.stats()
    assert (stats.batches, stats.error_batches, stats.errors, stats.ok) == (2, 1, 4, 4)


def test_slow_forward_times_out_without_blocking_the_event_loop(trained, reference, monkeypatch):
    scorer = _scorer(trained[0], max_batch_size=8, max_wait_s=0.0, timeout_s=0.2)
    _on_first_forward(monkeypatch, scorer, lambda: time.sleep(0.8))
    conv = _messages(6, 3, 9)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        started = time.perf_counter()
        timed_out = await scorer(_episode(conv))
        waited = time.perf_counter() - started
        tick_task.cancel()
        scorer.config.timeout_s = 5.0  # the next request waits for the slow batch, then gets its own
        after = await scorer(_episode(conv))
        await scorer.aclose()
        return timed_out, waited, ticks, after

    timed_out, waited, ticks, after = asyncio.run(main())
    assert timed_out.status == "timeout" and math.isnan(timed_out.value)
    assert waited < 0.6  # answered at timeout_s, not when the slow forward finished
    assert ticks >= 5  # the loop kept running while the forward pass slept in its thread
    assert after.ok and abs(after.value - reference(conv)) < 1e-5
    stats = scorer.stats()
    assert stats.timeouts == 1 and stats.batches == 2 and stats.ok == 1


def test_content_parts_render_as_text_and_a_scorer_outlives_its_event_loop(trained, reference):
    scorer = _scorer(trained[0])
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is 2 + "}, {"type": "text", "text": "5?"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "7"}]}]
    assert scorer.render(parts) == scorer.render(_messages(2, 5, 7))
    first = asyncio.run(scorer(_episode(parts)))
    second = asyncio.run(scorer(_episode(_messages(2, 5, 7))))  # a new loop gets a new batcher
    assert first.ok and second.ok
    assert abs(first.value - reference(_messages(2, 5, 7))) < 1e-5 and abs(second.value - first.value) < 1e-6
    asyncio.run(scorer.aclose())


def test_closed_scorer_reports_errors_not_zero(trained):
    async def main():
        scorer = _scorer(trained[0])
        await scorer.aclose()
        return await scorer(_episode(_messages(1, 1, 2)))

    result = asyncio.run(main())
    assert result.status == "error" and math.isnan(result.value)


def test_config_is_bounded_and_rejects_unknown_keys(tmp_path):
    with pytest.raises(ValidationError, match="max_batch"):
        RewardModelConfig(path="x", max_batch=8)
    with pytest.raises(ValidationError):
        RewardModelConfig(path="x", max_batch_size=0)
    with pytest.raises(ValidationError):
        RewardModelConfig(path="x", dtype="float16")
    with pytest.raises(ValidationError):
        RewardModelConfig(path="x", timeout_s=0)
    assert RewardModelConfig(path="x").model_dump() == {
        "path": "x", "max_batch_size": 32, "max_wait_s": 0.01, "max_length": 512, "timeout_s": 60.0,
        "device": "cpu", "dtype": "float32", "deepspeed": False, "offload": False, "scale": 1.0, "shift": 0.0}


def test_a_classifier_with_several_labels_is_refused(tiny_tokenizer, tmp_path):
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    config = Qwen2Config(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, num_labels=2,
                         pad_token_id=tiny_tokenizer.pad_token_id)
    Qwen2ForSequenceClassification(config).save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_labels=1"):
        RewardModelScorer(RewardModelConfig(path=str(tmp_path)))


@pytest.mark.parametrize("offload", [False, True])
def test_deepspeed_engine_scores_like_the_plain_model(trained, reference, offload):
    """The frozen reward model in a DeepSpeed eval-only engine (ZeRO-0, or ZeRO-3 with parameters on
    CPU) gives the plain model's scores."""
    convs = _ragged_conversations()

    async def main():
        from agentrl.learner.models import frozen_engine

        scorer = _scorer(trained[0], frozen_engine, max_batch_size=len(convs), deepspeed=True, offload=offload)
        assert scorer.engine is not None
        results = await asyncio.gather(*(scorer(_episode(c)) for c in convs))
        await scorer.aclose()
        return results

    for conv, result in zip(convs, asyncio.run(main())):
        assert result.status == "ok"
        assert result.value == pytest.approx(reference(conv), abs=1e-4)
    with pytest.raises(ValueError, match="offload needs deepspeed"):
        _scorer(trained[0], offload=True)
    with pytest.raises(ValueError, match="needs an engine_factory"):  # rewards/ never imports the learner
        _scorer(trained[0], deepspeed=True)
