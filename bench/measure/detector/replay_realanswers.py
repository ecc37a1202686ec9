"""Replay real answers of real models through a running proxy, with their real prompts.

Each row of ``../shared/realanswers/alpacaeval-dev.jsonl`` (``id``, ``prompt``, ``answer``,
``model``) becomes one streamed chat request: the prompt as the user turn, the answer streamed
back by the fake engine (``tests/fakes/vllm.py``, word-sized deltas as an engine streams them)
through the proxy under uvicorn with default settings (or the ``GUARD_*`` variables of the
environment). What the client received is written per row: where the answer was cut (the
characters it got), the finish reason, the guard's signal, and the ``x-guard-language`` header::

    python bench/measure/detector/replay_realanswers.py --half tune -o tune.jsonl
    python bench/measure/detector/replay_realanswers.py --half held -o held.jsonl
    python bench/measure/detector/replay_realanswers.py --ids ID [ID ...]   # a few rows, printed

``--half`` takes the split of ``bench/data/realanswers_split.json`` (by model, fixed before
any rule changed). ``MEASURE_PROXY_ROOT`` runs another checkout's proxy on the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, os.environ.get("MEASURE_PROXY_ROOT", str(ROOT)))

import httpx  # noqa: E402

from proxy.server.app import create_app  # noqa: E402
from proxy.settings import load_settings  # noqa: E402
from tests.conftest import ProxyServer  # noqa: E402
from tests.fakes.vllm import FakeVLLM, Script  # noqa: E402

DATA = ROOT.parent / "shared" / "realanswers" / "alpacaeval-dev.jsonl"
SPLIT = ROOT / "bench" / "data" / "realanswers_split.json"


def rows_of(path: Path, half: str, ids: list[str] | None) -> list[dict[str, Any]]:
    split = json.loads(SPLIT.read_text(encoding="utf-8"))
    models = None if half == "all" else set(split[half])
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if ids is not None:
                if row["id"] in ids:
                    out.append(row)
            elif models is None or row["model"] in models:
                out.append(row)
    return out


def read_stream(lines: list[str]) -> dict[str, Any]:
    """What a chat client got: the text, the finish reason, the guard object if any."""
    text: list[str] = []
    finish = None
    guard = None
    stop_reason = None
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                text.append(delta["content"])
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
                stop_reason = choice.get("stop_reason")
                guard = choice.get("guard") or guard
    return {
        "chars": len("".join(text)),
        "finish": finish,
        "stop_reason": stop_reason,
        "signal": (guard or {}).get("signal"),
        "guard": guard,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--half", choices=("tune", "held", "all"), default="tune")
    parser.add_argument("--ids", nargs="*")
    parser.add_argument("--limit", type=int)
    parser.add_argument("-o", "--out", type=Path)
    args = parser.parse_args(argv)
    rows = rows_of(args.data, args.half, args.ids)[: args.limit]
    out = args.out.open("w", encoding="utf-8") if args.out else None
    cut = 0
    started = time.monotonic()
    with FakeVLLM() as fake:
        settings = load_settings(upstream_url=fake.url, upstream_metrics_interval=0)
        server = ProxyServer(create_app(settings)).start()
        try:
            with httpx.Client(base_url=server.url, timeout=120) as client:
                for i, row in enumerate(rows):
                    fake.script = Script(texts=[row["answer"]], model="m")
                    body = {
                        "model": "m",
                        "stream": True,
                        "messages": [{"role": "user", "content": row["prompt"]}],
                    }
                    with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        lines = [x for x in r.iter_lines() if x]
                        said = r.headers.get("x-guard-language", "")
                        status = r.status_code
                    got = read_stream(lines) if status == 200 else {"chars": 0}
                    got.update(id=row["id"], model=row["model"], status=status, language=said)
                    got["answer_chars"] = len(row["answer"])
                    cut += got.get("signal") is not None
                    if out:
                        out.write(json.dumps(got, ensure_ascii=False) + "\n")
                    else:
                        print(json.dumps(got, ensure_ascii=False))
                    if out and (i + 1) % 500 == 0:
                        rate = (i + 1) / (time.monotonic() - started)
                        print(f"{i + 1} / {len(rows)}, {cut} cut, {rate:.1f}/s", file=sys.stderr)
        finally:
            server.stop()
    if out:
        out.close()
    print(f"{len(rows)} answers, {cut} cut", file=sys.stderr)


if __name__ == "__main__":
    main()
