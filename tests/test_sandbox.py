"""The code sandbox server (rewards.servers.sandbox) as a real process on loopback, attacked by the code a
model could send: each escape is contained, and the server still answers a plain `print(1)` after it.

The same core cases run under bubblewrap and under the unshare fallback (forced with --isolation unshare).
The server runs with a secret in its environment and a fake ~/.ssh key in its HOME, both of which the
sandboxed code tries to read. Processes left behind are found by a marker in their command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from rewards.servers import sandbox, serve

ROOT = Path(__file__).resolve().parents[1]
SECRET = f"sk-sandbox-test-{uuid.uuid4().hex}"
ISOLATIONS = ("bwrap", "unshare")
LIMITS = ["--timeout", "3", "--cpu-s", "1", "--memory-mb", "128", "--call-memory-mb", "256", "--processes", "32", "--output-bytes", "8192",
          "--tmp-mb", "8", "--shm-mb", "4"]

@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text(f"-----BEGIN FAKE KEY----- {SECRET}\n")
    return home


@pytest.fixture(scope="module")
def servers(home):
    """Both isolations' servers, and a bwrap one for test_killed_server_leaves_no_sandbox_behind to kill,
    started at once (each start imports the project: seconds). name -> (url, pid)."""
    for name in ISOLATIONS:
        if shutil.which(name) is None:
            pytest.fail(f"{name} is not installed (./scripts/install.sh sandbox installs bubblewrap; unshare is util-linux)")
    env = {**os.environ, "HOME": str(home), "AGENTRL_TEST_SECRET": SECRET, "PYTHONPATH": str(ROOT)}
    options = {name: ["--isolation", name, *LIMITS] for name in ISOLATIONS} | {"victim": ["--timeout", "60"]}
    procs = {name: subprocess.Popen([sys.executable, "-m", "rewards.servers.sandbox", "--port", "0", *args], cwd=ROOT,
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, args in options.items()}
    with listening(procs) as urls:
        for name in ISOLATIONS:
            health = httpx.get(urls[name][0] + "/health").json()
            assert {k: health[k] for k in ("status", "isolation")} == {"status": "ok", "isolation": name}
        yield urls


@contextlib.contextmanager
def listening(procs: dict[str, subprocess.Popen]):
    """name -> (url, pid) of sandbox servers started as `procs`, once each printed its address;
    every one terminated on the way out."""
    try:
        urls = {}
        for name, proc in procs.items():
            line = proc.stdout.readline()  # "sandbox server listening on http://127.0.0.1:<port>"
            assert line.startswith("sandbox server listening on http://127.0.0.1:"), proc.stderr.read()[-3000:]
            urls[name] = line.split()[-1], proc.pid
        yield urls
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=10)


@pytest.fixture(params=ISOLATIONS)
def server(request, servers) -> tuple[str, int]:
    """(url, server pid) of the server isolated by bubblewrap, then by the unshare fallback."""
    return servers[request.param]


def call(url: str, code: str, name: str = "python") -> dict:
    key = "code" if name == "python" else "command"
    response = httpx.post(url + "/call", json={"name": name, "arguments": {key: code}}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def running(marker: str) -> list[int]:
    """Host pids whose command line holds `marker`, or whose name (comm, 15 bytes) starts with it."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() or \
                    Path(f"/proc/{pid}/comm").read_bytes().startswith(marker.encode()[:15]):
                found.append(int(pid))
        except OSError:
            pass
    return found


def leftovers(marker: str) -> list[int]:
    """running(marker), after up to 2 s for the kernel to finish a kill."""
    for _ in range(20):
        if not (found := running(marker)):
            return []
        time.sleep(0.1)
    return found


def assert_still_serving(url: str) -> None:
    assert call(url, "print(1)") == {"content": "1\n", "is_error": False}


def test_tool_protocol(server):
    url, _ = server
    tools = httpx.get(url + "/tools").json()["tools"]
    assert [t["function"]["name"] for t in tools] == ["python"]
    assert tools[0]["function"]["parameters"]["required"] == ["code"]
    assert call(url, "print(sum(i * i for i in range(10)))") == {"content": "285\n", "is_error": False}
    failed = call(url, "x = 1\nprint('before')\nraise ValueError('bad value')")
    assert failed["is_error"] and failed["content"].startswith("before\nTraceback")
    assert "ValueError: bad value\n[exit status 1]" in failed["content"]
    assert call(url, "echo $((6 * 7))", name="shell") == {"content": "42\n", "is_error": False}
    assert call(url, "import sys; sys.exit(3)")["content"] == "[exit status 3]"
    # every call gets a fresh sandbox (warm ones included): nothing of the previous call is left
    assert call(url, "open('/tmp/state', 'w').write('left')\nprint('wrote')")["content"] == "wrote\n"
    assert call(url, "import os; print(os.path.exists('/tmp/state'))")["content"] == "False\n"
    assert httpx.post(url + "/call", json={"name": "rm_rf", "arguments": {}}).status_code == 404
    assert httpx.post(url + "/call", json={"name": "python", "arguments": {"code": 7}}).json() == {
        "content": "error: argument 'code' must be a string", "is_error": True}


