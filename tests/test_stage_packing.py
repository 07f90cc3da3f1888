"""Packing (`data.packing`) in the RM, PRM, DPO and KTO stages gives the unpacked step: on ragged samples
(sequences of 3 to 200 tokens and one of 480, longer than a packed row), at ZeRO 0 and 3, one optimizer
step through the real stage loop (`run_stage`, a DeepSpeed engine) hands the optimizer the same gradients,
and the step's loss and every metric, and the held-out evaluation's, are the same; DPO's and KTO's
reference log-probs (computed once before the first step, packed too) are the same.

Before the first step the policy is the reference, so every implicit reward would be 0 and DPO's loss
log 2 whatever the log-probs: the test kinds shift each reference by a fixed amount per sample (after
recording the true one), so the losses and metrics depend on every policy log-prob.

One step only: the second step's gradients are taken at weights after an Adam update, whose slope in a
near-zero gradient is up to lr / eps (tests/optimizer_steps.py), so equal gradients need not give weights
equal within float32 error.

Tolerances: the two paths compute the same sums in another order (other matrix shapes, the softmax over
a block-masked row, each sequence sliced out of another row), about sqrt(n) * 2^-24 ~ 1.3e-6 relative per
reduction of n <= 480 terms (attention over <= 480 positions, 128 features). A sequence log-prob sums
terms of one sign (every log p <= 0), so it keeps that relative error: rtol 1e-5 (RTOL). DPO's and KTO's
implicit rewards are beta times a difference of two such sums of magnitude up to ~3000 (480 tokens at
|log p| ~ 6 near uniform over the 384-token vocabulary): 0.1 * 2 * 3000 * 1.3e-6 ~ 8e-4 absolute, so
their losses and metrics get atol 1e-3; RM scores and PRM logits come from one position's hidden state,
atol 1e-5. Gradients: `optimizer_steps.GRAD_ATOL_OF_MAX` / `GRAD_RTOL`. (Where this was written the paths
agreed far closer: reference log-probs bit for bit, gradients to ~5e-7 of their largest entry.)
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentrl.config import load_config
from agentrl.config.stages import StageConfig
from agentrl.data.samples import LabeledSample, PairSample, Sample, StepSample
from optimizer_steps import assert_same_gradients, gradients_of_each_step
from test_stages import _config, datasets  # noqa: F401  (the stage tests' tiny datasets, a fixture)

MAX_LEN = 256  # tokens a packed row holds: the 480-token sequence runs alone, the rest several a row
RTOL = 1e-5
ATOL_REWARD, ATOL_SCORE = 1e-3, 1e-5  # DPO / KTO implicit rewards; RM scores and PRM logits (see above)
SHIFTS = (0.7, -0.4, 1.3, -1.1, 0.2)  # added to the reference log-probs, per sample in turn


def _lengths(n: int, seed: int) -> list[int]:
    """Ragged: 3 to 200 tokens, and the fourth sequence 480 (longer than MAX_LEN)."""
    rng = random.Random(seed)
    out = [rng.choice([3, 5, 9, 17, 40, 75, 120, 200]) for _ in range(n)]
    out[3] = 480
    return out


def _sample(n: int, rng: random.Random, where: str) -> Sample:
    """A prompt of about a third of the tokens (mask 0), then a trained response (mask 1)."""
    prompt = max(1, n // 3)
    return Sample([rng.randrange(20, 380) for _ in range(n)], [0] * prompt + [1] * (n - prompt), where)


def _pairs(n: int, seed: int) -> list[PairSample]:
    rng = random.Random(seed)
    a, b = _lengths(n, seed), _lengths(n, seed + 1)[::-1]
    return [PairSample(_sample(x, rng, f"pair {i} c"), _sample(y, rng, f"pair {i} r")) for i, (x, y) in
            enumerate(zip(a, b))]


def _labeled(n: int, seed: int) -> list[LabeledSample]:
    rng = random.Random(seed)
    return [LabeledSample(_sample(x, rng, f"row {i}"), desirable=i % 3 != 1) for i, x in enumerate(_lengths(n, seed))]


def _steps(n: int, seed: int) -> list[StepSample]:
    """Each sequence scored at 1 to 4 positions (its last token among them), labels 0 / 1."""
    rng = random.Random(seed)
    out = []
    for i, x in enumerate(_lengths(n, seed)):
        positions = sorted({rng.randrange(x) for _ in range(3)} | {x - 1})
        out.append(StepSample([rng.randrange(20, 380) for _ in range(x)], positions,
                              [rng.randrange(2) for _ in positions], f"row {i}"))
    return out


def _shifted(cls):
    """`cls` whose prepared reference log-probs are shifted by SHIFTS (the true ones kept in `refs`)."""
    from agentrl.learner.stages.preference import WithReference

    class Shifted(cls):
        def prepare(self, engine, samples, micro_batch_size):
            out = super().prepare(engine, samples, micro_batch_size)
            self.refs = getattr(self, "refs", []) + [x.ref for x in out]
            # chosen and rejected shifted apart, so DPO's margins are not 0 either
            return [WithReference(x.sample, tuple(r + SHIFTS[(2 * i + j) % len(SHIFTS)] for j, r in enumerate(x.ref)))
                    for i, x in enumerate(out)]

    return Shifted


def _kind(stage: str, pad: int, eos: int, zero3: bool, packing: bool):
    from agentrl.learner.stages import DPOKind, KTOKind, PRMKind, RewardKind

    opts = {"packing": packing, "max_len": MAX_LEN}
    if stage == "rm":
        return RewardKind(pad, eos, [], zero3, **opts)
    if stage == "prm":
        return PRMKind(pad, [7, 11], zero3, **opts)
    cfg = StageConfig()
    if stage == "kto":
        return _shifted(KTOKind)(pad, cfg.kto.model_dump() | {"desirable_weight": 1.5}, zero3, **opts)
    settings = cfg.dpo.model_dump() | {"loss": stage.removeprefix("dpo-"), "nll_coef": 0.5, "label_smoothing": 0.1}
    return _shifted(DPOKind)(pad, settings, zero3, **opts)


DATA = {"rm": _pairs, "dpo-sigmoid": _pairs, "dpo-ipo": _pairs, "kto": _labeled, "prm": _steps}


@pytest.fixture
def layouts(monkeypatch) -> list[tuple[int, int, bool]]:
    """(sequences, rows, packed) of every forward's layout (`stages.common.lay_out`), in order."""
    from agentrl.learner.stages import common

    seen: list[tuple[int, int, bool]] = []
    real = common.lay_out

    def spy(rows, pad_id, packed):
        seen.append((sum(len(r) for r in rows), len(rows), packed))
        return real(rows, pad_id, packed)

    monkeypatch.setattr(common, "lay_out", spy)
    return seen


