"""The service's end of the agent's control socket when the agent dies mid-start."""

from __future__ import annotations

import socket

import pytest

from piship_remote.local.isolation.agent_link import AgentGone, AgentLink, send_start, started_pid


def test_a_start_sent_just_before_the_agent_dies_is_the_agent_gone() -> None:
    service_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    link = AgentLink(service_end)
    _, status_read = send_start(link, {"cmd": "/bin/true"}, {}, [], [], [])
    agent_end.close()  # the packet, with the status pipe's write end, is dropped unread
    with pytest.raises(AgentGone), service_end:
        started_pid(status_read)
