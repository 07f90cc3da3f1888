"""Analytical model of one weight push (learner -> inference engines) per transport, and of the
generation pause as a share of one learner step. Pure arithmetic, standard library only.

    python bench/scale_model.py [--params 7e9] [--dtype-bytes 2] [--gpus-per-node 8] [--nodes 1]
        [--learner-gpus 4] [--engine-tp 1] [--colocate] [--pcie-GBps 25] [--nvlink-GBps 450]
        [--net-Gbps 400] [--memcpy-GBps 10] [--hbm-GBps 3350] [--tokens-per-step 4194304] [--mfu 0.4]
        [--bucket-bytes 1073741824] [--bucket-latency-us 50] [--table] [--cpu-check ...]
    python bench/scale_model.py --packing [--params 7.6e9] [--gpus-per-node 8] [--mfu 0.4]

`--packing` prints instead the learner step on ragged episodes (8k +- 6k tokens), padded vs token-budget
vs packed (bench/_packing_model.py has its equations).

With no `--params` (or with `--table`) it prints 0.5B, 7B and 32B (bf16) on the given node, then the
same model evaluated for this CPU machine (`--cpu-check` prints only that part).

Transports
  file (agentrl today): learner rank 0 gathers the full weights (ZeRO-3 shards come over NVLink, the
    gathered tensors GPU->host over PCIe), serialises them into one safetensors buffer (a host memcpy)
    and `ray.put`s it (another memcpy); the learner waits for all of that. Each engine's node fetches the
    object over the network unless it is the learner's node; the engine actor writes it to /dev/shm (a
    memcpy). Only then is generation paused: each vLLM worker reads the file (a memcpy of the full
    tensors), copies its TP shard host->GPU over PCIe and loads it (a GPU-side copy).
  collective (being built): rank 0 broadcasts the tensors in buckets through one torch.distributed
    group holding every engine worker (NCCL). Engines pause before receiving, so generation is paused for
    the whole receive plus the load. Under TP every worker receives the full tensors and keeps its shard.

Why bytes / slowest link for a broadcast: NCCL broadcasts along a chain (ring), cutting the message into
chunks; every link carries each byte once and all links work at the same time, so once the pipeline is
full the rate is that of the slowest link, whatever the number of receivers. The ZeRO-3 gather feeding
rank 0 is one more stage of the same pipeline. A pipeline of buckets costs
    bytes * max(stage s/byte) + bucket * (sum of the other stages' s/byte) + buckets * per-bucket latency,
the middle term being the fill (the first bucket crossing the faster stages). Ray's object transfer is
not pipelined across nodes (an object is served only once sealed), so remote nodes all pull through
the learner node's NIC: (remote nodes) * bytes / network.

Assumptions that favour the file transport (so the file/collective ratios are lower bounds): Ray's
object transfer runs over gRPC/TCP and rarely reaches the NCCL/RDMA line rate used here; memcpys on one
node run in parallel across engines; stages inside one transport are not overlapped where they could be
(the collective's load after its receive). The learner step counts 6 * params FLOPs per token (forward +
backward); GRPO's reference/old-logprob forwards and activation recomputation add 2 each, so real steps
are longer and the pause / step shares here are upper bounds. Engine pause/resume latency is ignored.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

GB = 1e9

# --- Defaults, each with where it comes from ------------------------------------------------------
# 512 prompts x 8 samples x 1,024 tokens (prompt + completion): a typical GRPO batch (DeepSeekMath's GRPO
# used 1,024-sample batches with 1k-token completions; DAPO 512 prompts x 16). 4.19M tokens per step.
TOKENS_PER_STEP = 512 * 8 * 1024
PEAK_BF16_FLOPS = 989e12  # H100 SXM dense BF16 tensor core peak, NVIDIA H100 datasheet (989.4 TFLOPS)
MFU = 0.4  # a well-tuned dense-transformer DeepSpeed/Megatron run reaches 35-50 % MFU on H100
PCIE_GBPS = 25.0  # Gen5 x16: 63 GB/s per direction nominal, ~50 GB/s pinned cudaMemcpy, about half that
#                   for pageable host memory (tensor.cpu() stages through a pinned bounce buffer)
NVLINK_GBPS = 450.0  # H100 SXM NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction (900 GB/s both)
# p2pBandwidthLatencyTest measures 376-380 GB/s unidirectional of the 450 (NVIDIA/nccl issue #1264);
# NCCL's chunked broadcast runs a little below raw P2P: 0.8 -> 360 GB/s effective.
NVLINK_EFFICIENCY = 0.8
NET_GBITPS = 400.0  # one ConnectX-7 NDR 400 Gb/s NIC per node in use by one transfer (= 50 GB/s); a DGX
#                     H100 has 8, which NCCL can stripe over, so this is conservative for the collective
NET_EFFICIENCY = 0.9  # NCCL reaches ~24 GB/s of 25 per 200G NIC (sjeaugey, NVIDIA/nccl-tests #119): 0.96
#                       on RDMA; 0.9 leaves room for a real fabric
MEMCPY_GBPS = 10.0  # one core's copy bandwidth on a server x86 (bounded by its outstanding cache misses);
#                     safetensors' save and a file read copy on one thread. bench/weight_push.py measures it.
HBM_GBPS = 3350.0  # H100 SXM HBM3, 3.35 TB/s (datasheet); a device copy reads and writes: half of it
BUCKET_BYTES = 1 << 30  # 1 GiB: 256 MiB .. 1 GiB buckets keep per-call latency under 1 % (vLLM/OpenRLHF use
#                         similar sizes) while bounding the receive buffer each engine must hold
BUCKET_LATENCY_S = 50e-6  # one NCCL broadcast call end to end: ~10-30 us small-message NCCL latency in a
#                           node (nccl-tests) plus the torch.distributed call from Python
LOOPBACK_GBPS = 3.0  # gloo over loopback TCP on a small CPU machine (the --cpu-check's collective link)
CPU_PARAMS, CPU_DTYPE_BYTES, CPU_STEP_S = 134.5e6, 4, 15.0  # SmolLM2-135M, float32, as bench/weight_push.py
MODELS = (("0.5B", 0.5e9), ("7B", 7e9), ("32B", 32e9))


@dataclass(frozen=True)
class Links:
    """Effective rates in bytes/s (what a transfer achieves, not the nominal figure)."""

    pcie: float  # host <-> one GPU
    nvlink: float  # GPU <-> GPU inside a node (CPU check: process <-> process over loopback)
    net: float  # node <-> node, for one transfer
    memcpy: float  # host memory copy, one thread
    device_copy: float  # GPU memory copy (read + write)


@dataclass(frozen=True)
class Cluster:
    gpus_per_node: int = 8
    nodes: int = 1
    learner_gpus: int = 4
    engine_tp: int = 1
    colocate: bool = False  # learner and engines time-share every GPU

    @property
    def learner(self) -> int:
        return self.gpus_per_node * self.nodes if self.colocate else self.learner_gpus

    def engines_per_node(self) -> list[int]:
        """Engines on each node; the learner fills node 0 first, an engine never spans nodes."""
        left, out = (0 if self.colocate else self.learner_gpus), []
        for _ in range(self.nodes):
            taken = min(left, self.gpus_per_node)
            left -= taken
            out.append((self.gpus_per_node - taken) // self.engine_tp)
        if sum(out) == 0:
            raise ValueError(f"no GPU left for an engine of TP {self.engine_tp}: {self}")
        return out

    @property
    def engines(self) -> int:
        return sum(self.engines_per_node())

    @property
    def remote_nodes(self) -> int:
        """Nodes other than the learner rank 0's that hold an engine."""
        return sum(1 for n in self.engines_per_node()[1:] if n)


