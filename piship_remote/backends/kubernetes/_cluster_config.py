"""Where the cluster is and who this client is: a kubeconfig context, or the pod's service account.

Both are read by the ``kubernetes`` package's own loaders (the ``kubernetes`` extra)
rather than parsed here: they follow what kubectl does — merged ``$KUBECONFIG``
lists, paths relative to the file that names them, embedded ``*-data``, token files,
and the exec plugin protocol (``ExecCredential``, re-run once its credential expires)
— and a second parser would drift from them::

    access = from_kubeconfig(None, context="kind-dev")     # or in_cluster()
    session = access.session()        # the cluster's CA, and its client certificate
    token = access.token.read()       # bearer, refreshed as the loader says (or None)

The session carries the CA and the client certificate only for the API server; the
backend talks to the router through another session, so neither reaches it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import requests

from piship_remote.model.errors import CONFIG_INVALID, TLS_POLICY_VIOLATION, PiShipError

__all__ = [
    "SERVICE_ACCOUNT",
    "ClusterAccess",
    "TokenSource",
    "cluster_options",
    "from_kubeconfig",
    "in_cluster",
    "kubeconfig_path",
]

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_DEFAULT_KUBECONFIG = "~/.kube/config"
_INSTALL = "pip install 'piship-remote[kubernetes]'"
_BEARER = "bearer "


class TokenSource:
    """The bearer token a loaded ``kubernetes`` configuration gives, read for each request.

    ``read()`` lets the loader refresh first (an exec plugin past its expiry is re-run,
    the service-account token file re-read every minute); ``renew()``, called on a 401,
    loads the configuration again at once and says whether the token changed.
    """

    def __init__(self, configuration: Any, reload: Callable[[Any], None]) -> None:
        self._configuration = configuration
        self._reload = reload
        self._lock = threading.Lock()  # the loaders' refresh hooks are not thread-safe

    def read(self) -> str | None:
        with self._lock:
            value = self._configuration.get_api_key_with_prefix("BearerToken")
        return _bearer_value(value)

    def renew(self) -> bool:
        with self._lock:
            before = self._configuration.api_key.get("BearerToken")
            try:
                self._reload(self._configuration)
            except Exception:  # the loader's failure: no renewed token
                return False
            return bool(self._configuration.api_key.get("BearerToken")) and (
                self._configuration.api_key.get("BearerToken") != before
            )


@attrs.frozen
class ClusterAccess:
    """The API server's address and namespace, its CA, and this client's credentials."""

    endpoint: str
    namespace: str | None
    ca_file: str | None
    client_certificate: tuple[str, str] | None
    proxy: str | None
    token: TokenSource | None

    def session(self) -> requests.Session:
        """A session for the API server only: its CA, the client certificate, its proxy."""
        session = requests.Session()
        if self.ca_file is not None:
            session.verify = self.ca_file
        if self.client_certificate is not None:
            session.cert = self.client_certificate
        if self.proxy is not None:
            session.proxies = {"http": self.proxy, "https": self.proxy}
        return session


def cluster_options(access: ClusterAccess, options: dict[str, Any]) -> dict[str, Any]:
    """The backend's options for ``access``: the API server's endpoint, session and token;
    the router gets ``router_credential`` only (none without it), through ``session`` or
    a plain session, so the cluster's credentials never reach it."""
    for given in ("endpoint", "credential", "credential_rejected", "router_session"):
        if given in options:
            raise TypeError(f"{given} comes from the cluster's configuration")
    token = access.token
    chosen = dict(options)
    chosen.setdefault("namespace", access.namespace or "default")
    chosen["router_session"] = chosen.pop("session", None) or requests.Session()
    if chosen.get("router_credential") is None:
        chosen["router_credential"] = _no_credential
    chosen.update(
        endpoint=access.endpoint,
        credential=token.read if token is not None else None,
        credential_rejected=token.renew if token is not None else None,
        session=access.session(),
    )
    return chosen


def _no_credential() -> str | None:
    return None


def kubeconfig_path(path: str | os.PathLike[str] | None) -> str:
    """``path``, else ``$KUBECONFIG`` (a list kubectl merges), else ``~/.kube/config``."""
    if path is not None:
        return os.fspath(path)
    return os.environ.get("KUBECONFIG") or _DEFAULT_KUBECONFIG


