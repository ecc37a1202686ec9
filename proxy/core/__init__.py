"""The per-request logic of the proxy, pure: no sockets, no asyncio, no metrics.

Bytes and dicts in, bytes and dicts out, so every piece is tested without a server:

* :mod:`~proxy.core.sse`: the incremental SSE parser (events keep their raw bytes);
* :mod:`~proxy.core.chunks`: what the guard reads out of a chat/completions chunk, and the
  chunks it writes itself;
* :mod:`~proxy.core.guard`: one request's relay state (:class:`StreamGuard`): upstream bytes in,
  the bytes the client gets out, a verdict ending the stream;
* :mod:`~proxy.core.surfaces`: what differs per API (Responses, Messages, heal through the chat
  route);
* :mod:`~proxy.core.reassemble`: the non-streamed answer rebuilt from the stream;
* :mod:`~proxy.core.rewrite`: the request the engine gets (limits, language, sampling);
* :mod:`~proxy.core.heal`: cutting a loop back and building the continuation request;
* :mod:`~proxy.core.records`: what one generation leaves for the metrics.

The I/O shell (:mod:`proxy.server`) drives these; nothing here imports it
(``tests/test_layers.py``).
"""
