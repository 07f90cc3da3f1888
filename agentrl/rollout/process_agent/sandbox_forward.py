"""Runs INSIDE the sandbox as its first process (`python -I -S sandbox_forward.py PORT SOCKET -- argv...`),
standard library only: listens on 127.0.0.1:PORT of the sandbox's own network namespace, pipes every
connection to SOCKET (the host's per-episode proxy, bound into the sandbox), runs argv, and exits as
argv did (a signal as 128 + its number, as bubblewrap reports one).

The sandbox has no network of its own but its loopback, so this port is the program's only way out,
and the host side of SOCKET forwards only the episode's session (process_agent.sandbox).
"""

import os
import signal
import socket
import subprocess
import sys
import threading


def pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                end.shutdown(how)
            except OSError:
                pass


def serve(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()


def main() -> int:
    port, path, argv = int(sys.argv[1]), sys.argv[2], sys.argv[4:]
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    threading.Thread(target=serve, args=(listener, path), daemon=True).start()
    try:
        code = subprocess.call(argv)
    except OSError as exc:
        print(f"cannot start {argv[0]!r} in the sandbox: {exc}", file=sys.stderr)
        return 127
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: os._exit(128 + signal.SIGTERM))
    sys.exit(main())
