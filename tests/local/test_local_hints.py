"""When the local service cannot isolate commands, it says why once and how to fix it once."""

from __future__ import annotations

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.model.errors import PiShipError


def refusal(bwrap: str) -> PiShipError:
    with pytest.raises(PiShipError) as raised:
        LocalE2bService(bwrap=bwrap)
    return raised.value


def test_a_binary_that_fails_silently_is_not_answered_with_namespace_advice() -> None:
    error = refusal("/bin/false")
    assert "failed without saying why" in str(error)
    assert "sysctl" not in error.render()
    assert error.user_action is not None and "working bubblewrap" in error.user_action


def test_a_missing_binary_names_it_and_gives_one_fix() -> None:
    error = refusal("/nonexistent/bwrap")
    assert "/nonexistent/bwrap does not exist" in str(error)
    assert error.render().count("working bubblewrap") == 1


def test_the_hint_is_in_the_action_only() -> None:
    error = refusal("/bin/false")
    assert error.user_action is not None
    assert error.user_action not in str(error)
