"""TLS and plain HTTP on one port: each connection's first byte says which it speaks.

A TLS connection opens with a handshake record (first byte ``0x16``); an HTTP/1.1
request opens with a method's letter. :func:`sniffed` peeks at that byte without
consuming it. A plain connection is returned as it is; a TLS one is handshaken here and
then carried by a :class:`TlsRelay`: the server handles the plain end of a socket
pair, and two ``<name>-in``/``<name>-out`` threads decrypt what the client sends onto it
and encrypt what the server writes there::

    served = sniffed(connection, context, timeout=120, handshake_timeout=10, name="p-tls-3")
    if served is None:                      # the handshake failed or timed out
        ...
    plain = served.plain                    # serve HTTP on this socket
    ...
    served.close()                          # after the server closed plain: joins the relay

The TLS state is a memory-BIO :class:`ssl.SSLObject` touched only under one lock, so
the two directions never use it at once (an OpenSSL connection is not safe for two
threads), and bytes leave for the client in the order it produced them.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
import time

import attrs

__all__ = ["HANDSHAKE_RECORD", "PlainConnection", "TlsRelay", "sniffed"]

HANDSHAKE_RECORD = 0x16
"""A TLS record's content type for a handshake: the first byte of every ClientHello."""
PIECE = 64 * 1024
DRAIN_SECONDS = 30.0
"""How long a closing relay goes on sending what the server wrote to a client not reading."""


@attrs.frozen
class PlainConnection:
    """A connection that speaks HTTP as it is (no TLS)."""

    plain: socket.socket

    def close(self, *, drain: float | None = None) -> None:
        """Nothing to stop: the server closes the connection itself."""


def sniffed(
    connection: socket.socket,
    context: ssl.SSLContext,
    *,
    timeout: float | None,
    handshake_timeout: float | None,
    name: str,
) -> PlainConnection | TlsRelay | None:
    """``connection`` as plain HTTP, or its TLS relay once handshaken; ``None`` when the
    handshake failed or took more than ``handshake_timeout`` seconds (the connection is
    then closed). One that sends nothing within ``timeout`` is handed on as plain HTTP,
    for the server to end as idle."""
    connection.settimeout(timeout)
    try:
        first = connection.recv(1, socket.MSG_PEEK)
    except OSError:
        first = b""
    if not first or first[0] != HANDSHAKE_RECORD:
        return PlainConnection(connection)
    relay = TlsRelay(connection, context, name)
    if not relay.handshake(handshake_timeout):
        relay.close()
        return None
    relay.start()
    return relay


class TlsRelay:
    """One client's TLS session, relayed to and from the plain end of a socket pair."""

    def __init__(self, raw: socket.socket, context: ssl.SSLContext, name: str) -> None:
        self._raw = raw
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._tls_lock = threading.Lock()
        self._send_lock = threading.Lock()  # taken before _tls_lock, never after
        self.plain, self._inner = socket.socketpair()
        self._reset = False
        self._threads = [
            threading.Thread(target=self._decrypting, name=f"{name}-in", daemon=True),
            threading.Thread(target=self._encrypting, name=f"{name}-out", daemon=True),
        ]

    def handshake(self, timeout: float | None) -> bool:
        """Complete the server's handshake within ``timeout``; False when it failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                with self._tls_lock:
                    self._tls.do_handshake()
                self._flush()
                return True
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLError, OSError):
                self._flush_quietly()  # the alert tells the client why
                return False
            try:
                self._flush()
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._raw.settimeout(left)
                data = self._raw.recv(PIECE)
            except OSError:
                return False
            if not data:
                return False
            with self._tls_lock:
                self._incoming.write(data)

    def start(self) -> None:
        self._raw.settimeout(None)
        for thread in self._threads:
            thread.start()

    def reset(self) -> None:
        """End the client's connection with a TCP reset, not TLS's close_notify, once what
        the server wrote before is sent: how a connection whose upstream vanished ends
        (call before the server closes its end)."""
        self._reset = True
        with contextlib.suppress(OSError):
            self._raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def _stop_raw(self) -> None:
        """Shut the client's connection down: both ways, or, for a reset, only its reading
        (a FIN would come before the reset that its close sends)."""
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RD if self._reset else socket.SHUT_RDWR)

    def close(self, *, drain: float | None = DRAIN_SECONDS) -> None:
        """End the relay once the server has closed its end: what the server wrote is sent
        on for at most ``drain`` seconds (0: cut at once), then the relay's threads are
        joined and every socket it holds is closed."""
        with contextlib.suppress(OSError):
            self.plain.shutdown(socket.SHUT_RDWR)
        outward = self._threads[1]
        if outward.ident is not None and drain:
            outward.join(drain)
        self._stop_raw()
        for thread in self._threads:
            if thread.ident is not None:
                thread.join()
        for end in (self.plain, self._inner, self._raw):
            end.close()

    def _decrypting(self) -> None:
        """Client → server: decrypt what arrives until the client ends its side."""
        try:
            while True:
                text, ended = self._decrypt()
                if text:
                    self._inner.sendall(text)
                if ended:
                    break
                data = self._raw.recv(PIECE)
                if not data:
                    break
                with self._tls_lock:
                    self._incoming.write(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self._inner.shutdown(socket.SHUT_WR)  # the server reads the end of the request

    def _decrypt(self) -> tuple[bytes, bool]:
        """What the incoming bytes decrypt to, and whether the client closed its TLS side."""
        pieces: list[bytes] = []
        ended = False
        with self._tls_lock:
            while True:
                try:
                    piece = self._tls.read(PIECE)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLError:  # close_notify, a truncated or corrupt record
                    ended = True
                    break
                if not piece:
                    ended = True
                    break
                pieces.append(piece)
        self._flush()  # what reading produced (a key update's answer)
        return b"".join(pieces), ended

    def _encrypting(self) -> None:
        """Server → client: encrypt what the server writes until it closes its end."""
        try:
            while data := self._inner.recv(PIECE):
                with self._send_lock:
                    with self._tls_lock:
                        self._tls.write(data)
                        out = self._outgoing.read()
                    self._raw.sendall(out)
            if not self._reset:
                with self._tls_lock, contextlib.suppress(ssl.SSLError):
                    self._tls.unwrap()  # close_notify
                self._flush()
        except (OSError, ssl.SSLError):
            pass
        finally:
            self._stop_raw()  # ends the decrypting side's wait

    def _flush(self) -> None:
        """Send what the TLS state has produced for the client, in order."""
        with self._send_lock:
            with self._tls_lock:
                out = self._outgoing.read()
            if out:
                self._raw.sendall(out)

    def _flush_quietly(self) -> None:
        with contextlib.suppress(OSError):
            self._flush()