def _run(stage: str, model: str, tokenizer, out, zero_stage: int, packing: bool):
    """(summary, gradients of each step, the kind) of one step on 8 samples in 2 micro-batches of 4,
    evaluated before and after on 6 held-out ones."""
    from agentrl.learner.stage import run_stage

    cfg = load_config(None, [f"model.path={model}", f"train.out_dir={out}", "optim.batch_size=8",
                             "optim.micro_batch_size=4", "optim.max_steps=1", "optim.lr=1e-3",
                             f"optim.zero_stage={zero_stage}", "train.save_model=false"], StageConfig)
    kind = _kind(stage, tokenizer.pad_token_id, tokenizer.eos_token_id, zero_stage == 3, packing)
    make = DATA[stage]
    with gradients_of_each_step() as grads:
        summary = run_stage(kind, cfg, model, make(8, 0), make(6, 100), tokenizer, show=False)
    return summary, grads, kind


def _assert_same_numbers(got: dict, want: dict, atol: float) -> None:
    keys = {k for k in want if k.startswith(("train/", "eval/"))}
    assert keys and keys == {k for k in got if k.startswith(("train/", "eval/"))}, (sorted(got), sorted(want))
    for k in sorted(keys):
        assert got[k] == pytest.approx(want[k], rel=RTOL, abs=atol), (k, got[k], want[k])


