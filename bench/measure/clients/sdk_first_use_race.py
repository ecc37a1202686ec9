"""The openai SDK's first use from many threads at once, without the proxy (docs/testing.md).

Each of ``--threads`` threads reads a recorded Responses stream (the engine's loop, or the
guard's abort of it) with ``client.responses.stream()`` over an in-process transport, all
starting together, in this fresh process. The SDK builds its pydantic types on first use, and
that build is not thread-safe: now and then a thread raises from inside the stream helper. With
``--warm`` the streams are read once on the main thread first, as ``tests/sdk_warmup.py`` does
before the tests that run clients side by side. Prints how many threads raised, and what. Run it
several times: one process either hits the race or not.

    for i in $(seq 20); do python bench/measure/clients/sdk_first_use_race.py; done | sort | uniq -c
    for i in $(seq 20); do python bench/measure/clients/sdk_first_use_race.py --warm; done \\
        | sort | uniq -c
"""

from __future__ import annotations

import argparse
import sys
import threading

from tests.sdk_warmup import (
    openai_client,
    recorded_streams,
    stream_client,
    warm_sdk_stream_types,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--warm", action="store_true", help="read the streams once first")
    args = parser.parse_args()
    sys.setswitchinterval(1e-5)  # switch threads often, as threads blocked on sockets do
    bodies = recorded_streams("responses")
    if args.warm:
        warm_sdk_stream_types()
    start = threading.Barrier(args.threads)
    raised: list[str] = []

    def read(n: int) -> None:
        with stream_client(bodies[n % len(bodies)]) as http:
            client = openai_client(http)
            start.wait()
            try:
                with client.responses.stream(model="m", input="hi") as stream:
                    for _ in stream:
                        pass
                    stream.get_final_response()
            except Exception as exc:  # what the SDK raised is the result
                raised.append(type(exc).__name__)

    threads = [threading.Thread(target=read, args=(n,)) for n in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(
        f"{'warm' if args.warm else 'cold'}: {len(raised)} of {args.threads} raised",
        sorted(set(raised)),
    )


if __name__ == "__main__":
    main()
