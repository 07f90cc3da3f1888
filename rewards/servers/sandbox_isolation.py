"""How a sandbox is started: the command line for each isolation (bubblewrap, unshare, none), the
process credentials it starts with, and the start-up probe that picks one or says why none works.

Every isolation runs the same in-sandbox code (sandbox_boot.py, after sandbox_unshare.py for
`unshare`) on the system python, from a clean environment. bwrap and unshare give each call fresh
user, pid, mount, network, ipc and uts namespaces: no network (not even the host's loopback; a loopback
of its own), a root holding only read-only binds of /usr, /bin, /lib* and the interpreter's runtime, an
/etc with only `hosts` (localhost), the hostname "sandbox", a fresh /proc that shows only the sandbox's
own processes, and two size-bounded tmpfs as the only writable places: /tmp (the working directory) and
/dev/shm (POSIX shared memory, which multiprocessing's locks and queues need; the rest of /dev stays
read-only). Both are fresh for each call; what is written there is host memory the sandbox's RLIMIT_AS
does not see, so their sizes (SandboxLimits.tmp_mb, shm_mb) are what bound it.
A server running as root starts sandboxes as an unprivileged uid (nobody): root's processes are
exempt from RLIMIT_NPROC, and bwrap started by root would keep root's uid inside. setpriv (util-linux)
does that drop, and sets a parent-death SIGKILL so a sandbox never outlives a killed server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import marshal
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal

log = logging.getLogger(__name__)
IsolationName = Literal["auto", "bwrap", "unshare", "none"]
HERE = Path(__file__).resolve().parent
BOOT_SOURCE = (HERE / "sandbox_boot.py").read_text()
UNSHARE_SOURCE = (HERE / "sandbox_unshare.py").read_text()
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# USER and LOGNAME: getpass.getuser() (and the tools that name caches after it) asks them before the
# user database, which the sandbox does not have
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp",
             "USER": "sandbox", "LOGNAME": "sandbox"}
# the sandbox's whole /etc: "localhost" resolves (a server the code starts on its own loopback, which the
# network namespace has); nothing of the host's /etc (users, keys, hostnames, resolvers) is there
ETC_HOSTS = b"127.0.0.1 localhost\n::1 localhost\n"
SANDBOX_CWD = "/tmp"


class SandboxUnavailable(RuntimeError):
    """No isolation asked for can start here; the message names each failure and the fix."""


@dataclass(frozen=True)
class Layout:
    """What a sandbox's root holds: read-only binds (folders), symlinks (link -> target) and /tmp's size."""

    binds: tuple[str, ...]
    symlinks: dict[str, str] = field(default_factory=dict)


# what the interpreter itself says it runs from: its binary, standard library (lib-dynload is in it, or on
# sys.path), its own site-packages, and the folder of its shared libraries (libpython, a conda env's others)
RUNTIME_PROBE = ("import json, sys, sysconfig\np = sysconfig.get_paths()\n"
                 "print(json.dumps([sys.executable, p['stdlib'], p['platstdlib'], p['purelib'], p['platlib'], "
                 "*sys.path[1:], sysconfig.get_config_var('LIBDIR') or '']))")


def runtime_paths(python: str) -> list[str]:
    """The files and folders `python` needs to run with its own packages, nothing else of its prefix: its
    binary, its stdlib (lib-dynload included), its site-packages, and the shared libraries (lib*.so*) in its
    LIBDIR. A prefix may hold much besides (other tools in bin/, include/, share/, other versions beside it,
    whatever was left there); none of that is the runtime."""
    done = subprocess.run([python, "-I", "-c", RUNTIME_PROBE], capture_output=True, text=True, timeout=60,
                          env=CLEAN_ENV)
    if done.returncode != 0:
        raise SandboxUnavailable(f"the sandbox's python {python} does not run: {done.stderr.strip()[-300:]}")
    executable, *folders, libdir = json.loads(done.stdout)
    paths = [os.path.realpath(executable), *(os.path.realpath(f) for f in folders if os.path.isdir(f))]
    if os.path.isdir(libdir):
        paths += sorted(os.path.join(libdir, n) for n in os.listdir(libdir)
                        if n.startswith("lib") and ".so" in n and os.path.isfile(os.path.join(libdir, n)))
    return paths


def system_layout(python: str) -> Layout:
    """The system folders as they are on this host (merged /usr: /bin is a symlink to usr/bin) plus the
    interpreter's runtime (runtime_paths) where it lies outside them. /usr/bin/python3's is all in /usr,
    its dist-packages included: the system's own packages, as a Sandbox Fusion image or an e2b template
    has its runtime's packages."""
    binds, links = [], {}
    for folder in SYSTEM_FOLDERS:
        if os.path.islink(folder):
            links[folder] = os.readlink(folder)
        elif os.path.isdir(folder):
            binds.append(folder)
    for path in sorted(set(runtime_paths(python)), key=len):  # a folder before what lies in it
        if not any(path == b or path.startswith(b + "/") for b in binds):
            binds.append(path)
    return Layout(tuple(binds), links)


