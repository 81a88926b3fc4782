"""A small threaded HTTP/1.1 server (standard library only) under the local service and the doubles.

:class:`~piship_remote._http_server.server.HttpServer` reads each request into a
:class:`~piship_remote._http_server.messages.Request`, hands it to a handler and writes its
:class:`~piship_remote._http_server.messages.Reply` (a body, or chunks as they come); it
records what arrived in order. Neither the embedded service (:mod:`piship_remote.local`)
nor the test doubles (:mod:`piship_remote.testing`) owns it, so neither imports the other.
"""