def from_kubeconfig(path: str | os.PathLike[str] | None, context: str | None) -> ClusterAccess:
    """What the kubeconfig's ``context`` (default: its current context) says."""
    config = _config_module()
    where = kubeconfig_path(path)
    configuration = _new_configuration()

    def load(target: Any) -> None:
        config.load_kube_config(
            config_file=where, context=context, client_configuration=target, persist_config=False
        )

    try:
        load(configuration)
        contexts, current = config.list_kube_config_contexts(config_file=where)
    except (config.ConfigException, OSError, ValueError, KeyError, TypeError) as error:
        raise PiShipError(
            CONFIG_INVALID,
            f"the kubeconfig {where} cannot be used: {_reason(error)}",
            user_action="Check the file with 'kubectl config view', or pass another "
            "path or context",
        ) from None
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    namespace = _mapping(_mapping(chosen).get("context")).get("namespace")
    return _access(
        configuration, load, namespace if isinstance(namespace, str) and namespace else None
    )


def in_cluster(
    service_account: str = SERVICE_ACCOUNT, environ: Mapping[str, str] | None = None
) -> ClusterAccess:
    """The pod's service account: the API server from ``KUBERNETES_SERVICE_HOST`` and
    ``_PORT``, its CA, the token (re-read as the kubelet rotates it) and namespace."""
    incluster = _config_module().incluster_config
    loader = incluster.InClusterConfigLoader(
        token_filename=os.path.join(service_account, "token"),
        cert_filename=os.path.join(service_account, "ca.crt"),
        environ=os.environ if environ is None else environ,
    )
    configuration = _new_configuration()
    try:
        loader.load_and_set(configuration)
    except (incluster.ConfigException, OSError) as error:
        raise PiShipError(
            CONFIG_INVALID,
            f"the pod's service account cannot be used: {_reason(error)}",
            user_action="Run inside a Kubernetes pod with a mounted service-account token, "
            "or use from_kubeconfig",
        ) from None
    return _access(configuration, loader.load_and_set, _read_namespace(service_account))


def _access(
    configuration: Any, reload: Callable[[Any], None], namespace: str | None
) -> ClusterAccess:
    if configuration.verify_ssl is False:
        raise PiShipError(
            TLS_POLICY_VIOLATION,
            "the kubeconfig turns TLS verification off (insecure-skip-tls-verify)",
            user_action="Give the cluster's CA (certificate-authority) instead",
        )
    if getattr(configuration, "tls_server_name", None):
        raise PiShipError(
            CONFIG_INVALID,
            "the kubeconfig's tls-server-name is not supported",
            user_action="Point the server at a name its certificate carries",
        )
    token = configuration.api_key.get("BearerToken")
    if isinstance(token, str) and not token.lower().startswith(_BEARER):
        raise PiShipError(
            CONFIG_INVALID,
            "the kubeconfig's user authenticates with a username and password, "
            "which Kubernetes no longer accepts",
            user_action="Use a client certificate, a token or an exec plugin",
        )
    host = str(configuration.host or "").rstrip("/")
    if not host:
        raise PiShipError(CONFIG_INVALID, "the kubeconfig's cluster has no server")
    cert, key = configuration.cert_file, configuration.key_file
    return ClusterAccess(
        endpoint=host,
        namespace=namespace,
        ca_file=configuration.ssl_ca_cert or None,
        client_certificate=(cert, key) if cert and key else None,
        proxy=configuration.proxy or None,
        token=TokenSource(configuration, reload) if token else None,
    )


def _bearer_value(value: object) -> str | None:
    if not isinstance(value, str) or not value.lower().startswith(_BEARER):
        return None
    return value[len(_BEARER) :].strip() or None


def _read_namespace(service_account: str) -> str | None:
    try:
        with open(os.path.join(service_account, "namespace"), encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())[:200]
    return text or type(error).__name__


def _config_module() -> Any:
    try:
        import kubernetes.config  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        raise PiShipError(
            CONFIG_INVALID,
            "reading a kubeconfig or the pod's service account needs the kubernetes package",
            user_action=_INSTALL,
        ) from None
    return kubernetes.config


def _new_configuration() -> Any:
    from kubernetes.client import Configuration  # type: ignore[import-untyped, import-not-found, unused-ignore]

    return Configuration()
