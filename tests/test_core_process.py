"""agentrl.rollout.core_process: an engine core forked from the warm fork server runs as a spawned one
would, with the environment, OpenMP threads, core binding and process title of the moment it starts.
The fork server here preloads nothing (its own process, so the suite's server is left alone)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import json, multiprocessing, os, sys
    from agentrl.rollout import core_process

    def report(path):
        import setproctitle, torch
        setproctitle.setproctitle("VLLM::EngineCore")  # what vLLM's run_engine_core does
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            title = f.read().split(b"\\0")[0].decode()
        json.dump({"late": os.environ.get("AGENTRL_LATE"), "gone": os.environ.get("AGENTRL_GONE"),
                   "threads": torch.get_num_threads(), "cpus": sorted(os.sched_getaffinity(0)),
                   "title": title, "parent": multiprocessing.parent_process().pid}, open(path, "w"))

    if __name__ == "__main__":
        os.environ["AGENTRL_GONE"] = "set before the server started"
        multiprocessing.set_forkserver_preload(["torch"])
        from multiprocessing import forkserver
        forkserver.ensure_running()
        del os.environ["AGENTRL_GONE"]
        os.environ.update(AGENTRL_LATE="set after", OMP_NUM_THREADS="1", OMP_PLACES="{0}")
        p = core_process._CONTEXT.Process(target=report, args=(sys.argv[1],))
        p.start()
        p.join()
        print(os.getpid(), p.exitcode)
""")


def test_a_forked_core_has_the_environment_threads_binding_and_title_of_its_start(tmp_path: Path):
    script, out = tmp_path / "fork_probe.py", tmp_path / "report.json"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    parent_pid, exitcode = map(int, done.stdout.split())
    assert exitcode == 0
    assert json.loads(out.read_text()) == {"late": "set after", "gone": None, "threads": 1, "cpus": [0],
                                           "title": "VLLM::EngineCore", "parent": parent_pid}