@pytest.mark.parametrize("zero_stage", [0, 3])
@pytest.mark.parametrize("stage", sorted(DATA))
def test_packed_stage_step_equals_the_unpacked_one(stage, zero_stage, tiny_model, tmp_path, layouts):
    from agentrl.data.chat import load_tokenizer

    tokenizer = load_tokenizer(tiny_model)
    runs = {False: _run(stage, tiny_model, tokenizer, tmp_path / "padded", zero_stage, False)}
    assert layouts and all(not packed and n == rows for n, rows, packed in layouts)  # one sequence a row
    layouts.clear()
    runs[True] = _run(stage, tiny_model, tokenizer, tmp_path / "packed", zero_stage, True)
    # really packed: every forward several sequences a row, the 480-token one alone in its row
    assert layouts and all(packed and n > rows for n, rows, packed in layouts), layouts
    (packed, g_packed, k_packed), (padded, g_padded, k_padded) = runs[True], runs[False]
    assert_same_gradients(g_packed, g_padded)
    atol = ATOL_SCORE if stage in ("rm", "prm") else ATOL_REWARD
    _assert_same_numbers(packed["final_train"], padded["final_train"], atol)
    _assert_same_numbers(packed["evals"][0], padded["evals"][0], atol)
    if hasattr(k_padded, "refs"):  # the reference log-probs, before the test's shift
        got, want = torch.tensor(k_packed.refs), torch.tensor(k_padded.refs)
        assert got.shape == want.shape == (14, 2 if stage.startswith("dpo") else 1)
        assert torch.allclose(got, want, rtol=RTOL, atol=0.0), float((got - want).abs().max())
        assert float(want.max()) < -10.0  # sums of many log-probs, not a vacuous 0


def test_packed_reward_scores_are_the_scorers(tiny_model):
    """The RM stage's packed scores, read at each sequence's own last token, are what
    `rewards.reward_model.last_token_scores` (the `RewardModelScorer`'s read) gives each padded row. The
    classifier's own forward could not give them: it pools one score a row (its last non-pad token), and
    the packed rows are fewer than the sequences."""
    from transformers import AutoModelForSequenceClassification

    from agentrl.data.chat import load_tokenizer
    from agentrl.learner.stages import RewardKind
    from agentrl.learner.stages.common import sequence_rows
    from agentrl.utils.padding import pad_tokens
    from rewards.reward_model import last_token_scores

    tokenizer = load_tokenizer(tiny_model)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=1, dtype=torch.float32,
                                                               pad_token_id=tokenizer.pad_token_id).eval()
    pairs = _pairs(6, 7)

    class Engine:  # what RewardKind.scores uses of a DeepSpeed engine
        module = model

    with torch.no_grad():
        kind = RewardKind(tokenizer.pad_token_id, tokenizer.eos_token_id, [], packing=True, max_len=MAX_LEN)
        r_c, r_r = kind.scores(Engine(), pairs)
        seqs = [p.chosen.tokens for p in pairs] + [p.rejected.tokens for p in pairs]
        want = last_token_scores(model, *pad_tokens(seqs, tokenizer.pad_token_id))
    assert torch.allclose(torch.cat([r_c, r_r]), want, rtol=RTOL, atol=ATOL_SCORE)
    assert len(set(want.tolist())) == 12 > len(sequence_rows(seqs, tokenizer.pad_token_id, MAX_LEN).ids)


@pytest.mark.parametrize("stage", ["rm", "prm", "dpo", "kto"])
def test_stage_cli_packs_every_stage(stage, tiny_model, datasets, tmp_path, layouts):  # noqa: F811 (the fixture)
    """`data.packing=true` reaches the stage's kind from the command line and the stage runs packed."""
    from agentrl.stage_cli import run

    summary = run(stage, _config(stage, tiny_model, datasets[stage], tmp_path / "out", "data.packing=true",
                                 "data.max_len=512"), show=False)
    assert summary["steps"] == 2 and all(math.isfinite(e["eval/loss"]) for e in summary["evals"])
    assert layouts and all(packed for _, _, packed in layouts)
    assert any(n > rows for n, rows, _ in layouts)  # several sequences shared a row