@dataclass(frozen=True)
class Push:
    transport: str
    bytes: float
    push_s: float  # the learner is blocked
    pause_s: float  # generation is paused
    latency_s: float  # from the push's start until the engines serve the new version
    parts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    seconds: float
    flops: float


def _gather_s_per_byte(cluster: Cluster, links: Links) -> float:
    """ZeRO-3 all-gather: each rank receives the (L-1)/L of the weights it does not hold, over NVLink
    while the learner fits in one node, else over the network (the slowest hop)."""
    n = cluster.learner
    if n <= 1:
        return 0.0
    link = links.nvlink if n <= cluster.gpus_per_node else links.net
    return (n - 1) / n / link


def file_push(params: float, dtype_bytes: float, cluster: Cluster, links: Links) -> Push:
    b = params * dtype_bytes
    shard = b / cluster.engine_tp  # each TP worker copies only its shard to its GPU
    parts = {
        "gather": b * _gather_s_per_byte(cluster, links) + b / links.pcie,
        "serialise": b / links.memcpy,  # safetensors.save builds one bytes buffer
        "object_put": b / links.memcpy,  # ray.put copies it into the shared-memory object store
        "fetch": cluster.remote_nodes * b / links.net,  # every remote node pulls through node 0's NIC
        "shm_write": b / links.memcpy,  # the engine actor writes the bytes to /dev/shm
        "read": b / links.memcpy,  # the worker reads every full tensor out of the file
        "h2d": shard / links.pcie,
        "load": shard / links.device_copy,
    }
    push = parts["gather"] + parts["serialise"] + parts["object_put"]
    pause = parts["read"] + parts["h2d"] + parts["load"]
    return Push("file", b, push, pause, push + parts["fetch"] + parts["shm_write"] + pause, parts)


