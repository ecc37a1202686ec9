"""Path normalisation and the route table (pure: no I/O, no ASGI).

Why the proxy normalises before it routes: the engine behind it (vLLM: Starlette) matches its
routes on the *percent-decoded* path and answers a trailing-slash spelling with a redirect to the
route. A proxy that matched the raw spelling exactly would send ``/v1/chat/completions/``,
``//v1/chat/completions`` or ``/v1%2Fchat%2Fcompletions`` to pass-through — unguarded, without the
``max_tokens`` default — while the engine still generates. So every request path is reduced to
one canonical spelling first, the route is chosen on that, and that spelling is what the engine
receives: what is guarded and what the engine runs are then the same route by construction.

Canonical form: percent-decoded once (``%2F``/``%2f`` become ``/``, as in the engine's own
routing), empty segments dropped (``//``), ``.`` segments dropped, ``..`` removing the segment
before it, no trailing slash (``/`` itself excepted). A path that climbs above the root, is not
UTF-8 after decoding, or holds a NUL is refused (:class:`PathError`, a 400).
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote, unquote_to_bytes, urlsplit

from proxy.core.records import Endpoint
from proxy.errors import ErrorFormat

#: Guarded routes (``POST``): the canonical path and the request surface it speaks.
GUARDED: Final[dict[str, Endpoint]] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}

#: The proxy's own routes (served by FastAPI, never relayed).
OWN_ROUTES: Final = frozenset({"/health", "/ready", "/metrics", "/metrics/quality"})
#: Own routes that GUARD_PROTECT_METRICS puts behind a key.
METRICS_ROUTES: Final = frozenset({"/metrics", "/metrics/quality"})
#: The engine's exposition, relayed (vLLM answers every path under ``/metrics``): the third
#: scrape of the Kubernetes PodMonitor, the engine being on loopback. A scraper's key
#: (GUARD_METRICS_API_KEYS) opens it like the proxy's own metrics, so one key reads all three.
ENGINE_METRICS_ROUTE: Final = "/metrics/engine"

#: Engine routes that generate text but are not guarded (vLLM 0.32's routers, checked in
#: ``vllm/entrypoints/**/api_router.py``). GUARD_UNGUARDED_ROUTES decides: ``pass`` relays them
#: (warning once at start-up), ``reject`` answers 403. Routes that only render, tokenize, count
#: or score (``…/render``, ``…/derender``, ``/tokenize``, ``/v1/messages/count_tokens``,
#: ``/pooling``, ``/score``, ``/rerank``, ``/v1/embeddings``, ``/generative_scoring``) are not
#: listed: they start no generation.
UNGUARDED_GENERATING: Final[dict[str, str]] = {
    "/v1/chat/completions/batch": "several chat completions in one request",
    "/v1/audio/transcriptions": "speech to text (Whisper-style loops)",
    "/v1/audio/translations": "speech to English text",
    "/inference/v1/generate": "token-in/token-out generation",
    "/invocations": "SageMaker entry point: dispatches to chat/completions by body",
    "/cohere/v2/chat": "Cohere v2 chat API",
    "/v1/systemone": "structured decisions (constrained generation)",
}

#: Routes whose clients are Anthropic SDKs: the Messages route and the engine routes under it
#: (``/v1/messages/count_tokens``, relayed) get the proxy's errors in Anthropic's envelope.
ANTHROPIC_ROUTE: Final = "/v1/messages"

#: Characters left unescaped when the canonical path is written on the wire again (RFC 3986
#: ``pchar`` minus nothing the engine's router could read as a separator after decoding).
_SAFE: Final = "/:@!$&'()*+,;=-._~"


class PathError(ValueError):
    """The request path cannot be normalised (climbs above the root, or is not text)."""


def canonical_path(raw: bytes) -> str:
    """The canonical spelling of a request path (``raw_path`` as received, no query).

    The fast path — a plain path with nothing to decode or remove — costs one scan."""
    if (
        b"%" not in raw
        and b"//" not in raw
        and b"/." not in raw
        and (raw == b"/" or not raw.endswith(b"/"))
        and raw.startswith(b"/")
    ):
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            pass
    try:
        text = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise PathError("The request path is not valid UTF-8.") from None
    if "\x00" in text:
        raise PathError("The request path holds a NUL character.")
    out: list[str] = []
    for segment in text.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not out:
                raise PathError("The request path climbs above the root.")
            out.pop()
            continue
        out.append(segment)
    return "/" + "/".join(out)


def error_format(path: str) -> ErrorFormat:
    """The error envelope the clients of ``path`` (canonical) read: see :mod:`proxy.errors`."""
    if path.startswith(ANTHROPIC_ROUTE) and (
        len(path) == len(ANTHROPIC_ROUTE) or path[len(ANTHROPIC_ROUTE)] == "/"
    ):
        return "anthropic"
    return "openai"


def wire_path(path: str) -> str:
    """A canonical path as it goes on the wire: percent-encoded again where it must be (a
    decoded ``%3F`` must not become a query), ``quote``'s own fast path when nothing is."""
    return quote(path, safe=_SAFE)


#: Names of this host's loopback interface: an engine configured as one of them may name
#: itself by another in a ``Location`` (uvicorn answers with the ``Host`` it was asked for).
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "[::1]", "localhost."})


def _origin(netloc: str, scheme: str) -> tuple[str, int]:
    host, _, port = netloc.rsplit("@", 1)[-1].lower().rpartition(":")
    if not host or "]" in port:  # no port, or an IPv6 literal without one
        host, port = netloc.rsplit("@", 1)[-1].lower(), ""
    if host in _LOOPBACK:
        host = "localhost"
    if not port:
        return host, 443 if scheme == "https" else 80
    return host, int(port) if port.isdigit() else -1


def relative_location(value: bytes, engine_url: str) -> bytes:
    """A ``Location``/``Content-Location`` from the engine as the client may see it.

    An absolute URL that names the engine (its host and port, the ``Host`` the proxy sent) would
    tell the client the engine's address and send its next request around the guard: it
    becomes the relative path (and query) on the proxy. Anything else is returned unchanged.
    """
    if not (value[:7].lower() == b"http://" or value[:8].lower() == b"https://"):
        if value.startswith(b"//"):  # scheme-relative: //host/path
            return relative_location(b"http:" + value, engine_url)
        return value
    try:
        parts = urlsplit(value.decode("latin-1"))
    except ValueError:
        return b"/"
    engine = urlsplit(engine_url)
    if _origin(parts.netloc, parts.scheme) != _origin(engine.netloc, engine.scheme or "http"):
        return value
    rel = parts.path or "/"
    if parts.query:
        rel += "?" + parts.query
    return rel.encode("latin-1")
