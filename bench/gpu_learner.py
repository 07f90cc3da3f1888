"""The learner rank on whatever accelerator DeepSpeed finds: one `Learner.step` per configuration on the
same batch, weights written as safetensors, so a GPU step can be compared with the CPU one.

    python bench/gpu_learner.py --model DIR --out DIR              # one step per configuration
    python bench/gpu_learner.py --ray --model DIR --out DIR        # the same, through Ray learner ranks
    python bench/gpu_learner.py --compare CPU_DIR GPU_DIR          # max |w_gpu - w_cpu| per configuration

Configurations: ZeRO 0 and ZeRO 3 in float32 with the reference model and KL (against a CPU reference
they must agree to float32 rounding: the GPU runs without TF32), ZeRO 2 in bfloat16 with the critic
and GAE (checked for finite weights and a loss, not compared: bf16 rounds differently per device).
On CUDA the learner's process group is nccl (agentrl.learner.dist); here it is gloo. Each line
reports the device, the backend, the step's loss and seconds.

--ray builds the learner as train.py does for `cluster.backend=ray`: a local Ray (agentrl.run.cluster.connect,
never a cluster already running here), one `LearnerRank` actor holding 1 GPU when there is one (its own
world-size-1 group, nccl on CUDA), the batch through the object store and the weights back as
`RayLearner.publish` hands them to engines. Its files compare with a plain run's.
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
    "zero0-fp32-kl": dict(zero_stage=0, dtype="float32", algo=dict(kl={"type": "loss", "coef": 0.1})),
    "zero3-fp32-kl": dict(zero_stage=3, dtype="float32", algo=dict(kl={"type": "loss", "coef": 0.1})),
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


def make_learner(model: str, name: str):
    import torch  # a local name: a Ray rank gets this function by value, and torch.backends.cudnn won't pickle

    from agentrl.config import AlgoConfig, CriticConfig, LearnerConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec

    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32: comparable with the CPU step
        torch.backends.cudnn.allow_tf32 = False
    spec = CONFIGS[name]
    algo = AlgoConfig(**spec["algo"])
    cfg = LearnerConfig(lr=5e-3, zero_stage=spec["zero_stage"], dtype=spec["dtype"], micro_batch_size=2)
    critic = CriticConfig(zero_stage=spec["zero_stage"]) if algo.advantage.type == "gae" else None
    return Learner(LearnerSpec(model, cfg, algo, 8, critic=critic, critic_path=model if critic else None))


def one_step(model: str, name: str, out: Path) -> dict:
    learner = make_learner(model, name)
    t0 = time.perf_counter()
    metrics = learner.step(batch())
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return write_step(out, name, learner.state_dict_cpu(),
                      {"config": name, "device": str(learner.device), "backend": torch.distributed.get_backend(),
                       "loss": metrics[-1].loss, "step_s": round(seconds, 3)})


def write_step(out: Path, name: str, state: dict, row: dict) -> dict:
    """Save one configuration's weights (float32, for `--compare`) and print its row with `finite`."""
    from safetensors.torch import save_file

    weights = {k: v.float().contiguous() for k, v in state.items()}
    save_file(weights, str(out / f"{name}.safetensors"))
    row["finite"] = all(bool(torch.isfinite(v).all()) for v in weights.values())
    print(json.dumps(row), flush=True)
    return row


def rank_info(rank) -> dict:
    """Runs inside the rank's actor (`__ray_call__`): where its learner lives and which group it joined."""
    import os

    import torch

    gpu = torch.cuda.get_device_name(rank.learner.device) if rank.learner.device.type == "cuda" else None
    return {"device": str(rank.learner.device), "gpu": gpu, "backend": torch.distributed.get_backend(),
            "world": torch.distributed.get_world_size(), "pid": os.getpid(),
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}


def ray_steps(model: str, names: list[str], out: Path) -> None:
    """One RayLearner per configuration (its rank process ends with it, so each starts on a clean GPU)."""
    from functools import partial

    import ray
    from safetensors.torch import load

    from agentrl.run.cluster import connect, disconnect
    from agentrl.config import ClusterConfig
    from agentrl.learner.ray_ranks import RayLearner

    model = str(Path(model).resolve())  # the rank's working folder is Ray's, not ours
    # The driver never touches CUDA: it only decides whether the rank asks Ray for the GPU.
    cluster = ClusterConfig(backend="ray", learner_ranks=1, learner_num_gpus=1 if torch.cuda.is_available() else 0)
    connect(cluster)
    try:
        for name in names:
            # make_learner travels by value (this script is no importable module on the rank's side).
            learner = RayLearner(partial(make_learner, model, name), cluster)
            t0 = time.perf_counter()
            learner.start()
            start_s = time.perf_counter() - t0
            try:
                info = ray.get(learner.ranks[0].__ray_call__.remote(rank_info))
                t0 = time.perf_counter()
                metrics = learner.step(batch())
                seconds = time.perf_counter() - t0
                ref, _ = learner.publish(learner.version, None)  # the path engines' weights take
                state = load(ray.get(ref).tobytes())
            finally:
                learner.shutdown()
            write_step(out, name, state, {"config": name, "via": "ray", **info, "loss": metrics[-1].loss,
                                          "step_s": round(seconds, 3), "rank_step_s": round(metrics[-1].step_time_s, 3),
                                          "start_s": round(start_s, 1)})
    finally:
        disconnect()


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
    parser.add_argument("--ray", action="store_true", help="step through a Ray learner rank (1 GPU if any)")
    args = parser.parse_args()
    if args.compare:
        compare(Path(args.compare[0]), Path(args.compare[1]), args.model)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.ray:
        ray_steps(args.model, args.configs.split(","), out)
        return
    for name in args.configs.split(","):
        one_step(args.model, name, out)


if __name__ == "__main__":
    main()
