"""A backend whose every sandbox or claim carries the pool's labels.

    backend = labelled(E2bCompatibleBackend(...), {"run": "nightly-42"})
    activate_sandbox(policy, backend=backend, workspace=".")  # metadata run=nightly-42

E2B puts them in the sandbox's metadata, Kubernetes on every claim, so
``piship-remote sweep --label run=nightly-42`` finds what a crashed run left.
"""

from __future__ import annotations

from collections.abc import Mapping

from piship_remote.backends._owned import check_labels
from piship_remote.backends.base import Availability, Backend, Instance, Labelled
from piship_remote.model.errors import ConfigInvalid
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.report import Capabilities

__all__ = ["labelled"]


def labelled(backend: Backend, labels: Mapping[str, str]) -> Backend:
    """``backend`` with ``labels`` on what it creates; ``backend`` itself when there are none."""
    checked = check_labels(labels)
    if not checked:
        return backend
    if not isinstance(backend, Labelled):
        raise ConfigInvalid(f"the {backend.id} backend cannot label its sandboxes")
    return _LabelledBackend(backend, checked)


class _LabelledBackend:
    """Everything as ``backend`` does, but ``prepare`` passes the labels."""

    def __init__(self, backend: Backend, labels: dict[str, str]) -> None:
        self._backend = backend
        self._labels = labels
        self.id = backend.id
        self.provider = backend.provider
        self.redactor = backend.redactor

    def available(self) -> Availability:
        return self._backend.available()

    def capabilities(self) -> Capabilities:
        return self._backend.capabilities()

    def prepare(self, profile: SandboxProfile) -> Instance:
        backend = self._backend
        assert isinstance(backend, Labelled)  # checked by labelled()
        return backend.prepare(profile, labels=self._labels)
