"""In-sandbox set-up for the `unshare` isolation (its source runs before sandbox_boot.py's, in the same
`python3 -I -c`), the fallback where bubblewrap is missing: what bwrap does, done by hand.

`unshare --user --map-root-user --mount --pid --fork --net --ipc --uts --cgroup` gives this process
root in a fresh user namespace (and nothing outside it), pid 1 of a fresh pid namespace and a network
namespace of its own (no route out). Here it builds a new root on a tmpfs holding only read-only binds
of the system folders, a fresh /proc, the harmless device nodes, an /etc with only `hosts` and
size-bounded writable tmpfs at /tmp and /dev/shm, makes that root read-only, pivots into it, brings up
the namespace's own loopback and names the host "sandbox", drops every capability (bounding set too,
plus no_new_privs) and forks (the code must not be the namespace's init), so the code that follows is
an ordinary process that sees nothing of the user's files. The layout comes in sys.argv[1:]: /tmp's
and /dev/shm's sizes in bytes, /etc/hosts' text (the root's only /etc file), then one argument per
bind ("/usr") or symlink ("/bin=usr/bin"); no json, whose import costs more than the rest.
Standard library only, Python 3.8 syntax: it runs on the system python.
"""

import ctypes
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
# flags a bind mount keeps from its source (locked in a user namespace: a remount must repeat them);
# statvfs's ST_* values are the MS_* ones
_KEPT = os.ST_NOEXEC | os.ST_NOATIME | os.ST_NODIRATIME | os.ST_RELATIME
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}
_DEVICES = ("null", "zero", "full", "random", "urandom")
_NEW_ROOT = "/tmp"  # any existing folder: the new root is mounted over it, then pivoted into
HOSTNAME = b"sandbox"  # as bwrap's --hostname in sandbox_isolation.py

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "sandbox set-up: %s: %s" % (what, os.strerror(errno)))


def _mount(source, target, fstype, flags, data=None):
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           "mount %s" % target)


def _bind_read_only(source, target, is_file=False):
    if is_file:
        os.makedirs(os.path.dirname(target), exist_ok=True)  # an interpreter's binary or shared library
        open(target, "w").close()
    else:
        os.makedirs(target, exist_ok=True)
    _mount(source, target, None, MS_BIND | MS_REC)
    kept = os.statvfs(source).f_flag & _KEPT
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV * (not is_file) | kept)


def _build_root(tmp_bytes, shm_bytes, hosts, entries):
    root = _NEW_ROOT
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates back to the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for entry in entries:
        link, _, target = entry.partition("=")
        if target:
            os.symlink(target, root + link)
        else:
            _bind_read_only(entry, root + entry, os.path.isfile(entry))
    os.mkdir(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir(root + "/dev")
    for name in _DEVICES:
        _bind_read_only("/dev/" + name, root + "/dev/" + name, is_file=True)
    os.mkdir(root + "/dev/shm")  # a mount of its own: writable after the root is made read-only
    _mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=1777" % shm_bytes)
    os.mkdir(root + "/etc")
    with open(root + "/etc/hosts", "w") as f:  # read-only with the root, below
        f.write(hosts)
    os.mkdir(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=1777" % tmp_bytes)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    # pivot_root(".", "."): the old root ends up stacked on the new one, and is then detached
    _check(_libc.syscall(_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")


def _network_and_name():
    """What bwrap does besides mounts: the network namespace's loopback up (unshare leaves it down, so a
    server the code starts on 127.0.0.1 would be unreachable; the host's loopback stays out of reach),
    and a hostname that says nothing of the host's."""
    import _socket  # the C module alone: `socket`'s imports cost more than the rest of this set-up

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    ifreq = ctypes.create_string_buffer(40)  # struct ifreq: the name, then the flags (a short) at byte 16
    ifreq[:2] = b"lo"
    ctypes.c_short.from_buffer(ifreq, 16).value = 0x1 | 0x8 | 0x40  # IFF_UP | IFF_LOOPBACK | IFF_RUNNING
    _check(_libc.ioctl(sock.fileno(), 0x8914, ifreq), "bring up the loopback")  # SIOCSIFFLAGS
    sock.close()
    _check(_libc.sethostname(HOSTNAME, len(HOSTNAME)), "sethostname")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities():
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(24, cap, 0, 0, 0), "drop capability %d from the bounding set" % cap)  # PR_CAPBSET_DROP
    _check(_libc.prctl(38, 1, 0, 0, 0), "set no_new_privs")  # PR_SET_NO_NEW_PRIVS
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3: all zero
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _stay_as_init():
    """Run the code in a child and wait for it here: the kernel never delivers a signal without a handler
    to a pid namespace's init (RLIMIT_CPU's SIGXCPU and SIGKILL included), so the code must not be pid 1.
    Exits with the child's status, a signal as 128 + its number (as bwrap reports it)."""
    pid = os.fork()
    if pid == 0:
        return
    status = os.waitpid(pid, 0)[1]
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def setup():
    _build_root(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:])
    _network_and_name()
    _drop_capabilities()
    _stay_as_init()


if __name__ == "__main__":
    setup()