def test_concurrent_calls_each_get_their_own_answer(server):
    url, _ = server

    async def run() -> list[dict]:
        async with httpx.AsyncClient(timeout=30) as client:
            responses = await asyncio.gather(*(client.post(url + "/call", json={
                "name": "python", "arguments": {"code": f"import os; print({i} * {i}, os.getpid())"}})
                for i in range(12)))
        return [r.json() for r in responses]

    results = asyncio.run(run())
    assert [r["content"].split()[0] for r in results] == [str(i * i) for i in range(12)]
    assert all(not r["is_error"] and r["content"].split()[1] in ("1", "2") for r in results)  # own pid namespace


ESCAPES = {
    "socket to loopback and outside": """
import socket
for host, port in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("10.0.0.1", 80)]:
    try:
        socket.create_connection((host, port), timeout=2)
        print("CONNECTED", host)
    except OSError as exc:
        print("blocked", host, exc.errno)
try:
    socket.getaddrinfo("example.com", 80)
    print("CONNECTED dns")
except OSError:
    print("blocked dns")
""",
    "reading the project, ~/.ssh, /etc/shadow": """
import os
for path in [{project!r}, {key!r}, "/root/.ssh/id_rsa", "/etc/shadow", "/etc/passwd", "/work"]:
    try:
        print("READ", path, open(path).read()[:40] if os.path.isfile(path) else os.listdir(path))
    except OSError as exc:
        print("blocked", path, type(exc).__name__)
""",
    "the server's environment through /proc": """
import os
pids = [p for p in os.listdir("/proc") if p.isdigit()]
seen = []
for pid in pids:
    for part in ("environ", "cmdline"):
        try:
            data = open(f"/proc/{{pid}}/{{part}}", "rb").read()
        except OSError:
            continue
        seen.append(b"{secret}" in data)
print("pids", len(pids), "server visible", os.path.exists("/proc/{server_pid}"), "found", any(seen),
      "in env", "{secret}" in str(os.environ))
""",
    "writing outside the tmpfs": """
import os
for path in ["/usr/x", "/x", "/dev/x", "/proc/x", {project_file!r}, "/bin/x", "/etc/hosts"]:
    try:
        open(path, "w").write("x")
        print("WROTE", path)
    except OSError as exc:
        print("blocked", path, exc.errno)
open("/tmp/ok", "w").write("fine")
print("tmp", open("/tmp/ok").read())
""",
    "killing or signalling the parent": """
import os, signal
for pid, sig in [(os.getppid(), signal.SIGKILL), (1, signal.SIGKILL), ({server_pid}, signal.SIGKILL),
                 (-1, signal.SIGTERM)]:
    try:
        os.kill(pid, sig)
        print("sent", pid)
    except OSError as exc:
        print("refused", pid, exc.errno)
""",
}


def assert_contained(url: str, server_pid: int, case: str) -> None:
    """ESCAPES[case] sent to the server at `url` (whose pid is `server_pid`) did nothing it tried."""
    project_file = ROOT / "escape-was-here.txt"
    code = ESCAPES[case].format(port=url.rsplit(":", 1)[1], project=str(ROOT / "pyproject.toml"),
                                key=os.path.expanduser("~") + "/.ssh/id_rsa", secret=SECRET, server_pid=server_pid,
                                project_file=str(project_file))
    result = call(url, code)
    out = result["content"]
    assert "CONNECTED" not in out and "READ" not in out and "WROTE" not in out and SECRET not in out, out
    if case.startswith("socket"):
        assert out.count("blocked") == 4, out
    elif case.startswith("reading"):
        assert out.count("blocked") == 6, out
    elif case.startswith("the server"):
        assert "server visible False found False in env False" in out, out
        assert int(out.split()[1]) <= 3, out  # the namespace's init, the code, and nothing of the host
    elif case.startswith("killing"):
        assert f"refused {server_pid} 3" in out, out  # ESRCH: the server is not in the sandbox's pid namespace
    elif case.startswith("writing"):
        assert out.count("blocked") == 7 and "tmp fine" in out and not project_file.exists(), out
    assert not project_file.exists()
    assert_still_serving(url)


