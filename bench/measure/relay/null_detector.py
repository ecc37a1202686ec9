"""A detector that keeps no text and never fires: the relay's cost without detection.

One definition for the benchmarks that split the guard's cost from the detector's
(``bench_guard_events.py``'s ``parse`` variant, ``bench_surfaces.py``, and the relay target
``serve_null_detector.py``). It counts the deltas it is fed, so the stream's summary still has a
token count."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from proxy.detect import Detector, Summary  # noqa: E402


class NullDetector(Detector):
    """Counts what it is fed and never fires."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:  # the real set-up is skipped
        self._n = 0

    def feed(self, text: str, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self._n += 1

    @property
    def end_drift(self) -> bool:
        return False

    @end_drift.setter
    def end_drift(self, value: bool) -> None:
        pass

    def finish(self, *, end_drift: bool | None = None) -> Summary:
        return Summary(0, self._n, None, None, None, None)
