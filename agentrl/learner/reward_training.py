"""Reward-model training on preference pairs (the RLHF reward stage: DeepSpeed-Chat step 2, OpenRLHF train_rm).

`train_reward_model(base_path, pairs, out_dir, cfg)` turns a causal-LM folder into a sequence
classifier with one output (its body reused, the linear `score` head new), trains it with the
Bradley-Terry pairwise loss on (chosen_messages, rejected_messages) pairs, and saves a Hugging Face
folder that `rewards.reward_model.RewardModelScorer` loads.

Train-time and score-time inputs are made identical by construction: the initial classifier is
saved to `out_dir` first and a `RewardModelScorer` is built on that folder; its tokenizer (loaded
the way the scorer loads it), `render`, `pad_right` and `max_length` truncation (keep the last tokens)
prepare every training row, and the score is read at each row's last real token as in
`rewards.reward_model.last_token_scores`, the scorer's own pooling. (The folder's tokenizer is saved as `agentrl.chat.load_tokenizer`
reads the base's, but the scorer reloads it with AutoTokenizer, which for a qwen2 folder swaps in
Qwen2's digit-splitting pre-tokenizer; training through the scorer keeps the two in step either way.)

CLI: `python -m agentrl.learner.reward_training --base PATH --pairs pairs.jsonl --out DIR [--steps N ...]`,
where each jsonl line is {"chosen": [messages], "rejected": [messages]}.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from agentrl.chat import Message, load_tokenizer
from rewards.reward_model import RewardModelConfig, RewardModelScorer, last_token_scores

PreferencePair = tuple[list[Message], list[Message]]  # (chosen messages, rejected messages)


class RewardTrainingConfig(BaseModel):
    """Optimisation settings of one reward-model training run."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(2e-3, gt=0.0, le=1.0, description="peak AdamW learning rate (fits the embedded tiny "
                                                        "default model; about 1e-5 for billion-parameter ones)")
    steps: int = Field(250, ge=1, le=1_000_000, description="optimizer steps")
    batch_size: int = Field(32, ge=1, le=4096, description="pairs per step (2x rows per forward pass)")
    warmup_steps: int = Field(10, ge=0, le=100_000, description="linear warm-up, then cosine decay to 10% of lr")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0.0, description="gradient clipping norm")
    seed: int = Field(0, ge=0, description="seed of the score head, the eval split and the batch order")
    max_length: int = Field(512, ge=1, le=1_048_576,
                            description="tokens per episode; longer ones keep their last max_length (as the scorer)")
    eval_frac: float = Field(0.1, ge=0.0, lt=1.0, description="share of the pairs held out for evaluation")
    eval_batch_size: int = Field(64, ge=1, le=4096, description="pairs per forward pass during evaluation")
    device: str = Field("cpu", description="torch device to train on, e.g. 'cpu', 'cuda'")


def bradley_terry_loss(r_chosen_B: torch.Tensor, r_rejected_B: torch.Tensor) -> torch.Tensor:
    """Mean over pairs of -log sigmoid(r_chosen - r_rejected): the negative log-likelihood of the
    preferences under the Bradley-Terry model P(chosen > rejected) = sigmoid(r_c - r_r)
    (Ouyang et al. 2022, eq. 1)."""
    return -torch.nn.functional.logsigmoid(r_chosen_B - r_rejected_B).mean()


sequence_scores = last_token_scores  # (B,) scores at each row's last real token, with gradients


def encode(scorer: RewardModelScorer, messages: list[Message]) -> list[int]:
    """The token ids `scorer` scores for `messages` (rendered, tokenised, last max_length kept)."""
    tokenizer = scorer.tokenizer
    templated = bool(getattr(tokenizer, "chat_template", None))  # the scorer's rule: a template adds the specials
    ids = tokenizer(scorer.render(messages), add_special_tokens=not templated, verbose=False)["input_ids"]
    if not ids:
        raise ValueError("a conversation rendered to zero tokens")
    return ids[-scorer.config.max_length:]


