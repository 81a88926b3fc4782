"""Where the cluster is and who this client is: a kubeconfig context, or the pod's service account.

Both are read by the ``kubernetes`` package's own loaders (the ``kubernetes`` extra)
rather than parsed here: they follow what kubectl does — merged ``$KUBECONFIG``
lists, paths relative to the file that names them, embedded ``*-data``, token files,
and the exec plugin protocol (``ExecCredential``, re-run once its credential expires)
— and a second parser would drift from them::

    access = from_kubeconfig(None, context="kind-dev")     # or in_cluster()
    session = access.session()        # the cluster's CA, and its client certificate
    token = access.credentials.read() # bearer, refreshed as the loader says (or None)

The session carries the CA and the client certificate only for the API server; the
backend talks to the router through another session, so neither reaches it. An exec
plugin that gives a client certificate (not a token) is run again once that
certificate's ``expirationTimestamp`` is near, as client-go does; the session's
``cert`` then names the new pair, which the transport uses from its next connection.
"""

from __future__ import annotations

import datetime
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import requests

from piship_remote.model.errors import (
    ConfigInvalid,
    TlsPolicyViolation,
)

__all__ = [
    "SERVICE_ACCOUNT",
    "ClusterAccess",
    "ClusterCredentials",
    "cluster_options",
    "from_kubeconfig",
    "in_cluster",
    "kubeconfig_path",
]

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_DEFAULT_KUBECONFIG = "~/.kube/config"
_INSTALL = "pip install 'piship-remote[kubernetes]'"
_BEARER = "bearer "
# The kubernetes package's own margin: a credential this close to its expiry is renewed.
_EXPIRY_MARGIN = datetime.timedelta(minutes=5)


class ClusterCredentials:
    """The bearer token and client certificate a loaded ``kubernetes`` configuration gives.

    ``read()``, called for each request, lets the loader refresh first (an exec plugin
    past its expiry is re-run, the service-account token file re-read every minute),
    then returns the bearer (or ``None``) and points every bound session at the
    current client certificate. ``renew()``, called on a 401, loads the configuration
    again at once and says whether anything changed.
    """

    def __init__(
        self,
        configuration: Any,
        reload: Callable[[Any], None],
        expiry: Callable[[], datetime.datetime | None] = lambda: None,
    ) -> None:
        self._configuration = configuration
        self._reload = reload
        self._expiry = expiry
        self._lock = threading.Lock()  # the loaders' refresh hooks are not thread-safe
        self._sessions: list[requests.Session] = []

    def bind(self, session: requests.Session) -> requests.Session:
        """Keep ``session.cert`` on the current client certificate; ``session``."""
        with self._lock:
            self._sessions.append(session)
            self._publish()
        return session

    def read(self) -> str | None:
        with self._lock:
            if self._certificate_expired():
                self._reload_quietly()
            value = self._configuration.get_api_key_with_prefix("BearerToken")
            self._publish()
        return _bearer_value(value)

    def renew(self) -> bool:
        with self._lock:
            before = self._identity()
            if not self._reload_quietly():
                return False
            self._publish()
            token = self._configuration.api_key.get("BearerToken")
            return self._identity() != before and (bool(token) or self._pair() is not None)

    def _certificate_expired(self) -> bool:
        """A client certificate from an exec plugin (the loader re-runs a token plugin
        itself, but not a certificate one) whose expiry is within the margin."""
        if self._configuration.refresh_api_key_hook is not None:
            return False
        expiry = self._expiry()
        now = datetime.datetime.now(datetime.timezone.utc)
        return expiry is not None and expiry - _EXPIRY_MARGIN <= now

    def _reload_quietly(self) -> bool:
        try:
            self._reload(self._configuration)
        except Exception:  # the loader's failure: nothing renewed
            return False
        return True

    def _identity(self) -> tuple[object, ...]:
        return self._configuration.api_key.get("BearerToken"), self._pair()

    def _pair(self) -> tuple[str, str] | None:
        cert, key = self._configuration.cert_file, self._configuration.key_file
        return (str(cert), str(key)) if cert and key else None

    def _publish(self) -> None:
        pair = self._pair()
        for session in self._sessions:
            if session.cert != pair:
                session.cert = pair


