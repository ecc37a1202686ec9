"""The I/O shell: the ASGI app, its middleware and routes, and the upstream client.

Everything here does I/O and stays thin: it reads the client's request, asks
:mod:`proxy.core` what to send and what to relay, and moves bytes between the client and the
engine. Guarded routes are :mod:`~proxy.server.guarded`, the rest
:mod:`~proxy.server.passthrough`; :mod:`~proxy.server.upstream_http` is the guarded routes' own
HTTP/1.1 client and :mod:`~proxy.server.upstream` the one upstream configuration.
"""
