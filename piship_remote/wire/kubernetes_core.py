"""The core Kubernetes objects a port-forward to a Service reads: the Service and its Endpoints.

Only the fields used are modelled; others are ignored. :func:`read` structures a
JSON object and raises ``ValueError`` naming what is wrong::

    >>> service = read({"spec": {"ports": [{"name": "http", "port": 8080}]}}, Service)
    >>> service.spec.ports[0].name
    'http'
    >>> endpoints = read({"subsets": [{"addresses": [{"targetRef": {"kind": "Pod",
    ...     "name": "router-1"}}], "ports": [{"name": "http", "port": 8080}]}]}, Endpoints)
    >>> endpoints.subsets[0].addresses[0].target_ref.name
    'router-1'
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, override

__all__ = [
    "EndpointAddress",
    "EndpointPort",
    "EndpointSubset",
    "Endpoints",
    "ObjectReference",
    "Service",
    "ServicePort",
    "ServiceSpec",
    "read",
]

T = TypeVar("T")


@attrs.frozen
class ServicePort:
    port: int
    name: str = ""


@attrs.frozen
class ServiceSpec:
    ports: tuple[ServicePort, ...] = ()


@attrs.frozen
class Service:
    spec: ServiceSpec = ServiceSpec()


@attrs.frozen
class ObjectReference:
    kind: str = ""
    name: str = ""


@attrs.frozen
class EndpointAddress:
    """A ready address (not-ready ones are listed apart, under ``notReadyAddresses``)."""

    target_ref: ObjectReference | None = None


@attrs.frozen
class EndpointPort:
    port: int
    name: str = ""


@attrs.frozen
class EndpointSubset:
    addresses: tuple[EndpointAddress, ...] = ()
    ports: tuple[EndpointPort, ...] = ()


@attrs.frozen
class Endpoints:
    subsets: tuple[EndpointSubset, ...] = ()


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    converter.register_structure_hook(
        EndpointAddress,
        make_dict_structure_fn(EndpointAddress, converter, target_ref=override(rename="targetRef")),
    )
    return converter


_CONVERTER = _converter()


def read(body: Any, kind: type[T]) -> T:
    """``body`` (a parsed JSON object) as ``kind``; ``ValueError`` when it is not one."""
    try:
        return _CONVERTER.structure(body, kind)
    except (cattrs.BaseValidationError, TypeError, ValueError, AttributeError) as error:
        detail = (
            " ".join(cattrs.transform_error(error))
            if isinstance(error, cattrs.BaseValidationError)
            else str(error)
        )
        raise ValueError(f"not a {kind.__name__}: {detail[:200]}") from None
