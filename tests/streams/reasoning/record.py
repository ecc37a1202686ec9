"""Record real reasoning-channel streams from vLLM for tests/test_channels.py.

vLLM 0.32 (CPU) serves SmolLM2-135M-Instruct with ``--reasoning-parser granite``: that parser
splits the generated text on the phrases "Here is my thought process:" / "Here is my response:"
(plain text, no special tokens, so a model without think tokens can use it), and a few-shot
conversation makes the model write them. The engine's own reasoning framing is then exactly what
a reasoning model gets: ``delta.reasoning`` then ``delta.content`` on chat,
``response.reasoning_text.delta`` in a reasoning item on Responses, a ``thinking`` block with
``thinking_delta`` on Messages. The bytes are stored as the engine wrote them. vLLM's
``/v1/completions`` applies no reasoning parser (the thinking stays in ``text``), so completions
has no reasoning stream to record.

Run (the e2e engine from scripts/prepare-e2e.sh, any free port)::

    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2 $E2E/vllm-venv/bin/python -m \
        vllm.entrypoints.openai.api_server --model $E2E/models/smollm2-135m-instruct \
        --served-model-name SmolLM2-135M-Instruct --max-model-len 4096 --dtype bfloat16 \
        --enforce-eager --reasoning-parser granite --port PORT
    python tests/streams/reasoning/record.py http://127.0.0.1:PORT
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx

from tests.net import HANG_GUARD

HERE = Path(__file__).parent
MODEL = "SmolLM2-135M-Instruct"
THINK = "Here is my thought process:\n"
ANSWER = "\nHere is my response:\n"
SYSTEM = "You always think first, then give a short answer."
SHOTS = [
    ("What is 2+3?", "The user asks for 2 plus 3. Two plus three is five.", "The answer is 5."),
    ("What is 4+4?", "The user asks for 4 plus 4. Four plus four is eight.", "The answer is 8."),
]
QUESTION = "What is 6+1?"


def conversation() -> list[dict[str, str]]:
    out = []
    for question, thought, answer in SHOTS:
        out.append({"role": "user", "content": question})
        out.append({"role": "assistant", "content": THINK + thought + ANSWER + answer})
    out.append({"role": "user", "content": QUESTION})
    return out


def record(base: str, path: str, body: dict[str, Any], name: str) -> None:
    with httpx.stream("POST", base + path, json=body, timeout=HANG_GUARD) as r:
        r.raise_for_status()
        data = r.read()
    (HERE / name).write_bytes(data)
    print(name, len(data), "bytes")


def main(base: str) -> None:
    sampling = {"model": MODEL, "stream": True, "temperature": 0, "max_tokens": 80}
    chat = [{"role": "system", "content": SYSTEM}, *conversation()]
    record(base, "/v1/chat/completions", {**sampling, "messages": chat}, "chat.sse")
    responses = {
        "model": MODEL,
        "stream": True,
        "temperature": 0,
        "max_output_tokens": 80,
        "instructions": SYSTEM,
        "input": conversation(),
    }
    record(base, "/v1/responses", responses, "responses.sse")
    messages = {**sampling, "system": SYSTEM, "messages": conversation()}
    record(base, "/v1/messages", messages, "messages.sse")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")
