"""What a worker pool can leave behind, looked up from /proc, /dev/shm and the temp folder: live
processes, shared-memory segments, private rendezvous folders, listening sockets."""

from __future__ import annotations

import ipaddress
import os
import tempfile
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """True for a live process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def exited(child: int) -> bool:
    """True once this process's child ``child`` can be reaped (its exit status is waiting; it is
    not reaped here). A killed process shows "Z" in /proc a moment before that: its other threads
    are still exiting, and until they have, waitpid() reports it as running."""
    try:
        return os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already (by the pool's own check)
        return True


def segments(prefix: str) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(prefix + "*"))


def private_dirs(prefix: str) -> list[str]:
    """A pool's private folders (rendezvous store, segments that did not fit /dev/shm)."""
    return sorted(p.name for p in Path(tempfile.gettempdir()).glob(prefix + "*"))


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (workers carry their pool's prefix)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace") and alive(int(cmdline.parent.name)):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def leftovers(pids: list[int], prefix: str) -> dict[str, list]:
    """Everything of a pool still there: processes, segments, private folders."""
    return {
        "processes": [p for p in pids if alive(p)] + [p for p in processes_mentioning(prefix) if p not in pids],
        "segments": segments(prefix),
        "private_dirs": private_dirs(prefix),
    }


def assert_gone(pids: list[int], prefix: str, within: float = 10.0) -> None:
    """Within ``within`` seconds nothing of the pool is left."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(leftovers(pids, prefix).values()):
        time.sleep(0.05)
    left = leftovers(pids, prefix)
    assert left == {"processes": [], "segments": [], "private_dirs": []}, f"left after {within} s: {describe(left)}"


def describe(left: dict[str, list]) -> str:
    """The leftovers with each process's command line and kernel state (what it was doing)."""
    procs = []
    for pid in left["processes"]:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
            wchan = Path(f"/proc/{pid}/wchan").read_text()
        except OSError:
            cmd, state, wchan = "?", "?", "?"
        procs.append(f"{pid} [{state} {wchan}] {cmd}")
    return f"processes {procs}, segments {left['segments']}, private_dirs {left['private_dirs']}"


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _address(hex_addr: str) -> str:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # /proc prints IPv6 as four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return f"{ip}:{int(port, 16)}"


def listening_sockets(pid: int) -> list[str]:
    """ "address:port" of every TCP socket ``pid`` listens on (IPv4 and IPv6)."""
    mine = _socket_inodes(pid)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[9]) in mine:  # 0A: LISTEN
                found.append(_address(fields[1]))
    return sorted(found)


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    ip = ipaddress.ip_address(host)
    return ip.is_loopback or (getattr(ip, "ipv4_mapped", None) is not None and ip.ipv4_mapped.is_loopback)
