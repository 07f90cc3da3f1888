"""The learner rank on whatever accelerator DeepSpeed finds: one `Learner.step` per configuration on the
same batch, weights written as safetensors, so a GPU step can be compared with the CPU one.

    python bench/gpu_learner.py --model DIR --out DIR              # one step per configuration
    python bench/gpu_learner.py --compare CPU_DIR GPU_DIR          # max |w_gpu - w_cpu| per configuration

Configurations: ZeRO 0 and ZeRO 3 in float32 with the reference model and KL (against a CPU reference
they must agree to float32 rounding: the GPU runs without TF32), ZeRO 2 in bfloat16 with the critic
and GAE (checked for finite weights and a loss, not compared: bf16 rounds differently per device).
On CUDA the learner's process group is nccl (agentrl.learner.dist); here it is gloo. Each line
reports the device, the backend, the step's loss and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

CONFIGS = {
    "zero0-fp32-kl": dict(zero_stage=0, dtype="float32", algo=dict(kl_coef=0.1)),
    "zero3-fp32-kl": dict(zero_stage=3, dtype="float32", algo=dict(kl_coef=0.1)),
    "zero2-bf16-gae": dict(zero_stage=2, dtype="bfloat16", algo=dict(advantage="gae", mode="bypass")),
}
COMPARED = ("zero0-fp32-kl", "zero3-fp32-kl")


def batch():
    """8 episodes in 2 groups, ragged lengths, distinct rewards and behaviour logprobs (seeded)."""
    from agentrl.types import Episode, TrainBatch

    g = torch.Generator().manual_seed(0)
    eps = []
    for i in range(8):
        ep = Episode(task_id=f"t{i // 4}", group_id=i // 4)
        ep.append([1] + torch.randint(20, 300, (3 + i % 3,), generator=g).tolist(), generated=False)
        gen = torch.randint(20, 300, (2 + (i * 5) % 4,), generator=g).tolist() + [2]
        ep.append(gen, generated=True, logprobs=(-1.0 - torch.rand(len(gen), generator=g)).tolist(),
                  versions=[0] * len(gen))
        ep.reward = float((i * 7) % 5) / 4
        eps.append(ep)
    return TrainBatch.from_episodes(eps, None, 0)


def one_step(model: str, name: str, out: Path) -> dict:
    from safetensors.torch import save_file

    from agentrl.config import AlgoConfig, CriticConfig, LearnerConfig
    from agentrl.learner.rl import Learner

    spec = CONFIGS[name]
    algo = AlgoConfig(**spec["algo"])
    cfg = LearnerConfig(lr=5e-3, zero_stage=spec["zero_stage"], dtype=spec["dtype"], micro_batch_size=2)
    critic = CriticConfig(zero_stage=spec["zero_stage"]) if algo.advantage == "gae" else None
    learner = Learner(model, cfg, algo, 1.0, 8, critic=critic, critic_path=model if critic else None)
    t0 = time.perf_counter()
    metrics = learner.step(batch())
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    weights = {k: v.float().contiguous() for k, v in learner.state_dict_cpu().items()}
    save_file(weights, str(out / f"{name}.safetensors"))
    finite = all(bool(torch.isfinite(v).all()) for v in weights.values())
    row = {"config": name, "device": str(learner.device), "backend": torch.distributed.get_backend(),
           "loss": metrics[-1].loss, "step_s": round(seconds, 3), "finite": finite}
    print(json.dumps(row), flush=True)
    return row


def compare(a: Path, b: Path, model: str | None) -> None:
    """Max difference between the two steps' weights, beside how far the step moved them (if `model`)."""
    from safetensors.torch import load_file

    before = None
    if model:
        from agentrl.learner.models import load_causal_lm
        from agentrl.config import LearnerConfig

        before = {k: v.float() for k, v in load_causal_lm(model, LearnerConfig()).state_dict().items()}
    for name in COMPARED:
        wa, wb = load_file(str(a / f"{name}.safetensors")), load_file(str(b / f"{name}.safetensors"))
        assert wa.keys() == wb.keys(), name
        diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
        moved = "" if before is None else \
            f", the step moved weights by up to {max(float((wa[k] - before[k]).abs().max()) for k in wa if k in before):.2e}"
        print(f"{name}: max |w_a - w_b| = {diff:.2e} over {len(wa)} tensors{moved}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a Hugging Face model folder")
    parser.add_argument("--out", help="folder for the weights after each step")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="which configurations, comma-separated")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two --out folders")
    args = parser.parse_args()
    if args.compare:
        compare(Path(args.compare[0]), Path(args.compare[1]), args.model)
        return
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32: comparable with the CPU step
        torch.backends.cudnn.allow_tf32 = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.configs.split(","):
        one_step(args.model, name, out)


if __name__ == "__main__":
    main()
