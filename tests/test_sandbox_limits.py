"""The code sandbox server's per-call limits and privileges, beyond tests/test_sandbox.py's escape suite:
Sandbox Fusion's `memory_limit_MB` lowers a call's memory limit and never raises it past the server's, and
a server run as an unprivileged user (nobody) isolates its calls as one run as root does.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import httpx
import pytest

from rewards.servers import sandbox, serve
from tests.test_sandbox import ISOLATIONS, LIMITS, ROOT, SECRET, assert_contained, call, listening


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_run_code_memory_limit_lowers_the_limit_never_raises_it(isolation):
    """Sandbox Fusion's memory_limit_MB (raw JSON: the 0.3.7 client has no such field) against a server whose
    maximum is 1024 MiB. RLIMIT_AS caps a process's whole address space; bytearray(n) is one mmap of n bytes.
    python3 -I with nothing imported maps ~15 MiB (VmPeak on Debian 12's 3.11; tens of MiB on any x86-64
    python), so 200 MiB fits under 512 with ~300 MiB to spare, and can never fit under 64, nor 1536 MiB
    under the server's 1024 whatever a call asks for."""

    async def run_code(client: httpx.AsyncClient, url: str, mib: int, limit: int | None) -> dict:
        body = {"code": f"x = bytearray({mib} << 20)\nprint(len(x) >> 20)", "language": "python"}
        if limit is not None:
            body["memory_limit_MB"] = limit
        return (await client.post(url + "/run_code", json=body)).json()

    async def run() -> list[dict]:
        config = sandbox.SandboxServerConfig(isolation=isolation, warm=1, limits={"memory_mb": 1024})
        async with serve(sandbox.make_app(config)) as url, httpx.AsyncClient(timeout=30) as client:
            return [await run_code(client, url, mib, limit)
                    for mib, limit in [(200, 512), (200, 64), (200, None), (1536, 4096), (200, 4096)]]

    fits, too_big, default, clamped, clamped_fits = asyncio.run(run())
    assert (fits["status"], fits["message"], fits["run_result"]["stdout"]) == ("Success", "", "200\n")
    assert too_big["status"] == "Failed" and too_big["run_result"]["stderr"].endswith("MemoryError\n")
    assert (default["status"], default["run_result"]["stdout"]) == ("Success", "200\n")  # -1: the server's 1024
    note = "memory_limit_MB 4096 is above this server's maximum: ran with 1024 MiB"
    assert clamped["status"] == "Failed" and clamped["run_result"]["stderr"].endswith("MemoryError\n")
    assert clamped["message"] == f"exit status 1; {note}"
    assert (clamped_fits["status"], clamped_fits["message"]) == ("Success", note)


def as_nobody(python: str) -> list[str]:
    """`python` run as uid/gid 65534 (nobody) with no groups; as it is when the tests are not root."""
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    return [*drop, python]


def unprivileged_python(env: dict[str, str]) -> str:
    """An interpreter nobody can run that imports this venv's packages: the venv's own when all can read its
    path, else the system python of the same minor version (same ABI) with the venv's site-packages on
    PYTHONPATH: a venv whose base interpreter lies under /root (mode 700; pyenv's, here) runs for root only."""
    tried = {}
    for python in dict.fromkeys([sys.executable, f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"]):
        probe = subprocess.run([*as_nobody(python), "-c", "import aiohttp, pydantic"], env=env,
                               capture_output=True, text=True)
        if probe.returncode == 0:
            return python
        tried[python] = probe.stderr.strip().splitlines()[-1:] or probe.returncode
    pytest.fail(f"no interpreter uid 65534 can run with this venv's packages: {tried} (docs/code-agents.md, "
                "'A server that is not root')")


@pytest.fixture(scope="module")
def unprivileged() -> dict[str, tuple[str, int]]:
    """Servers running as nobody (uid 65534), one per isolation: isolation -> (url, pid)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "AGENTRL_TEST_SECRET": SECRET,
           "PYTHONPATH": f"{ROOT}:{sysconfig.get_paths()['purelib']}"}
    python = unprivileged_python(env)
    procs = {name: subprocess.Popen([*as_nobody(python), "-m", "rewards.servers.sandbox", "--port", "0",
                                     "--isolation", name, *LIMITS], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name in ISOLATIONS}
    with listening(procs) as urls:
        yield urls


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_server_run_as_nobody(unprivileged, isolation):
    """Unprivileged user namespaces are all either isolation needs; a sandbox shares the server's uid here,
    so the cases that matter are the server's environment and signals to the server."""
    url, pid = unprivileged[isolation]
    uid = [line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:")]
    assert uid == (["65534"] if os.geteuid() == 0 else [str(os.getuid())])
    # nobody cannot make a cgroup here (cgroup v1, owned by root): the watchdog bounds each call as a whole
    assert httpx.get(url + "/health").json() == {"status": "ok", "isolation": isolation, "bound": "watchdog"}
    memory = call(url, "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        x = b'x' * (100 << 20)\n"
                       "        import time; time.sleep(5)\n        os._exit(0)\nos.wait()")
    assert memory == {"content": "[memory limit: the call's processes used over 256 MiB in all; killed]",
                      "is_error": True}
    assert call(url, "print(6 * 7)") == {"content": "42\n", "is_error": False}
    assert_contained(url, pid, "the server's environment through /proc")
    assert_contained(url, pid, "killing or signalling the parent")
