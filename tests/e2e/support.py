"""Helpers for the end-to-end tests: engine/proxy processes, their metrics, streamed answers."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.net import free_port

ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = ROOT / ".e2e" / "logs"
FIGURES = ROOT / ".e2e" / "figures.json"

#: The issue's prompts: a small model greedy-decoding a long numbered narrative loops for real.
LOOP_PROMPTS = {
    "en": "Write a 75-paragraph story in English, numbering each paragraph",
    "it": "Write a 75-paragraph story in Italian, numbering each paragraph",
}
#: Greedy and without the penalties that would hide the loop.
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"repetition_penalty": 1.0}}


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text → {sample name: value summed over label sets}."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def sample_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def record_figure(key: str, value: Any) -> None:
    """Keep a measured figure (engine start time, verdict→drop time…) in .e2e/figures.json."""
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    data[key] = value
    FIGURES.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


@dataclass
class Server:
    """A process serving HTTP on a loopback port, with its output captured to a file."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def mark_log(self) -> None:
        """Remember where the log ends now; :meth:`log_since_mark` reads what follows."""
        self.log_offset = self.log_path.stat().st_size

    def log_since_mark(self) -> str:
        with self.log_path.open("rb") as f:
            f.seek(self.log_offset)
            return f.read().decode(errors="replace")

    def metrics_text(self, path: str = "/metrics") -> str:
        response = httpx.get(self.url + path, timeout=10)
        response.raise_for_status()
        return response.text

    def metrics(self, path: str = "/metrics") -> dict[str, float]:
        return metric_values(self.metrics_text(path))

    def openai(self, timeout: float = 180.0) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="e2e", max_retries=0, timeout=timeout
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


#: ``start_proxy(engine_or_url, **guard_settings) -> Server``, the session fixture's factory.
ProxyFactory = Callable[..., Server]


class StartError(Exception):
    pass


def start_server(
    name: str,
    command: list[str],
    env: Mapping[str, str],
    ready_path: str,
    timeout: float,
) -> Server:
    """Start ``command`` ("{port}" in an argument or env value is replaced by a free port) and
    wait until ``ready_path`` answers 200."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    log_path = LOG_DIR / f"{name}-{port}.log"
    url = f"http://127.0.0.1:{port}"
    argv = [part.replace("{port}", port) for part in command]
    full_env = {**os.environ, **{k: v.replace("{port}", port) for k, v in env.items()}}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, cwd=ROOT,
        )  # fmt: skip
    server = Server(name, url, proc, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StartError(f"{name} exited with {proc.returncode}:\n{server.log()[-3000:]}")
        try:
            if httpx.get(url + ready_path, timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop()
    raise StartError(f"{name} not ready after {timeout:.0f} s; log: {log_path}")


def wait_for(
    probe: Callable[[], float], done: Callable[[float], bool], timeout: float, interval: float
) -> tuple[float, float]:
    """Poll ``probe`` until ``done(value)``; return (seconds waited, last value)."""
    started = time.monotonic()
    while True:
        value = probe()
        elapsed = time.monotonic() - started
        if done(value) or elapsed > timeout:
            return elapsed, value
        time.sleep(interval)


@dataclass
class Streamed:
    """What a client saw of one streamed chat answer (choice 0)."""

    text: str = ""
    content_chunks: int = 0
    finish_reason: str | None = None
    final_choice: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finished_at: float | None = None


def stream_chat(
    client: openai.OpenAI, model: str, prompt: str, *, stop_after: int | None = None, **kw: Any
) -> Streamed:
    """Stream one greedy chat answer with the openai SDK; ``stop_after`` content chunks, the
    client hangs up (closes the connection) instead of reading on."""
    out = Streamed()
    parts: list[str] = []
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], stream=True, **kw
    )
    with stream:
        for chunk in stream:
            if chunk.usage is not None:
                out.usage = chunk.usage.model_dump()
            for choice in chunk.choices:
                if choice.delta.content:
                    parts.append(choice.delta.content)
                    out.content_chunks += 1
                if choice.finish_reason is not None:
                    out.finish_reason = choice.finish_reason
                    out.final_choice = choice.model_dump()
                    out.finished_at = time.monotonic()
            if stop_after is not None and out.content_chunks >= stop_after:
                break
    out.text = "".join(parts)
    return out
