"""prometheus-client's multiprocess mode for ``--workers N > 1``: one set of counts for every
worker, still split into the two registries.

Each worker is its own process and would expose only its own counts; with
``PROMETHEUS_MULTIPROC_DIR`` (set up by :func:`prepare_multiprocess` before the workers start)
values live in shared mmap files merged at scrape time. Both registries are rendered from the
same files, filtered by family name (:class:`MultiProcessFamilies`), so the quality/infrastructure
split holds there too.
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any, Final

from prometheus_client import CollectorRegistry, values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"


def family_names(registry: CollectorRegistry) -> frozenset[str]:
    return frozenset(family.name for family in registry.collect())


class MultiProcessFamilies(Collector):
    """Merges the workers' mmap files and yields only the families of one registry."""

    def __init__(self, path: str, names: frozenset[str]) -> None:
        self._path = path
        self._names = names

    def collect(self) -> Iterator[Any]:
        files = glob.glob(os.path.join(self._path, "*.db"))
        merged: Iterable[Any] = MultiProcessCollector.merge(  # type: ignore[no-untyped-call]
            files, accumulate=True
        )
        for family in merged:
            if family.name in self._names:
                yield family


def multiprocess_enabled() -> bool:
    """True when prometheus-client chose mmap-backed values (env set before it was imported)."""
    return bool(getattr(values.ValueClass, "_multiprocess", False)) and bool(
        os.environ.get(MULTIPROC_ENV)
    )


def prepare_multiprocess(workers: int) -> str | None:
    """Call in the parent before the server starts its worker process(es).

    With ``PROMETHEUS_MULTIPROC_DIR`` set by the operator, its stale ``*.db`` files are removed
    whatever the number of workers: prometheus-client reads every file in the directory, so a
    previous process's files (a container restarted on the same Kubernetes ``emptyDir``) would
    add its counts to this run's and keep its gauges — streams "in flight" that died with it.
    Unset, ``workers`` > 1 gets a fresh temporary directory (workers inherit the environment and
    pick mmap values when they import prometheus-client) and one worker needs none. Returns the
    directory in use, or ``None`` when there is none.
    """
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        os.makedirs(path, exist_ok=True)
        for stale in glob.glob(os.path.join(path, "*.db")):
            os.remove(stale)
    elif workers > 1:
        path = tempfile.mkdtemp(prefix="coherence-guard-metrics-")
        os.environ[MULTIPROC_ENV] = path
    else:
        return None
    return path