@attrs.frozen
class ClusterAccess:
    """The API server's address and namespace, its CA, and this client's credentials."""

    endpoint: str
    namespace: str | None
    ca_file: str | None
    proxy: str | None
    credentials: ClusterCredentials

    def session(self) -> requests.Session:
        """A session for the API server only: its CA, the client certificate (kept
        current), its proxy."""
        session = requests.Session()
        if self.ca_file is not None:
            session.verify = self.ca_file
        if self.proxy is not None:
            session.proxies = {"http": self.proxy, "https": self.proxy}
        return self.credentials.bind(session)


def cluster_options(access: ClusterAccess, options: dict[str, Any]) -> dict[str, Any]:
    """The backend's options for ``access``: the API server's endpoint, session and token;
    the router gets ``router_credential`` only (none without it), through ``session`` or
    a plain session, so the cluster's credentials never reach it."""
    for given in ("endpoint", "credential", "credential_rejected", "router_session"):
        if given in options:
            raise TypeError(f"{given} comes from the cluster's configuration")
    credentials = access.credentials
    chosen = dict(options)
    chosen.setdefault("namespace", access.namespace or "default")
    chosen["router_session"] = chosen.pop("session", None) or requests.Session()
    if chosen.get("router_credential") is None:
        chosen["router_credential"] = _no_credential
    chosen.update(
        endpoint=access.endpoint,
        credential=credentials.read,
        credential_rejected=credentials.renew,
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
    try:
        merged = config.kube_config.KubeConfigMerger(where).config
        if merged is None:
            raise config.ConfigException("no configuration found")
        loader = config.kube_config.KubeConfigLoader(config_dict=merged, active_context=context)
        loader.load_and_set(configuration)
        chosen = loader.current_context
    except (config.ConfigException, OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigInvalid(
            f"the kubeconfig {where} cannot be used: {_reason(error)}",
            user_action="Check the file with 'kubectl config view', or pass another "
            "path or context",
        ) from None
    namespace = _mapping(_mapping(chosen).get("context")).get("namespace")
    return _access(
        configuration,
        loader.load_and_set,
        namespace if isinstance(namespace, str) and namespace else None,
        lambda: _expiry(loader),
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
        raise ConfigInvalid(
            f"the pod's service account cannot be used: {_reason(error)}",
            user_action="Run inside a Kubernetes pod with a mounted service-account token, "
            "or use from_kubeconfig",
        ) from None
    return _access(configuration, loader.load_and_set, _read_namespace(service_account))


def _access(
    configuration: Any,
    reload: Callable[[Any], None],
    namespace: str | None,
    expiry: Callable[[], datetime.datetime | None] = lambda: None,
) -> ClusterAccess:
    if configuration.verify_ssl is False:
        raise TlsPolicyViolation(
            "the kubeconfig turns TLS verification off (insecure-skip-tls-verify)",
            user_action="Give the cluster's CA (certificate-authority) instead",
        )
    if getattr(configuration, "tls_server_name", None):
        raise ConfigInvalid(
            "the kubeconfig's tls-server-name is not supported",
            user_action="Point the server at a name its certificate carries",
        )
    token = configuration.api_key.get("BearerToken")
    if isinstance(token, str) and not token.lower().startswith(_BEARER):
        raise ConfigInvalid(
            "the kubeconfig's user authenticates with a username and password, "
            "which Kubernetes no longer accepts",
            user_action="Use a client certificate, a token or an exec plugin",
        )
    host = str(configuration.host or "").rstrip("/")
    if not host:
        raise ConfigInvalid("the kubeconfig's cluster has no server")
    return ClusterAccess(
        endpoint=host,
        namespace=namespace,
        ca_file=configuration.ssl_ca_cert or None,
        proxy=configuration.proxy or None,
        credentials=ClusterCredentials(configuration, reload, expiry),
    )


def _expiry(loader: Any) -> datetime.datetime | None:
    """When the exec plugin's last credential expires (its ``expirationTimestamp``)."""
    expiry = getattr(loader, "expiry", None)
    if not isinstance(expiry, datetime.datetime):
        return None
    return expiry if expiry.tzinfo else expiry.replace(tzinfo=datetime.timezone.utc)


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
        raise ConfigInvalid(
            "reading a kubeconfig or the pod's service account needs the kubernetes package",
            user_action=_INSTALL,
        ) from None
    return kubernetes.config


def _new_configuration() -> Any:
    from kubernetes.client import Configuration  # type: ignore[import-untyped, import-not-found, unused-ignore]

    return Configuration()
