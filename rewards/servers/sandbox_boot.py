"""The first code that runs inside a sandbox (its source is passed to the sandboxed `python3 -I -c`).

It reads the call from stdin (one line with the header's byte length, the marshal-encoded header,
then the user's own stdin), writes the call's files into the working directory, sets the resource
limits on itself (hard and soft, so the code cannot raise them), then runs the code the way
`python3 -c` would (or execs `/bin/sh -c` for a shell command). Setting the limits here rather than
from the server costs no extra process per call. It imports only builtin modules before the code
runs (marshal, not json: json's import of `re` alone doubled the start-up of a sandbox). Standard
library only and Python 3.8 syntax: it runs on the system python, not the project's venv.
"""

import marshal
import os
import resource
import sys

_LIMITS = {"cpu_s": resource.RLIMIT_CPU, "memory_bytes": resource.RLIMIT_AS,
           "processes": resource.RLIMIT_NPROC, "file_bytes": resource.RLIMIT_FSIZE,
           "open_files": resource.RLIMIT_NOFILE}


def _read_exact(n):
    chunks, got = [], 0
    while got < n:
        chunk = os.read(0, n - got)
        if not chunk:
            raise SystemExit("sandbox: the call's header was cut short")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_header():
    # byte by byte up to the newline: a buffered read would swallow the user's stdin that follows
    digits = b""
    while not digits.endswith(b"\n"):
        digits += _read_exact(1)
    return marshal.loads(_read_exact(int(digits)))


def _write_files(files):
    for name, data in files.items():
        path = os.path.relpath(os.path.join(os.getcwd(), name))  # absolute names must lie under cwd
        if path.startswith(".."):
            raise SystemExit("sandbox: file %r is outside the working directory %s" % (name, os.getcwd()))
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def _set_limits(limits):
    for name, which in _LIMITS.items():
        value = int(limits[name])
        # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL one second later if it is caught
        resource.setrlimit(which, (value, value + 1 if name == "cpu_s" else value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _run_python(code):
    main = type(sys)("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    sys.path.insert(0, "")  # like `python -c`: files written next to the code are importable
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - printed as `python -c` prints it, without this frame
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.stderr.flush()
        os._exit(1)


def boot():
    header = _read_header()
    os.chdir(header["cwd"])
    _write_files(header.get("files") or {})
    _set_limits(header["limits"])
    if header["mode"] == "shell":
        sys.stdout.flush()
        os.execv("/bin/sh", ["sh", "-c", header["code"]])
    _run_python(header["code"])


if __name__ == "__main__":  # the sandbox runs this source with `python3 -c`; importing it runs nothing
    boot()
