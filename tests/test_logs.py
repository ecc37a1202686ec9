"""Log lines: text or JSON, the request id on every line, uvicorn's access log in the same shape."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.observability import context
from proxy.observability.logs import JsonFormatter, TextFormatter, configure_logging, logging_config
from proxy.settings import Settings, load_settings


def record(name: str = "coherence_guard", msg: str = "hello %s", *args: Any, **extra: Any) -> Any:
    rec = logging.makeLogRecord(
        {"name": name, "msg": msg, "args": args or ("world",), "levelname": "WARNING"}
    )
    rec.levelno = logging.WARNING
    rec.__dict__.update(extra)
    return rec


@pytest.fixture
def request_id() -> Iterator[str]:
    token = context.request_id.set("req-42")
    try:
        yield "req-42"
    finally:
        context.request_id.reset(token)


def test_json_line_has_the_fixed_fields_and_the_extras(request_id: str) -> None:
    line = JsonFormatter().format(record(upstream_status=502, route="/v1/chat/completions"))
    assert "\n" not in line
    data = json.loads(line)
    assert data["level"] == "warning"
    assert data["logger"] == "coherence_guard"
    assert data["message"] == "hello world"
    assert data["request_id"] == request_id
    assert data["upstream_status"] == 502 and data["route"] == "/v1/chat/completions"
    assert data["ts"].endswith("Z") and "T" in data["ts"]


def test_json_line_outside_a_request_has_a_null_request_id() -> None:
    assert json.loads(JsonFormatter().format(record()))["request_id"] is None


def test_json_line_survives_values_json_cannot_encode_and_keeps_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        rec = record(thing=object())
        rec.exc_info = sys.exc_info()
    data = json.loads(JsonFormatter().format(rec))
    assert data["thing"].startswith("<object object")
    assert "ValueError: boom" in data["exc_info"]


def test_text_line_names_the_request_and_the_extras(request_id: str) -> None:
    line = TextFormatter().format(record(upstream_status=502))
    assert " WARNING coherence_guard: hello world " in line
    assert f"[request_id={request_id}]" in line
    assert line.endswith("upstream_status=502")


def test_uvicorns_access_record_becomes_fields(request_id: str) -> None:
    rec = record(
        "uvicorn.access",
        '%s - "%s %s HTTP/%s" %d',
        "127.0.0.1:5000",
        "POST",
        "/v1/chat/completions",
        "1.1",
        200,
    )
    data = json.loads(JsonFormatter().format(rec))
    assert data["message"] == '127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200'
    assert (data["method"], data["path"], data["status"]) == ("POST", "/v1/chat/completions", 200)
    assert data["request_id"] == request_id
    text = TextFormatter().format(rec)
    assert text.count("POST") == 1  # the parts are not repeated after the message
    assert f"[request_id={request_id}]" in text


def test_uvicorns_colour_copy_is_not_output() -> None:
    rec = record("uvicorn.error", "Started server process [%d]", 7, color_message="\x1b[1m")
    data = json.loads(JsonFormatter().format(rec))
    assert "color_message" not in data
    assert data["logger"] == "uvicorn"  # not "uvicorn.error" on an info line


def _settings(**values: Any) -> Settings:
    return load_settings(**values)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """dictConfig changes process-wide loggers: put back what pytest and other tests use."""
    names = ["", "coherence_guard", "proxy", "uvicorn", "uvicorn.error", "uvicorn.access"]
    saved = {
        n: (
            logging.getLogger(n).handlers[:],
            logging.getLogger(n).level,
            logging.getLogger(n).propagate,
        )
        for n in names
    }
    yield
    for n, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(n)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def test_configure_logging_routes_every_logger_through_one_format(
    restore_logging: None, monkeypatch: pytest.MonkeyPatch, request_id: str
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure_logging(_settings(log_format="json", log_level="info", access_log=True))
    logging.getLogger("coherence_guard").info("verdict", extra={"signal": "repetition"})
    logging.getLogger("proxy.server.engine_watch").warning("engine down")
    logging.getLogger("uvicorn.error").info("Started")
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "c", "GET", "/", "1.1", 200)
    logging.getLogger("httpx").info("HTTP Request: GET http://engine/health")  # below WARNING
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [x["logger"] for x in lines] == [
        "coherence_guard",
        "proxy.server.engine_watch",
        "uvicorn",
        "uvicorn.access",
    ]
    assert all(x["request_id"] == request_id for x in lines)
    assert lines[0]["signal"] == "repetition"


def test_access_log_off_and_level(restore_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    configure_logging(_settings(log_level="warning", access_log=False))
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "c", "GET", "/", "1.1", 200)
    logging.getLogger("coherence_guard").info("not at warning")
    logging.getLogger("coherence_guard").warning("at warning")
    out = stream.getvalue()
    assert "GET" not in out and "not at warning" not in out
    assert "WARNING coherence_guard: at warning" in out


def test_logging_config_is_plain_data_uvicorn_can_hand_to_workers() -> None:
    """uvicorn pickles its Config (with log_config) into each spawned worker."""
    import pickle

    config = logging_config(_settings(log_format="json", access_log=True, log_level="error"))
    assert pickle.loads(pickle.dumps(config)) == config
    assert config["loggers"]["uvicorn.access"] == {
        "handlers": ["guard"],
        "level": "INFO",  # asked for: written whatever GUARD_LOG_LEVEL says
        "propagate": False,
    }
