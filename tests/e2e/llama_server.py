"""Run llama.cpp's OpenAI-compatible server (embedded in the ``xllamacpp`` wheel) on a GGUF file.

The wheel ships llama-server compiled in, but no command-line entry point: this is one, taking the
few llama-server flags the end-to-end tests need. It runs under the llama.cpp venv that
``scripts/prepare-e2e.sh`` builds (not the project's environment), from the repository root:

    python -m tests.e2e.llama_server --model FILE.gguf --port 8081
"""

from __future__ import annotations

import argparse
import signal
import threading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--alias", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--ctx-size", type=int, default=4096)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import xllamacpp  # only in the llama.cpp venv

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    if args.alias:
        params.model_alias = {args.alias}
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.endpoint_metrics = True
    params.use_jinja = True
    params.warmup = False

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = xllamacpp.Server(params)
    print(f"llama-server listening on {server.listening_address}", flush=True)
    stop.wait()
    del server


if __name__ == "__main__":
    main()
