"""The degeneration detector: a pure, incremental library (no I/O, no asyncio, no metrics).

One :class:`Detector` watches one choice of one generation. The proxy feeds it text deltas as
they stream and acts on the first :class:`Verdict` it returns; :meth:`Detector.finish` gives the
per-choice :class:`Summary` that the metrics layer records once per stream end.
"""

from proxy.detect.detector import Detector
from proxy.detect.types import SIGNALS, DetectorConfig, Summary, Verdict

__all__ = ["SIGNALS", "Detector", "DetectorConfig", "Summary", "Verdict"]