@dataclass(frozen=True)
class Isolation:
    """One way of starting a sandbox: `launch(tmp_bytes, shm_bytes)` gives the argv (ending with the
    sandbox's python running the in-sandbox code, behind a drop to `uid` when the server runs as root)
    and the descriptors it must inherit."""

    name: Literal["bwrap", "unshare", "none"]
    python: str
    layout: Layout
    tool: str = ""  # the bwrap or unshare executable
    uid: int | None = None  # run sandboxes as this uid (when the server is root)
    setpriv: str = ""  # util-linux's setpriv: drops root to `uid`, and ties the sandbox's life to the server's

    @property
    def launcher_tasks(self) -> int:
        """Processes a sandbox runs besides the code's own: bwrap's outer one and its pid namespace's init;
        unshare and the python that stays the namespace's init (sandbox_unshare.py); none for `none`."""
        return 0 if self.name == "none" else 2

    @contextlib.contextmanager
    def launch(self, tmp_bytes: int, shm_bytes: int) -> Iterator[tuple[list[str], tuple[int, ...]]]:
        """(argv, fds the sandbox must inherit), the fds closed when the block ends: bwrap reads /etc/hosts
        from a pipe (--ro-bind-data), read once, so one per sandbox."""
        if self.name != "bwrap":
            yield self.command(tmp_bytes, shm_bytes), ()
            return
        read, write = os.pipe()
        try:
            try:
                os.write(write, ETC_HOSTS)  # far below a pipe's buffer: never blocks
            finally:
                os.close(write)
            yield self.command(tmp_bytes, shm_bytes, read), (read,)
        finally:
            os.close(read)

    def command(self, tmp_bytes: int, shm_bytes: int, hosts_fd: int = -1) -> list[str]:
        drop = [self.setpriv, "--pdeathsig", "KILL"] if self.setpriv else []  # a killed server leaves no sandbox
        if self.uid:
            drop += [f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
        boot = [self.python, "-I", "-u", "-c", BOOT_SOURCE]  # -u: what was printed before a kill is seen
        if self.name == "bwrap":
            return [*drop, self.tool, *self._bwrap_args(tmp_bytes, shm_bytes, hosts_fd), *boot]
        if self.name == "unshare":
            layout = [*self.layout.binds, *(f"{link}={target}" for link, target in self.layout.symlinks.items())]
            return [*drop, self.tool, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--net", "--ipc",
                    "--uts", "--cgroup", "--kill-child", "--", self.python, "-I", "-u", "-c",
                    UNSHARE_SOURCE + "\n" + BOOT_SOURCE, str(tmp_bytes), str(shm_bytes), ETC_HOSTS.decode(),
                    *layout]
        return [*drop, *boot]

    def _bwrap_args(self, tmp_bytes: int, shm_bytes: int, hosts_fd: int) -> list[str]:
        args = ["--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--clearenv",
                "--hostname", "sandbox"]
        for key, value in CLEAN_ENV.items():
            args += ["--setenv", key, value]
        for folder in self.layout.binds:
            args += ["--ro-bind", folder, folder]
        for link, target in self.layout.symlinks.items():
            args += ["--symlink", target, link]
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(shm_bytes), "--tmpfs", "/dev/shm",
                 "--remount-ro", "/dev",  # /dev only: /dev/shm is a mount of its own and stays writable
                 "--dir", "/etc", "--ro-bind-data", str(hosts_fd), "/etc/hosts",
                 "--size", str(tmp_bytes), "--tmpfs", SANDBOX_CWD, "--chdir", SANDBOX_CWD,
                 "--remount-ro", "/"]  # bwrap's own root is a tmpfs the sandbox could write to
        return args