def init_reward_model(base_path: str | Path, out_dir: str | Path, seed: int) -> None:
    """Save to `out_dir` a one-output sequence classifier with `base_path`'s body and tokenizer."""
    from transformers import AutoModelForSequenceClassification

    tokenizer = load_tokenizer(base_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    torch.manual_seed(seed)  # the new score head
    model = AutoModelForSequenceClassification.from_pretrained(
        base_path, num_labels=1, pad_token_id=pad_id, dtype=torch.float32, local_files_only=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _pair_batch(scorer: RewardModelScorer, rows: list[tuple[list[int], list[int]]]):
    """(input_ids, attention_mask) of 2B rows: the B chosen rows, then the B rejected rows."""
    return scorer.pad_right([c for c, _ in rows] + [r for _, r in rows])


def _lr_factor(cfg: RewardTrainingConfig):
    def factor(t: int) -> float:
        warm = min(1.0, (t + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
        return warm * (0.55 + 0.45 * math.cos(math.pi * min(t, cfg.steps) / cfg.steps))
    return factor


@torch.no_grad()
def evaluate(scorer: RewardModelScorer, rows: list[tuple[list[int], list[int]]], batch_size: int) -> dict[str, float]:
    """Pairwise accuracy (r_chosen > r_rejected; ties count as wrong) and mean BT loss over `rows`."""
    if not rows:
        return {"accuracy": float("nan"), "loss": float("nan")}
    wins, loss_sum = 0, 0.0
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        r_2B = sequence_scores(scorer.model, *_pair_batch(scorer, chunk))
        r_chosen_B, r_rejected_B = r_2B[:len(chunk)], r_2B[len(chunk):]
        wins += int((r_chosen_B > r_rejected_B).sum())
        loss_sum += bradley_terry_loss(r_chosen_B, r_rejected_B).item() * len(chunk)
    return {"accuracy": wins / len(rows), "loss": loss_sum / len(rows)}


def _train_loop(scorer: RewardModelScorer, train: list[tuple[list[int], list[int]]],
                cfg: RewardTrainingConfig, rng: random.Random) -> list[float]:
    model = scorer.model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, _lr_factor(cfg))
    losses: list[float] = []
    order: list[int] = []
    size = min(cfg.batch_size, len(train))
    bar = tqdm(range(cfg.steps), desc="reward model", dynamic_ncols=True)
    for _ in bar:
        if len(order) < size:  # epochs of shuffled pairs, the last partial batch dropped
            order = rng.sample(range(len(train)), len(train))
        chunk = [train[order.pop()] for _ in range(size)]
        r_2B = sequence_scores(model, *_pair_batch(scorer, chunk))
        loss = bradley_terry_loss(r_2B[:len(chunk)], r_2B[len(chunk):])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


def train_reward_model(base_path: str | Path, pairs: list[PreferencePair], out_dir: str | Path,
                       cfg: RewardTrainingConfig | None = None) -> dict[str, float]:
    """Train a reward model from `base_path` on `pairs` and save it to `out_dir`; returns metrics:
    train_loss (mean of the last 10% of steps), eval_accuracy / eval_loss on the held-out pairs (NaN
    when none are held out), train_accuracy, pair counts and seconds.

    Held out: the first ceil(eval_frac * len(pairs)) pairs after `random.Random(cfg.seed).shuffle`."""
    cfg = cfg or RewardTrainingConfig()
    if len(pairs) < 1 + (cfg.eval_frac > 0):
        raise ValueError(f"{len(pairs)} preference pairs: need one to train on, and one more to hold out "
                         f"when eval_frac > 0")
    started = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    init_reward_model(base_path, out_dir, cfg.seed)
    scorer = RewardModelScorer(RewardModelConfig(path=str(out_dir), max_length=cfg.max_length,
                                                 device=cfg.device))
    rows = [(encode(scorer, chosen), encode(scorer, rejected)) for chosen, rejected in pairs]
    rng = random.Random(cfg.seed)
    rng.shuffle(rows)
    n_eval = min(len(rows) - 1, math.ceil(cfg.eval_frac * len(rows)))
    eval_rows, train_rows = rows[:n_eval], rows[n_eval:]
    losses = _train_loop(scorer, train_rows, cfg, rng)
    scorer.model.save_pretrained(out_dir, safe_serialization=True)
    held_out = evaluate(scorer, eval_rows, cfg.eval_batch_size)
    tail = losses[-max(1, len(losses) // 10):]
    metrics = {
        "train_loss": sum(tail) / len(tail),
        "train_accuracy": evaluate(scorer, train_rows, cfg.eval_batch_size)["accuracy"],
        "eval_accuracy": held_out["accuracy"],
        "eval_loss": held_out["loss"],
        "train_pairs": len(train_rows),
        "eval_pairs": n_eval,
        "seconds": time.perf_counter() - started,
    }
    (out_dir / "reward_training.json").write_text(json.dumps({"config": cfg.model_dump(), "metrics": metrics},
                                                             indent=2) + "\n")
    return metrics


def read_pairs(path: str | Path) -> list[PreferencePair]:
    """Preference pairs from a jsonl file of {"chosen": [messages], "rejected": [messages]} lines."""
    pairs = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record.get("chosen"), list) or not isinstance(record.get("rejected"), list):
            raise ValueError(f"{path}:{lineno}: expected {{\"chosen\": [messages], \"rejected\": [messages]}}")
        pairs.append((record["chosen"], record["rejected"]))
    return pairs


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="causal-LM (or classifier) Hugging Face folder")
    parser.add_argument("--pairs", required=True, help='jsonl of {"chosen": [messages], "rejected": [messages]}')
    parser.add_argument("--out", required=True, help="folder to save the reward model in")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    for name, field in RewardTrainingConfig.model_fields.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(field.default), default=field.default,
                            help=field.description.replace("%", "%%") + " (default: %(default)s)")
    args = vars(parser.parse_args(argv))
    threads = args.pop("threads")
    if threads is not None:
        torch.set_num_threads(threads)
    base, pairs_path, out = args.pop("base"), args.pop("pairs"), args.pop("out")
    metrics = train_reward_model(base, read_pairs(pairs_path), out, RewardTrainingConfig(**args))
    print(json.dumps(metrics))
    return metrics


if __name__ == "__main__":
    main()