def collective_push(params: float, dtype_bytes: float, cluster: Cluster, links: Links,
                    bucket_bytes: float = BUCKET_BYTES, bucket_latency_s: float = BUCKET_LATENCY_S) -> Push:
    b = params * dtype_bytes
    if cluster.colocate:  # each engine is fed on its own GPU/node (CUDA IPC), modelled at NVLink speed
        bcast = 1 / links.nvlink
    else:  # the slowest receiver's link bounds the pipelined broadcast
        bcast = 1 / links.net if cluster.remote_nodes else 1 / links.nvlink
    stages = [bcast, _gather_s_per_byte(cluster, links)]
    slowest = max(stages)
    buckets = math.ceil(b / bucket_bytes)
    fill = min(bucket_bytes, b) * (sum(stages) - slowest)
    parts = {
        "stream": b * slowest,
        "fill": fill,
        "bucket_latency": buckets * bucket_latency_s,
        # every worker receives the full tensors but copies only its shard into the model
        "load": b / cluster.engine_tp / links.device_copy,
    }
    transfer = parts["stream"] + parts["fill"] + parts["bucket_latency"]
    pause = transfer + parts["load"]  # engines pause before the first bucket arrives
    return Push("collective", b, transfer, pause, pause, parts)


def learner_step(params: float, learner_gpus: int, tokens_per_step: float = TOKENS_PER_STEP,
                 peak_flops: float = PEAK_BF16_FLOPS, mfu: float = MFU) -> Step:
    flops = tokens_per_step * 6 * params  # forward 2N + backward 4N per token
    return Step(flops / (learner_gpus * peak_flops * mfu), flops)


def gpu_links(a: argparse.Namespace) -> Links:
    return Links(pcie=a.pcie_GBps * GB, nvlink=a.nvlink_GBps * a.nvlink_efficiency * GB,
                 net=a.net_Gbps / 8 * a.net_efficiency * GB, memcpy=a.memcpy_GBps * GB,
                 device_copy=a.hbm_GBps / 2 * GB)


def cpu_links(a: argparse.Namespace) -> Links:
    """No GPU: host<->device and device copies become memcpys; processes talk over loopback TCP."""
    m = a.memcpy_GBps * GB
    return Links(pcie=m, nvlink=a.loopback_GBps * GB, net=a.loopback_GBps * GB, memcpy=m, device_copy=m)


