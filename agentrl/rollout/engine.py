"""vLLM AsyncLLM wrapper: token-in/token-out generation with per-token logprobs and policy versions,
and in-place weight updates by either of two paths.

The collective path (default): the engine is built with vLLM's RL weight-transfer interface on the
`agentrl` backend (agentrl.weights.receiver); it joins a learner's torch.distributed group
once (`join_weight_group`), and each push is received there (`stage_weights`,
`load_weights_collective`) and loaded by vLLM's layerwise in-place reload.

The file path (`weight_sync.transport=file`): weights arrive as the path of a safetensors file in
shared memory (agentrl.weights.sync); only the path crosses `collective_rpc` to
`agentrl.weights.worker.WorkerWeightExtension`, a worker extension that calls `model_runner.reload_weights`: tensors sent through
the RPC itself are pickled to bytes on the way, which cost 16 s per push for a 538 MB model.

Either way generation is paused with in-flight requests kept, and a call to a core that died raises
instead of waiting for ever (`_unless_dead`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from agentrl.config import EngineConfig

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _single_process_core(config, single_process: bool):
    """The OpenMP settings vLLM's multiprocess executor gives its CPU worker (threads bound to the cores
    it keeps for the model, one core left to the rest), here given to the engine-core process that runs
    the worker itself: it inherits them when it is started inside this block. That process is a fork of
    a warm server (`agentrl.rollout.core_process`) except inside a Ray actor, where vLLM spawns."""
    from vllm.platforms import current_platform
    from vllm.ray.lazy_utils import is_in_ray_actor

    if not (single_process and current_platform.is_cpu()):
        yield
        return
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    from agentrl.rollout.core_process import forked_engine_cores

    forked = contextlib.nullcontext() if is_in_ray_actor() else forked_engine_cores()
    with OMPProcessManager(config).configure_omp_envs(rank=0, local_rank=0), forked:
        yield


@dataclass
class Generation:
    """One model turn: generated token ids with their behaviour logprobs and policy versions."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None


CPU_BLOCK_SIZE = 32


def kv_block_size(configured: int | None, cpu: bool) -> int | None:
    """The KV-cache block size to ask vLLM for. Prefix caching reuses whole blocks only, and vLLM's CPU
    default of 128 tokens means a prompt shorter than that is prefilled again for every sample of its
    group, every eval episode sharing a few-shot preamble and every later turn of a short conversation;
    32 is the smallest size the CPU attention kernels take. SmolLM2 on 2 cores, 128 held-out episodes
    (`python bench/kv_blocks.py`): reasoning_gym's 3-shot eval 164.8 -> 63.8 s, the quiz's 153.3 -> 94.8 s,
    the same samples. None elsewhere: vLLM's own choice per attention backend."""
    if configured is None:
        return CPU_BLOCK_SIZE if cpu else None
    if cpu and configured % CPU_BLOCK_SIZE:
        # vLLM would fail inside the engine core's start, its traceback naming no config key
        raise ValueError(f"engine.block_size={configured}: vLLM's CPU attention takes multiples of "
                         f"{CPU_BLOCK_SIZE} (32, 64, 128, ...)")
    return configured