@pytest.mark.parametrize("case", ESCAPES)
def test_escape_is_contained(server, case):
    assert_contained(*server, case)


def test_resource_bombs_are_contained(server):
    url, _ = server
    marker = f"forkbomb-{uuid.uuid4().hex}"
    bomb = f"""
import os, sys
child = "import os\\nwhile True:\\n    try: os.fork()\\n    except OSError: pass"
while True:
    try:
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", child, "{marker}"])
    except OSError:
        pass
"""
    result = call(url, bomb)
    # ended by the call's bound as a whole (sandbox_bound.py: a fork refused past --processes 32)
    assert result == {"content": "[process limit: the call tried to run over 32 processes and threads; killed]",
                      "is_error": True}
    assert leftovers(marker) == []
    memory = call(url, "x = []\nwhile True: x.append(bytearray(10**7))")
    assert memory["is_error"] and "MemoryError" in memory["content"]
    disk = call(url, "open('/tmp/big', 'wb').write(b'x' * 64 * 2**20)")
    assert disk["is_error"] and ("File too large" in disk["content"] or "No space left" in disk["content"])
    loop = call(url, "while True: pass")
    assert loop["is_error"] and loop["content"] in ("[exit status 152 (SIGXCPU: CPU time limit of 1 s)]",
                                                    "[timeout after 3.0 s]")
    flood = call(url, "import sys\nwhile True: sys.stdout.write('x' * 65536)")
    assert flood["is_error"] and flood["content"].endswith("[output over 8192 bytes: truncated and killed]")
    assert flood["content"].count("x") == 8192
    sleep = call(url, "import time\nprint('started')\ntime.sleep(60)")
    assert sleep == {"content": "started\n[timeout after 3.0 s]", "is_error": True}
    assert_still_serving(url)


def test_no_daemon_survives_the_call(server):
    url, _ = server
    marker = f"daemon-{uuid.uuid4().hex}"
    daemon = f"""
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
    os._exit(0)
os.wait()
print("parent done")
"""
    assert call(url, daemon) == {"content": "parent done\n", "is_error": False}
    assert leftovers(marker) == []
    assert_still_serving(url)


def test_etc_and_names_say_nothing_of_the_host(server):
    """/etc holds only `hosts`: localhost resolves, and a server the code starts there is reachable (on the
    sandbox's own loopback); getpass.getuser() answers from USER, without the host's user database."""
    code = ("import getpass, os, socket\nserver = socket.create_server(('localhost', 0))\n"
            "socket.create_connection(server.getsockname(), timeout=2)\n"
            "print(os.listdir('/etc'), open('/etc/hosts').read().split(), socket.gethostname(), getpass.getuser())")
    assert call(server[0], code) == {"content": "['hosts'] ['127.0.0.1', 'localhost', '::1', 'localhost'] sandbox "
                                                "sandbox\n", "is_error": False}


def test_multiprocessing_gets_a_fresh_bounded_dev_shm(server):
    url, _ = server
    pool = call(url, "import multiprocessing as mp\nwith mp.Pool(2) as pool:\n    print(pool.map(abs, [-1, -2, -3]))")
    assert pool == {"content": "[1, 2, 3]\n", "is_error": False}  # its locks are semaphores in /dev/shm
    # 6 MiB: over --shm-mb 4 (the tmpfs is full), under --tmp-mb 8 (RLIMIT_FSIZE would say "File too large")
    full = call(url, "import os\nprint(os.listdir('/dev/shm'))\nopen('/dev/shm/left', 'w').write('x')\n"
                     "open('/dev/shm/big', 'wb').write(b'x' * (6 << 20))")
    assert full["is_error"] and full["content"].startswith("[]\n") and "No space left on device" in full["content"]
    assert call(url, "import os; print(os.listdir('/dev/shm'))")["content"] == "[]\n"  # nothing of the last call