def cluster_of(a: argparse.Namespace) -> Cluster:
    return Cluster(a.gpus_per_node, a.nodes, a.learner_gpus, a.engine_tp, a.colocate)


def evaluate(params: float, a: argparse.Namespace, cluster: Cluster, links: Links,
             step_s: float | None = None) -> tuple[Push, Push, float]:
    dtype = a.dtype_bytes
    if step_s is None:
        step_s = learner_step(params, cluster.learner, a.tokens_per_step, a.peak_flops, a.mfu).seconds
    return (file_push(params, dtype, cluster, links),
            collective_push(params, dtype, cluster, links, a.bucket_bytes, a.bucket_latency_us * 1e-6), step_s)


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %" if x < 0.1 else f"{100 * x:.0f} %"


def _s(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _ratio(x: float, y: float) -> str:
    return f"{x / y:.1f}x" if y else "n/a"


def describe(cluster: Cluster, links: Links) -> str:
    per_node = cluster.engines_per_node()
    mode = "colocated (learner and engines time-share every GPU)" if cluster.colocate else \
        f"{cluster.learner} learner GPU(s)"
    return (f"{cluster.nodes} node(s) x {cluster.gpus_per_node} GPUs, {mode}; {cluster.engines} engine(s) of TP "
            f"{cluster.engine_tp} ({per_node[0]} on the learner's node, {sum(per_node[1:])} on "
            f"{cluster.remote_nodes} other node(s)). Effective GB/s: PCIe {links.pcie / GB:g}, NVLink "
            f"{links.nvlink / GB:g}, network {links.net / GB:g}, memcpy {links.memcpy / GB:g}, "
            f"GPU copy {links.device_copy / GB:g}")


def print_table(models: list[tuple[str, float]], a: argparse.Namespace) -> None:
    cluster, links = cluster_of(a), gpu_links(a)
    print(describe(cluster, links))
    print(f"Learner step: {a.tokens_per_step:,.0f} tokens x 6 x params / ({cluster.learner} x "
          f"{a.peak_flops:.4g} FLOP/s x MFU {a.mfu:g}); buckets {a.bucket_bytes / 2**20:g} MiB, "
          f"{a.bucket_latency_us:g} us each\n")
    print("| model | transport | bytes GB | push s (learner waits) | pause s (generation paused) "
          "| learner step s | pause / step |")
    print("|---|---|---:|---:|---:|---:|---:|")
    ratios = []
    for name, params in models:
        f, c, step = evaluate(params, a, cluster, links, a.learner_step_s)
        for p in (f, c):
            print(f"| {name} | {p.transport} | {p.bytes / GB:.2f} | {_s(p.push_s)} | {_s(p.pause_s)} | "
                  f"{_s(step)} | {_pct(p.pause_s / step)} |")
        ratios.append(f"{name}: file / collective = {_ratio(f.push_s, c.push_s)} on the learner's wait, "
                      f"{_ratio(f.pause_s, c.pause_s)} on the pause, {_ratio(f.latency_s, c.latency_s)} end to "
                      f"end ({_s(f.latency_s)} s vs {_s(c.latency_s)} s until the engines serve it)")
    print()
    print("\n".join(ratios))


def print_cpu_check(a: argparse.Namespace) -> None:
    params = a.params if a.params is not None else CPU_PARAMS
    cpu = argparse.Namespace(**{**vars(a), "dtype_bytes": a.cpu_dtype_bytes})
    cluster, links = Cluster(gpus_per_node=2, nodes=1, learner_gpus=1, engine_tp=1), cpu_links(a)
    step_s = a.learner_step_s if a.learner_step_s is not None else CPU_STEP_S
    f, c, step = evaluate(params, cpu, cluster, links, step_s)
    print(f"## check against this machine\n\nCPU: {params / 1e6:g}M params (SmolLM2-135M by default) x "
          f"{cpu.dtype_bytes:g} bytes, 1 learner process, 1 engine on the same node; PCIe, NVLink and GPU "
          f"copies become memcpys at {a.memcpy_GBps:g} GB/s, the collective runs over loopback TCP at "
          f"{a.loopback_GBps:g} GB/s; learner step {step:g} s (given)\n")
    print("| transport | bytes GB | push s (learner waits) | predicted pause s | measured pause s | pause / step |")
    print("|---|---:|---:|---:|---:|---:|")
    for p, measured in ((f, a.measured_file_pause_s), (c, a.measured_collective_pause_s)):
        m = "not given" if measured is None else f"{measured:.3g} ({_ratio(measured, p.pause_s)} the prediction)"
        print(f"| {p.transport} | {p.bytes / GB:.3f} | {_s(p.push_s)} | {_s(p.pause_s)} | {m} | "
              f"{_pct(p.pause_s / step)} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--params", type=float, default=None, help="parameter count (default: the 0.5B/7B/32B table)")
    add("--dtype-bytes", type=float, default=2, help="bytes per weight pushed (2: bf16)")
    add("--gpus-per-node", type=int, default=8)
    add("--nodes", type=int, default=1)
    add("--learner-gpus", type=int, default=4, help="the learner's GPUs, filling node 0 first")
    add("--engine-tp", type=int, default=1, help="GPUs per engine; engines = remaining GPUs / TP")
    add("--colocate", action="store_true", help="learner and engines time-share every GPU")
    add("--pcie-GBps", type=float, default=PCIE_GBPS, help="effective host<->GPU GB/s per GPU")
    add("--nvlink-GBps", type=float, default=NVLINK_GBPS, help="nominal NVLink GB/s per direction")
    add("--nvlink-efficiency", type=float, default=NVLINK_EFFICIENCY)
    add("--net-Gbps", type=float, default=NET_GBITPS, help="nominal network Gb/s per node")
    add("--net-efficiency", type=float, default=NET_EFFICIENCY)
    add("--memcpy-GBps", type=float, default=MEMCPY_GBPS, help="host memcpy GB/s, one thread")
    add("--hbm-GBps", type=float, default=HBM_GBPS, help="GPU memory GB/s (a copy runs at half)")
    add("--tokens-per-step", type=float, default=TOKENS_PER_STEP)
    add("--peak-flops", type=float, default=PEAK_BF16_FLOPS, help="dense bf16 FLOP/s per learner GPU")
    add("--mfu", type=float, default=MFU)
    add("--learner-step-s", type=float, default=None,
        help=f"learner step in seconds instead of the FLOPs model (--cpu-check: default {CPU_STEP_S:g})")
    add("--bucket-bytes", type=float, default=BUCKET_BYTES)
    add("--bucket-latency-us", type=float, default=BUCKET_LATENCY_S * 1e6)
    add("--table", action="store_true", help="print the 0.5B/7B/32B table (the default without --params)")
    add("--cpu-check", action="store_true", help="only the model of this CPU machine")
    add("--packing", action="store_true", help="the learner step on ragged episodes, padded vs packed")
    add("--cpu-dtype-bytes", type=float, default=CPU_DTYPE_BYTES, help="bytes per weight in the CPU check")
    add("--loopback-GBps", type=float, default=LOOPBACK_GBPS, help="loopback TCP GB/s (CPU collective)")
    add("--measured-file-pause-s", type=float, default=None)
    add("--measured-collective-pause-s", type=float, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.packing:
        from _packing_model import PackingCase, print_packing  # beside this file: the script's folder is on sys.path

        print_packing(PackingCase(**({"params": a.params} if a.params else {}), gpus=a.gpus_per_node,
                                  peak_flops=a.peak_flops, mfu=a.mfu))
        return
    if a.cpu_check:
        print_cpu_check(a)
        return
    if a.table or a.params is None:
        print_table([(n, p * 1.0) for n, p in MODELS], a)
        print()
        print_cpu_check(argparse.Namespace(**{**vars(a), "params": None}))
    else:
        print_table([(f"{a.params / 1e9:g}B", a.params)], a)


if __name__ == "__main__":
    main()
