"""Count this process's open TCP sockets to a port (Linux ``/proc``), for leak tests."""

from __future__ import annotations

import os


def sockets_to(port: int) -> int:
    """How many of this process's file descriptors are TCP sockets connected to ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                    if remote_port == port:
                        inodes.add(fields[9])
        except FileNotFoundError:
            continue
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            count += 1
    return count