class Engine:
    """One vLLM AsyncLLM. `version` is the policy version of the weights it serves."""

    def __init__(self, llm, eos_id: int) -> None:
        self.llm = llm
        self.eos_id = eos_id
        self.version = 0
        self.weights_lost = False  # a collective receive failed half-way (load_weights_collective)
        self._ids = itertools.count()
        self._lock = asyncio.Lock()  # one weight update at a time
        # Per open stream: tokens read so far, and the cuts [(token index, version before)] of each weight
        # update that landed while it was open (`_version_at`).
        self._read: dict[str, int] = {}
        self._cuts: dict[str, list[tuple[int, int]]] = {}

    @classmethod
    def start(cls, model_path: str, cfg: EngineConfig, eos_id: int, tensor_parallel_size: int = 1) -> "Engine":
        """Build the engine. Must be called inside the event loop that will use it for its whole life."""
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        # One worker runs inside the engine-core process instead of a third process of its own: vLLM's CPU
        # platform turns the string "uni" back into "mp", so the executor class is named. Each spawned
        # process re-imports torch and vLLM; with one fewer an engine serves its first request 12 s sooner
        # on a 2-core machine (47 s -> 35 s, the import included; bench/engine_start.py). Tensor
        # parallelism needs the multiprocess workers.
        single = {}
        if tensor_parallel_size == 1:
            from vllm.v1.executor.uniproc_executor import UniProcExecutor

            single = {"distributed_executor_backend": UniProcExecutor}
        args = AsyncEngineArgs(
            model=model_path, tokenizer=model_path, dtype=cfg.dtype, max_model_len=cfg.max_model_len,
            kv_cache_memory_bytes=cfg.kv_cache_memory_bytes, max_num_seqs=cfg.max_num_seqs, seed=cfg.seed,
            enforce_eager=cfg.enforce_eager, block_size=kv_block_size(cfg.block_size, current_platform.is_cpu()),
            worker_extension_cls="agentrl.weights.worker.WorkerWeightExtension",
            # vLLM's RL weight-transfer interface with agentrl's torch.distributed backend (the collective
            # path, agentrl.weights.receiver); idle until a learner opens a group with it.
            weight_transfer_config={"backend": "agentrl"},
            enable_prefix_caching=True, max_num_batched_tokens=cfg.max_num_batched_tokens,
            tensor_parallel_size=tensor_parallel_size,
            # A prompt split across steps breaks per-request seeded sampling on CPU (the CPU generator
            # has no offset to rewind), so prompts are always prefilled whole.
            enable_chunked_prefill=False,
            # logprobs after temperature scaling: the distribution tokens were actually sampled from
            logprobs_mode="processed_logprobs", **single,
        )
        config = args.create_engine_config()
        with _single_process_core(config, single_process=tensor_parallel_size == 1):
            return cls(AsyncLLM.from_vllm_config(config, disable_log_stats=True), eos_id)

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None) -> Generation:
        """Sample one turn. Each token is stamped with the version of the weights that sampled it: a weight
        update pauses the engine, and the tokens sampled before it keep the old version however late they
        are read (`load_weights_file`)."""
        gen = Generation()
        async for delta in self.stream(prompt_ids, max_tokens, temperature, top_p, seed):
            gen.token_ids += delta.token_ids
            gen.logprobs += delta.logprobs
            gen.versions += delta.versions
            gen.finish_reason = delta.finish_reason or gen.finish_reason
        if len(gen.logprobs) != len(gen.token_ids):
            raise RuntimeError(f"vLLM returned {len(gen.logprobs)} logprobs for {len(gen.token_ids)} tokens")
        return gen

    async def stream(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                     top_p: float = 1.0, seed: int | None = None) -> AsyncIterator[Generation]:
        """`generate` as it happens: one Generation per engine step holding the new tokens. Closing
        the iterator early aborts the request in vLLM (the OpenAI endpoint's stop strings)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, logprobs=0, seed=seed,
            stop_token_ids=[self.eos_id], output_kind=RequestOutputKind.DELTA, detokenize=False,
        )
        rid = f"req-{next(self._ids)}"
        self._read[rid], self._cuts[rid] = 0, []
        outputs = self.llm.generate({"prompt_token_ids": prompt_ids}, params, request_id=rid)
        try:
            async for out in outputs:
                completion = out.outputs[0]
                new_ids = list(completion.token_ids)
                start = self._read[rid]
                self._read[rid] = start + len(new_ids)
                cuts = self._cuts[rid]  # empty unless a weight update landed while this stream was open
                versions = ([self._version_at(rid, start + i) for i in range(len(new_ids))] if cuts
                            else [self.version] * len(new_ids))
                logprobs = [float(lp[tok].logprob) for tok, lp in zip(new_ids, completion.logprobs or [])]
                yield Generation(new_ids, logprobs, versions, completion.finish_reason)
        finally:
            self._read.pop(rid, None)
            self._cuts.pop(rid, None)
            await outputs.aclose()

    def _version_at(self, rid: str, index: int) -> int:
        """The version of the weights that sampled token `index` of stream `rid`: the version before the
        first update whose cut lies past the token, else the current one."""
        for cut, before in self._cuts[rid]:
            if index < cut:
                return before
        return self.version

    async def _sampled_so_far(self) -> dict[str, int]:
        """Tokens each open stream's request has been sampled, read or not. Called while generation is
        paused: wait until vLLM's output queue is drained, then count what each request's output
        collector holds unread (with delta outputs, unread steps are merged there) on top of what the
        stream has read. A request vLLM no longer tracks has finished: nothing more will be sampled
        for it, so all its tokens, read or not, are counted (sys.maxsize)."""
        core = getattr(self.llm, "engine_core", None)
        queue = getattr(core, "outputs_queue", None)
        for _ in range(1000):  # bounded: the engine is paused, so the queue only empties
            if queue is None or queue.empty():
                break
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)  # the output handler finishes the batch it dequeued last
        states = getattr(getattr(self.llm, "output_processor", None), "request_states", None)
        if states is None:  # not vLLM's AsyncLLM: count what was read
            return dict(self._read)
        unread: dict[str, int] = {}
        for state in list(states.values()):
            pending = getattr(state.queue, "output", None)
            unread[state.external_req_id] = sum(len(o.token_ids) for o in getattr(pending, "outputs", None) or [])
        return {rid: n + unread[rid] if rid in unread else sys.maxsize for rid, n in self._read.items()}

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """log p(token_ids[t] | token_ids[:t]) for t >= 1 under the served weights (prompt logprobs)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        final = None
        async for out in self.llm.generate({"prompt_token_ids": token_ids}, params,
                                           request_id=f"score-{next(self._ids)}"):
            final = out
        entries = final.prompt_logprobs[1:]
        return [float(entry[tok].logprob) for entry, tok in zip(entries, token_ids[1:])]

    async def load_weights_file(self, path: str, version: int) -> float:
        """Load new weights in place from a safetensors file; in-flight requests are frozen, not
        aborted, and resume on them. Returns the seconds generation was paused."""
        async def load() -> None:
            await self._unless_dead(self.llm.collective_rpc("agentrl_load_weights_file", args=(path,)))

        return await self._swap(version, load)

    async def join_weight_group(self, init_info: dict) -> None:
        """Join a learner's weight group (the collective path); returns once every member has joined."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self._unless_dead(self.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info)))

    async def stage_weights(self, update_info: dict) -> None:
        """Have the workers start receiving the next push in the background (on CPU; a no-op on GPU)."""
        await self._unless_dead(self.llm.collective_rpc("agentrl_stage_weights", args=(update_info,)))

    async def load_weights_collective(self, update_info: dict, version: int) -> float:
        """Receive new weights through the joined group while the learner broadcasts them (or wait for
        the staged receive, without pausing), and load them in place (vLLM's start / update / finish
        weight update). A load that fails half-way leaves the model half-loaded: the engine stays
        paused and reports itself dead (`weights_lost`) so the fleet restarts it, rather than sampling
        from mixed weights."""
        await self._unless_dead(self.llm.collective_rpc("agentrl_wait_staged"))

        async def load() -> None:
            try:
                await self._unless_dead(self.llm.collective_rpc("agentrl_update_weights", args=(update_info,)))
            except BaseException:
                self.weights_lost = True
                raise

        return await self._swap(version, load)

    async def _unless_dead(self, call):
        """Await a call to the engine core, or raise EngineDeadError once the core is found dead: a call
        to a core that died never answers, and nothing else may be asking it (no generation running)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self.llm  # shutdown() drops it: a call begun on this life keeps watching this life
        task = asyncio.ensure_future(call)
        while True:
            done, _ = await asyncio.wait([task], timeout=0.25)
            if done:
                return task.result()
            if llm.errored or self.llm is not llm:
                task.cancel()
                raise EngineDeadError("the vLLM engine core died during a weight load")

    async def _swap(self, version: int, load) -> float:
        async with self._lock:
            t0 = time.perf_counter()
            # Pause and resume are calls to the core too: on a core that died they never answer.
            await self._unless_dead(self.llm.pause_generation(mode="keep", clear_cache=True))
            try:
                await load()
                # Tokens sampled before the pause keep the old version even if their stream reads them
                # after the update: each open stream gets a cut at the count sampled so far.
                for rid, sampled in (await self._sampled_so_far()).items():
                    if rid in self._cuts:
                        self._cuts[rid].append((sampled, self.version))
                self.version = version
            finally:
                if not self.weights_lost and self.llm is not None and not self.llm.errored:
                    await self._unless_dead(self.llm.resume_generation())
            return time.perf_counter() - t0

    def healthy(self) -> bool:
        return self.llm is not None and not self.llm.errored and not self.weights_lost

    def shutdown(self) -> None:
        if self.llm is None:
            return
        self.llm.shutdown()
        # Drop the AsyncLLM now: its __del__ shuts down again and fails if it runs during interpreter exit.
        self.llm = None
        gc.collect()