def test_multiprocessing_fork_bomb_is_contained(server):
    url, _ = server
    tag = uuid.uuid4().hex[:15]  # every bomb process names itself (comm) so the host can look for it
    bomb = f"""
import multiprocessing as mp
def bomb(depth):
    open("/proc/self/comm", "w").write("{tag}")
    said = False
    while True:
        try:
            mp.Process(target=bomb, args=(depth + 1,)).start()
        except OSError as exc:
            if depth == 0 and not said:
                print("refused", exc.errno, flush=True)
                said = True
bomb(0)
"""
    result = call(url, bomb)
    # EAGAIN at --processes 32 (the cgroup's pids.max), which ends the call; "refused" may be printed first
    assert result["content"].endswith("[process limit: the call tried to run over 32 processes and threads; killed]")
    assert result["is_error"] and set(result["content"].splitlines()[:-1]) <= {"refused 11"}, result
    assert leftovers(tag) == []
    assert_still_serving(url)


def test_start_up_error_when_no_isolation_works(tmp_path, monkeypatch, capsys):
    (tmp_path / "bin").mkdir()
    if shutil.which("setpriv"):  # a root server needs it to drop to nobody; only bwrap and unshare go missing
        (tmp_path / "bin" / "setpriv").symlink_to(shutil.which("setpriv"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(SystemExit) as exc:
        sandbox.main(["--port", "0"])
    message = str(exc.value.code)
    assert message.startswith("sandbox server cannot start: no sandbox isolation works here")
    assert "bwrap: not found on PATH" in message and "unshare: not found on PATH" in message
    assert "apt-get install bubblewrap" in message and "--isolation none" in message
    assert capsys.readouterr().out == ""  # never "listening"


def test_isolation_none_only_by_name_and_loudly(caplog):
    async def run() -> dict:
        app = sandbox.make_app(sandbox.SandboxServerConfig(isolation="none"))
        async with serve(app) as url, httpx.AsyncClient() as client:
            assert (await client.get(url + "/health")).json()["isolation"] == "none"
            response = await client.post(url + "/call", json={"name": "python", "arguments": {"code": "print(6*7)"}})
            return response.json()

    assert asyncio.run(run()) == {"content": "42\n", "is_error": False}
    assert "sandbox isolation is OFF (--isolation none)" in caplog.text
    with pytest.raises(ValidationError, match="isolation"):
        sandbox.SandboxServerConfig(isolation="off")


def test_sandbox_fusion_client(server):
    from sandbox_fusion import RunCodeRequest, RunStatus, SummaryMapping, run_code, summary_run_code_result

    url, _ = server
    files = {"data.txt": "MjEK"}  # base64 of "21\n"
    ok = run_code(RunCodeRequest(code="import sys\nn = int(open('data.txt').read()) + int(input())\nprint(n)\n"
                                      "print('note', file=sys.stderr)", language="python", stdin="21",
                                 files=files), endpoint=url, max_attempts=1)
    assert ok.status == RunStatus.Success and ok.run_result.return_code == 0
    assert (ok.run_result.stdout, ok.run_result.stderr) == ("42\n", "note\n")
    failed = run_code(RunCodeRequest(code="raise SystemExit(4)", language="python"), endpoint=url, max_attempts=1)
    assert failed.status == RunStatus.Failed and failed.run_result.return_code == 4
    slow = run_code(RunCodeRequest(code="import time; time.sleep(30)", language="python", run_timeout=1),
                    endpoint=url, max_attempts=1)
    assert slow.run_result.status == "TimeLimitExceeded" and slow.message == "timeout after 1.0 s"
    mapping = SummaryMapping(RunTimeout="timeout", RunFailed="failed")
    assert [summary_run_code_result(r, mapping) for r in (ok, failed, slow)] == ["Success", "failed", "timeout"]
    bash = run_code(RunCodeRequest(code="echo $((2 + 3))", language="bash"), endpoint=url, max_attempts=1)
    assert bash.status == RunStatus.Success and bash.run_result.stdout == "5\n"
    with pytest.raises(Exception, match="language 'cpp' is not supported"):
        run_code(RunCodeRequest(code="int main(){}", language="cpp"), endpoint=url, max_attempts=1)
    assert_still_serving(url)


def test_killed_server_leaves_no_sandbox_behind(servers):
    """SIGKILL to the server mid-call (no clean-up of its own runs): the running sandbox dies with it."""
    marker = f"orphan-{uuid.uuid4().hex}"
    url, pid = servers["victim"]
    code = ("import os, sys\n"
            f"os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/call", json={"name": "python", "arguments": {"code": code}}, timeout=1.0)
    for _ in range(100):  # the sandbox is running the call
        if running(marker):
            break
        time.sleep(0.05)
    assert running(marker)
    os.kill(pid, signal.SIGKILL)
    assert leftovers(marker) == []
