"""Log lines an operator can use: one format for the proxy's, uvicorn's and the access log.

``GUARD_LOG_FORMAT=text`` (default) writes ``TIME LEVEL LOGGER: message [request_id=…] k=v``;
``json`` writes one JSON object per line with ``ts``, ``level``, ``logger``, ``message``,
``request_id`` and any ``extra=`` fields, for log shippers that would otherwise have to parse
the text. The request id comes from :data:`proxy.observability.context.request_id`, which the
request-id middleware sets for the task serving a request, so every line written while serving it
(the guard's verdict, an upstream error, the access line) names it without being passed around.

Configuration is one :func:`logging.config.dictConfig` dictionary, :func:`logging_config`:
``serve`` hands it to uvicorn as ``log_config``, which applies it in every worker process
(including the ones ``--workers N`` spawns), and :func:`configure_logging` applies it in the
current process. ``GUARD_ACCESS_LOG`` switches uvicorn's access log on and formats it the same
way. Third-party loggers (httpx writes a line per request at INFO) stay at WARNING.

Nothing here adds request or response content to a line: what is logged is what the callers
pass, and they never pass prompt or completion text unless ``GUARD_LOG_TEXT`` says so.
"""

from __future__ import annotations

import logging
import logging.config
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from proxy.observability import context

if TYPE_CHECKING:
    from proxy.settings import Settings

#: The proxy's loggers: ``coherence_guard`` (the app) and ``proxy.*`` (modules using __name__).
PROXY_LOGGERS = ("coherence_guard", "proxy")

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
# uvicorn passes a colourised copy of some messages for its own formatter; never output it.
_HIDDEN = frozenset({"color_message", "request_id"})
# The positional args of uvicorn's access record: client, method, path, HTTP version, status.
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")
ACCESS_LOGGER = "uvicorn.access"


def _logger_name(record: logging.LogRecord) -> str:
    # uvicorn writes its server messages ("Started server process") to "uvicorn.error";
    # "error" on an INFO line misleads whoever reads it.
    return "uvicorn" if record.name == "uvicorn.error" else record.name


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _request_id(record: logging.LogRecord) -> str | None:
    rid = getattr(record, "request_id", None)
    return rid if isinstance(rid, str) else context.request_id.get()


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra=`` fields of a record; for uvicorn's access line, its named parts."""
    fields = {
        key: value
        for key, value in record.__dict__.items()
        if key not in _STANDARD and key not in _HIDDEN and not key.startswith("_")
    }
    if (
        record.name == ACCESS_LOGGER
        and isinstance(record.args, tuple)
        and len(record.args) == len(_ACCESS_FIELDS)
    ):
        fields.update(zip(_ACCESS_FIELDS, record.args, strict=True))
    return fields


class TextFormatter(logging.Formatter):
    """``2026-11-25T02:50:01.123Z INFO coherence_guard: message [request_id=…] key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            _timestamp(record),
            record.levelname,
            f"{_logger_name(record)}: {record.getMessage()}",
        ]
        rid = _request_id(record)
        if rid is not None:
            parts.append(f"[request_id={rid}]")
        if record.name != ACCESS_LOGGER:  # the access line's parts are its message already
            parts += [f"{k}={v}" for k, v in record_fields(record).items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, request_id, then the extras."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": _logger_name(record),
            "message": record.getMessage(),
            "request_id": _request_id(record),
        }
        for key, value in record_fields(record).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return orjson.dumps(line, default=str).decode()


def logging_config(settings: Settings) -> dict[str, Any]:
    """The :func:`logging.config.dictConfig` dictionary for ``settings`` (uvicorn's
    ``log_config``): level, text or JSON, access log on or off."""
    level = settings.log_level.upper()
    formatter = JsonFormatter if settings.log_format == "json" else TextFormatter
    handler = ["guard"]
    loggers: dict[str, Any] = {
        name: {"handlers": handler, "level": level, "propagate": False} for name in PROXY_LOGGERS
    }
    loggers["uvicorn"] = {"handlers": handler, "level": level, "propagate": False}
    loggers["uvicorn.error"] = {"level": level}  # propagates to "uvicorn"
    loggers[ACCESS_LOGGER] = {
        "handlers": handler if settings.access_log else [],
        "level": "INFO" if settings.access_log else "CRITICAL",
        "propagate": False,
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"guard": {"()": f"{__name__}.{formatter.__name__}"}},
        "handlers": {
            "guard": {
                "class": "logging.StreamHandler",
                "formatter": "guard",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": loggers,
        # Libraries (httpx logs every request at INFO) speak up only for problems.
        "root": {"handlers": handler, "level": max(logging.WARNING, logging.getLevelName(level))},
    }


def configure_logging(settings: Settings) -> None:
    """Apply :func:`logging_config` to this process (idempotent: handlers are replaced)."""
    logging.config.dictConfig(logging_config(settings))
