"""What operators see: metrics and logs.

:mod:`~proxy.observability.metrics` (the two Prometheus registries),
:mod:`~proxy.observability.logs` (one log format for every worker),
:mod:`~proxy.observability.context` (the request id of log lines). The engine watcher that
feeds the infrastructure metrics does I/O and lives in :mod:`proxy.server.engine_watch`.
"""
