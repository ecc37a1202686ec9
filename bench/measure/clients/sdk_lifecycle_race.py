"""openai's loose event building under threads: the SDK side of "Lifecycle response identity
changed." (docs/aborts.md).

The SDK validates each stream event strictly against its types. It builds an event that fails
validation loosely, through a discriminator map (event type to class) that it computes on first
use without a lock. This script takes a real ending of the proxy (the guard's abort of a recorded
vLLM loop), removes ``usage.input_tokens_details.cache_write_tokens`` as the proxy's endings
lacked it before, and builds it loosely ``--rounds`` times in each of ``--threads`` threads at once,
in this fresh process. It prints how many were built as some other class than
``ResponseCompletedEvent`` or with their response left a dict (whose id the stream helper reads
as None). With the field in place the event validates and the loose path is never taken.

    python bench/measure/clients/sdk_lifecycle_race.py --threads 1
    python bench/measure/clients/sdk_lifecycle_race.py --threads 2
"""

from __future__ import annotations

import argparse
import copy
import threading
from pathlib import Path
from typing import Any

import orjson
from openai._models import construct_type
from openai.types.responses import ResponseStreamEvent

from proxy.core.guard import GuardPolicy, StreamGuard
from proxy.detect import Detector

ROOT = Path(__file__).resolve().parents[3]
LOOP = ROOT / "tests" / "streams" / "surfaces" / "responses_vllm_loop.sse"


def old_ending() -> dict[str, Any]:
    """The guard's ``response.completed`` for a recorded loop, without ``cache_write_tokens``."""
    guard = StreamGuard(GuardPolicy.create(endpoint="responses"), Detector)
    raw = guard.feed(LOOP.read_bytes())
    event: dict[str, Any] = orjson.loads(raw.rsplit(b"\n\n", 2)[-2].partition(b"\ndata: ")[2])
    assert event["type"] == "response.completed"
    usage = event["response"]["usage"]
    if usage is None:
        # Without an engine to count the prompt the ending leaves usage out (null); the old
        # endings carried one, and the failing field is in it (its counts do not matter here).
        usage = event["response"]["usage"] = {
            "input_tokens": 18,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 100,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 118,
        }
    del usage["input_tokens_details"]["cache_write_tokens"]
    return event


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    event = old_ending()
    start = threading.Barrier(args.threads)
    wrong: list[str] = []

    def build() -> None:
        start.wait()
        for _ in range(args.rounds):
            built: Any = construct_type(type_=ResponseStreamEvent, value=copy.deepcopy(event))
            response = getattr(built, "response", None)
            if type(built).__name__ != "ResponseCompletedEvent" or isinstance(response, dict):
                wrong.append(f"{type(built).__name__} (response: {type(response).__name__})")

    threads = [threading.Thread(target=build) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = args.threads * args.rounds
    print(f"{len(wrong)} of {total} built wrong", sorted(set(wrong)))


if __name__ == "__main__":
    main()
