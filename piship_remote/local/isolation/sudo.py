#!/usr/bin/python3 -I
"""``sudo`` for the user of a local sandbox of the ``base`` template: runs a command as root.

E2B's ``base`` image lets its user ``sudo`` without a password. A local sandbox's
mounts ignore set-uid bits, so this ``sudo`` asks the sandbox's agent instead (over
the abstract socket :data:`ADDRESS`, private to the sandbox's network namespace),
handing it the terminal or pipes it was given; the agent starts the command as uid
0 (where the service maps a root, see :mod:`piship_remote.local.isolation.user_map`)
and reports its end, which becomes this program's exit status::

    sudo whoami                  # root
    sudo -u root -E make install

Only root is a target user; the environment is kept, with root's ``HOME``, ``USER``
and ``LOGNAME``. Standard library only: it runs with the host's Python in the sandbox.
"""

from __future__ import annotations

import json
import os
import socket
import sys

ADDRESS = "\0piship-sudo"
IGNORED_FLAGS = ("-E", "-H", "-n", "-S", "-k", "--preserve-env", "--non-interactive")
ROOT_NAMES = ("root", "0", "#0")
SIGNAL_BASE = 128


def command(argv: list[str]) -> list[str] | str:
    """The command to run, or why ``argv`` is refused."""
    args = list(argv)
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag == "--":
            break
        if flag == "-u":
            if not args or args.pop(0) not in ROOT_NAMES:
                return "only root can be the target user here"
        elif flag not in IGNORED_FLAGS:
            return f"option {flag} is not supported here"
    return args or "usage: sudo [-u root] [-E] command [arg ...]"


def main() -> int:
    args = command(sys.argv[1:])
    if isinstance(args, str):
        print(f"sudo: {args}", file=sys.stderr)
        return 1
    env = {**os.environ, "HOME": "/root", "USER": "root", "LOGNAME": "root"}
    spec = {"cmd": args[0], "args": args[1:], "env": env, "cwd": os.getcwd(), "uid": 0}
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as agent:
        try:
            agent.connect(ADDRESS)
            socket.send_fds(agent, [json.dumps(spec).encode()], [0, 1, 2])
        except OSError:
            print("sudo: this sandbox has no root (its service does not run as host root)",
                  file=sys.stderr)  # fmt: skip
            return 1
        while packet := agent.recv(65536):
            for line in packet.splitlines():
                status = json.loads(line)
                if "error" in status:
                    print(f"sudo: {status['error']}", file=sys.stderr)
                    return 1
                if "exit" in status:
                    return int(status["exit"])
                if "signal" in status:
                    return SIGNAL_BASE + int(status["signal"])
    return 1


if __name__ == "__main__":
    sys.exit(main())
