"""The proxy with a detector that does nothing: what ``enforce`` costs without the detector.

A benchmark target for the kit's ``run.py`` (``--proxy 'parse=... python
bench/measure/relay/serve_null_detector.py --port {port}'``), never a mode of the product. Every
request gets the real relay, the real stream guard (SSE split, parsing, usage stripping,
bookkeeping, metrics) and the detector of ``bench/measure/relay/null_detector.py``, which keeps no
text and never judges. The gap between this target and ``enforce`` is the detector's share of the
relay's CPU; the gap between it and nginx is what no change to the detector's schedule can remove.

    GUARD_MODE=enforce GUARD_UPSTREAM_URL=http://127.0.0.1:8000 \\
        python bench/measure/relay/serve_null_detector.py --host 127.0.0.1 --port 8080
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import proxy.core.channels  # noqa: E402
import proxy.server.detectors  # noqa: E402
from bench.measure.relay.null_detector import NullDetector  # noqa: E402
from proxy import cli  # noqa: E402


def main() -> int:
    proxy.server.detectors.Detector = NullDetector  # type: ignore[attr-defined,misc]
    proxy.core.channels.Detector = NullDetector  # type: ignore[attr-defined,misc]
    return cli.main(["serve", *sys.argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