def _probe(isolation: Isolation) -> str:
    """'' when a trivial call runs and is isolated as promised; else why not."""
    header = marshal.dumps({"mode": "python", "cwd": SANDBOX_CWD if isolation.name != "none" else "/", "files": {},
                            "code": "import os; print(os.getpid(), sum(p.isdigit() for p in os.listdir('/proc')) < 4, "
                                    "os.path.exists('/home') or os.path.exists('/root'))",
                            "limits": {"cpu_s": 5, "memory_bytes": 1 << 30, "processes": 64, "file_bytes": 1 << 20,
                                       "open_files": 64}})
    try:
        with isolation.launch(1 << 20, 1 << 20) as (argv, fds):
            done = subprocess.run(argv, input=b"%d\n" % len(header) + header, capture_output=True, env=CLEAN_ENV,
                                  timeout=30, pass_fds=fds)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{isolation.tool or isolation.python}: {exc}"
    out = done.stdout.decode(errors="replace").split()
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        return f"exit status {done.returncode}: {' / '.join(tail) or '(no output)'}"
    if isolation.name != "none" and out[1:] != ["True", "False"]:
        return f"started, but did not isolate (saw {' '.join(out)!r})"
    return ""


def choose(name: IsolationName, python: str, uid: int | None) -> Isolation:
    """The isolation `name` asks for (auto: bwrap, else unshare), checked by running a probe call;
    SandboxUnavailable naming every failure and its fix when none works."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise SandboxUnavailable(f"the sandbox's python {python} is not an executable file; pass --python with "
                                 "the system python3 (e.g. /usr/bin/python3)")
    python = os.path.realpath(python)  # the binary runtime_paths binds, not a link to it that is not there
    layout = system_layout(python)
    setpriv = shutil.which("setpriv") or ""
    if os.geteuid() != 0:
        uid = None
    elif not setpriv:
        raise SandboxUnavailable("the server runs as root and `setpriv` (util-linux) is not on PATH to start "
                                 "sandboxes as an unprivileged uid; install util-linux or run the server as a user")
    if name == "none":
        return Isolation("none", python, layout, uid=uid, setpriv=setpriv)
    failures = []
    for candidate in (("bwrap", "unshare") if name == "auto" else (name,)):
        tool = shutil.which(candidate)
        if tool is None:
            failures.append(f"{candidate}: not found on PATH" + (" (./scripts/install.sh sandbox installs bubblewrap)"
                                                                  if candidate == "bwrap" else ""))
            continue
        isolation = Isolation(candidate, python, layout, tool, uid, setpriv)
        why = _probe(isolation)
        if not why:
            if failures:  # the fallback is by design, but never silent
                log.warning("sandbox isolation: using %s; %s", candidate, "; ".join(failures))
            return isolation
        failures.append(f"{candidate} ({tool}): {why}")
    raise SandboxUnavailable(
        "no sandbox isolation works here:\n  " + "\n  ".join(failures) + "\nFix: install bubblewrap "
        "(`apt-get install bubblewrap`, or your distribution's package), or allow unprivileged user "
        "namespaces (sysctl user.max_user_namespaces=15000; kernel.unprivileged_userns_clone=1 on Debian "
        "kernels before 5.10). `--isolation none` runs model code WITHOUT isolation: only on a throwaway machine.")
