# Coherence Guard proxy image.
#
#   docker build -t coherence-guard .                      # official slim Python base
#   docker build --build-arg BASE_IMAGE=my/base:tag .      # any Debian-like base with python3 >= 3.11
#                                                          # and its venv module (python3-venv)
# The same steps work on both: a virtual environment in /opt/venv is built in a first stage and
# copied onto a fresh copy of the base, so build tools and pip caches stay out of the image.
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/venv
WORKDIR /src
# Dependencies first (they change less often than the code): a throwaway install of the
# declared dependencies, with a placeholder package and README, gets its own cached layer.
# The otel extra: traces, off until OTEL_EXPORTER_OTLP_ENDPOINT is set (docs/observability.md).
COPY pyproject.toml ./
RUN mkdir proxy && touch proxy/__init__.py README.md \
    && /opt/venv/bin/pip install '.[otel]' \
    && /opt/venv/bin/pip uninstall -y coherence-guard
COPY README.md ./
COPY proxy ./proxy
RUN /opt/venv/bin/pip install --no-deps . \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="coherence-guard" \
      org.opencontainers.image.description="Streaming sidecar proxy that aborts degenerate LLM generations at the engine" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    GUARD_HOST=0.0.0.0 \
    GUARD_PORT=8080
# Numeric non-root user: needs no useradd in the base and satisfies runAsNonRoot checks.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('GUARD_PORT', '8080'), timeout=4)"]
# uvicorn with uvloop and httptools (coherence-guard serve picks them); settings come from
# GUARD_* variables (see .env.example).
ENTRYPOINT ["coherence-guard"]
CMD ["serve"]
