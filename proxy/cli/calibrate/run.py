"""``coherence-guard calibrate``: where does this model start to degenerate, and what prevents it?

``check`` asks three questions once; ``calibrate`` measures. It sends a matrix of prompts (kinds
of task x languages, or the operator's own ``--prompts``) x sampling settings
(``--repetition-penalty`` x ``--temperature``) x ``--seeds`` to any OpenAI-compatible server (the
engine, or the proxy in front of it), streams every answer through the same
:class:`~proxy.detect.Detector` the proxy runs (monitor mode: it only watches; the reader hangs up
at the verdict so the engine stops generating the loop) and records the token at which each
answer first degenerated, and by which signal (every signal but ``salad``, see :func:`calibrate`).
From that come, per model:

* the survival curve per task x language (share of answers still coherent after k tokens),
* a ``max_tokens`` cap (a ``--quantile`` of the degeneration positions minus ``--margin``),
* the sampling setting with the fewest degenerate answers,

written to ``--output``: ``report.md`` with PNG survival plots, ``results.json``, and
``calibrate.env`` (``GUARD_MAX_TOKENS_CAP``, ``GUARD_SAMPLING_DEFAULTS``) ready for the proxy.
Every answer is appended to ``results.jsonl`` as it arrives, so a rerun skips what is done.

``--from-prometheus URL`` reads the same recommendation from production instead: the proxy's own
``guard_abort_position_tokens`` and ``guard_completion_tokens`` histograms over ``--range``.
``--demo`` runs a small calibration against the demo's engine (llama.cpp + SmolLM2).

The matrix and its results file are :mod:`proxy.cli.calibrate.matrix`'s, the production read
:mod:`proxy.cli.calibrate.prometheus`'s; the statistics are pure functions in
:mod:`proxy.cli.calibrate.stats`; the plots and the report are in
:mod:`proxy.cli.calibrate.report`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from proxy.cli.calibrate.matrix import (
    CalibrateError,
    Cell,
    Prompt,
    builtin_prompts,
    end_torn_line,
    load_prompts,
    matrix,
    read_results,
)
from proxy.cli.calibrate.prometheus import from_prometheus

if TYPE_CHECKING:
    import httpx

    from proxy.detect import DetectorConfig

RESULTS_JSONL = "results.jsonl"
#: Prompt tokens llama.cpp's penalty window covers beyond the answer (see ``_body``).
_PROMPT_ALLOWANCE = 512

EXIT_OK = 0
EXIT_USAGE = 2


# -- arguments ---------------------------------------------------------------------------------


def _floats(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers: {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def _duration(text: str) -> str:
    """A PromQL duration (``7d``, ``1h30m``): it goes into the query text as it is."""
    if not re.fullmatch(r"(\d+(ms|[smhdwy]))+", text):
        raise argparse.ArgumentTypeError(f"not a Prometheus duration: {text!r} (e.g. 7d, 12h)")
    return text


def _names(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected at least one name")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from proxy.cli.calibrate.prompts import LANGUAGES, TASKS

    parser.description = (
        "Measure at which token a model starts to loop or drift, per task, language and "
        "sampling setting, and recommend GUARD_MAX_TOKENS_CAP and GUARD_SAMPLING_DEFAULTS."
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--url", help="the engine or the proxy (OpenAI-compatible base URL)")
    source.add_argument(
        "--from-prometheus", metavar="URL",
        help="read the recommendation from the proxy's histograms in this Prometheus instead",
    )  # fmt: skip
    source.add_argument(
        "--demo", action="store_true",
        help="a small calibration against the demo's engine (llama.cpp + SmolLM2, started here)",
    )  # fmt: skip
    parser.add_argument(
        "--model", type=_names,
        help="model name(s), comma-separated (default: the first one /v1/models lists)",
    )  # fmt: skip
    parser.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token (default: $OPENAI_API_KEY)",
    )  # fmt: skip
    parser.add_argument(
        "--tasks", type=_names, default=list(TASKS),
        help=f"built-in tasks, comma-separated (default: all of {','.join(TASKS)})",
    )  # fmt: skip
    parser.add_argument(
        "--prompts", metavar="FILE",
        help="your own prompts instead: JSONL lines {\"task\", \"language\"?, \"prompt\"}, or "
        "plain text, one prompt per line",
    )  # fmt: skip
    parser.add_argument(
        "--languages", type=_names, default=["en", "it"],
        help=f"prompt languages, comma-separated (default en,it; built in: {','.join(LANGUAGES)})",
    )  # fmt: skip
    parser.add_argument(
        "--repetition-penalty", type=_floats, default=[1.0, 1.1, 1.2], metavar="LIST",
        help="repetition penalties to try (default 1.0,1.1,1.2); sent as vLLM's "
        "repetition_penalty and llama.cpp's repeat_penalty",
    )  # fmt: skip
    parser.add_argument(
        "--temperature", type=_floats, default=[0.0], metavar="LIST",
        help="temperatures to try (default 0)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, default=3, help="answers per setting (default 3)")
    parser.add_argument(
        "--max-tokens", type=int, default=1024, help="max_tokens of every answer (default 1024)"
    )
    parser.add_argument("--concurrency", type=int, default=2, help="requests in flight (default 2)")
    parser.add_argument(
        "--quantile", type=float, default=0.1,
        help="quantile of the degeneration positions the cap starts from (default 0.1)",
    )  # fmt: skip
    parser.add_argument(
        "--margin", type=int, default=32,
        help="tokens the cap keeps below that quantile (default 32)",
    )  # fmt: skip
    parser.add_argument(
        "--range", default="7d", dest="range_", type=_duration, metavar="DURATION",
        help="with --from-prometheus: the window to read (PromQL duration, default 7d)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds allowed per answer (default 600)"
    )
    parser.add_argument(
        "--output", default="calibration", metavar="DIR",
        help="where report.md, the plots, results.json(l) and calibrate.env go "
        "(default ./calibration)",
    )  # fmt: skip


# -- running it --------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr (a line per 10 % when it is not a terminal)."""

    def __init__(self, total: int, done: int, stream: IO[str]) -> None:
        self.total, self.done, self.stream = total, done, stream
        self.degenerate = 0
        self.started = time.monotonic()
        self.first = done
        self.live = stream.isatty()
        self._last_decile = -1

    def advance(self, degenerate: bool) -> None:
        self.done += 1
        self.degenerate += degenerate
        self.show()

    def show(self) -> None:
        share = self.done / self.total if self.total else 1.0
        ran = self.done - self.first
        elapsed = time.monotonic() - self.started
        eta = elapsed / ran * (self.total - self.done) if ran else None
        bar = "#" * round(share * 30)
        line = (
            f"[{bar:<30}] {self.done}/{self.total} answers, {self.degenerate} degenerate"
            f"{f', about {eta:.0f} s left' if eta is not None else ''}"
        )
        if self.live:
            self.stream.write(f"\r\x1b[K{line}")
            if self.done == self.total:
                self.stream.write("\n")
            self.stream.flush()
        elif int(share * 10) != self._last_decile or self.done == self.total:
            self._last_decile = int(share * 10)
            self.stream.write(line + "\n")
            self.stream.flush()


def _body(cell: Cell, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": cell.model,
        "messages": [{"role": "user", "content": cell.prompt.text}],
        "max_tokens": max_tokens,
        "temperature": cell.temperature,
        "seed": cell.seed,
        # vLLM's name and llama.cpp's name for the same penalty (each ignores the other's).
        "repetition_penalty": cell.repetition_penalty,
        "repeat_penalty": cell.repetition_penalty,
    }
    if cell.repetition_penalty != 1.0:
        # vLLM penalises every token of the prompt and the answer; llama.cpp only the last 64
        # unless told otherwise, and a narrative loop's period is longer than that (measured:
        # SmolLM2 at 1.3 still loops with 64, not with the whole answer in the window).
        body["repeat_last_n"] = max_tokens + _PROMPT_ALLOWANCE
    return body


async def _measure(
    client: httpx.AsyncClient, cell: Cell, max_tokens: int, config: DetectorConfig
) -> dict[str, Any]:
    from proxy.cli.calibrate.stream import stream_chat
    from proxy.detect import Detector

    language = cell.prompt.language if cell.prompt.language != "any" else None
    detector = Detector(config, expected_language=language)
    answer = await stream_chat(
        client, _body(cell, max_tokens), detector=detector, hang_up_on_verdict=True
    )
    guard = answer.guard or {}
    return {
        "key": cell.key,
        "model": cell.model,
        "task": cell.prompt.task,
        "language": cell.prompt.language,
        "repetition_penalty": cell.repetition_penalty,
        "temperature": cell.temperature,
        "seed": cell.seed,
        "max_tokens": max_tokens,
        "tokens": answer.tokens,
        "finish_reason": answer.finish_reason,
        "degenerate_at": answer.degenerate_at,
        "signal": answer.signal,
        "guard_signal": guard.get("signal") if guard.get("action") == "aborted" else None,
        "guard_at": guard.get("completion_tokens") if guard.get("action") == "aborted" else None,
        "seconds": round(answer.seconds, 3),
    }


async def run_matrix(
    url: str,
    cells: Sequence[Cell],
    results: Path,
    *,
    max_tokens: int,
    concurrency: int,
    api_key: str | None,
    read_timeout: float,
    config: DetectorConfig,
    progress: Progress,
) -> None:
    """Measure every cell not yet in ``results`` (JSONL, appended as answers arrive)."""
    import httpx

    from proxy.cli.calibrate.stream import StreamError

    semaphore = asyncio.Semaphore(max(1, concurrency))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max(1, concurrency))
    progress.show()
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=httpx.Timeout(30.0, read=read_timeout), limits=limits
    ) as client:
        with results.open("a", encoding="utf-8") as sink:

            async def one(cell: Cell) -> None:
                async with semaphore:
                    try:
                        record = await _measure(client, cell, max_tokens, config)
                    except StreamError as exc:
                        raise CalibrateError(f"{cell.key}: the server answered {exc}") from None
                    except httpx.HTTPError as exc:
                        raise CalibrateError(f"{cell.key}: {type(exc).__name__}: {exc}") from None
                sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                sink.flush()
                progress.advance(record["degenerate_at"] is not None)

            tasks = [asyncio.create_task(one(cell)) for cell in cells]
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def discover_model(url: str, api_key: str | None) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url}/v1/models", headers=headers, timeout=30)
        models = response.json().get("data") or [] if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError) as exc:
        raise CalibrateError(f"cannot list the models of {url}: {exc}") from None
    if not models:
        raise CalibrateError(f"{url}/v1/models lists no model; pass --model")
    return str(models[0]["id"])


def calibrate(
    url: str,
    output: Path,
    *,
    models: Sequence[str] | None,
    prompts: Sequence[Prompt],
    penalties: Sequence[float],
    temperatures: Sequence[float],
    seeds: int,
    max_tokens: int,
    concurrency: int,
    quantile: float,
    margin: int,
    api_key: str | None = None,
    timeout: float = 600.0,
    stream: IO[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the matrix, then write the report; returns ``results.json``'s content."""
    from proxy.cli.calibrate.report import summarize, write_outputs
    from proxy.settings import load_detector_config

    # Without the salad signal: calibration recommends a cap and a sampling setting, which act
    # on degeneration that grows with the answer's length (loops, drift). Word salad in a
    # language is the model's competence there from the first words; no cap or penalty removes
    # it, so counting it would only hide which setting removes the loops. Production reports it.
    config = dataclasses.replace(load_detector_config(), salad=False)
    stream = stream or sys.stderr
    url = _base_url(url)
    output.mkdir(parents=True, exist_ok=True)
    results = output / RESULTS_JSONL
    names = list(models) if models else [discover_model(url, api_key)]
    cells = matrix(names, prompts, penalties, temperatures, seeds)
    wanted = {cell.key for cell in cells}
    done = {r["key"] for r in read_results(results)} & wanted
    todo = [cell for cell in cells if cell.key not in done]
    if done:
        print(f"resuming: {len(done)} of {len(cells)} answers already in {results}", file=stream)
    progress = Progress(len(cells), len(done), stream)
    end_torn_line(results)
    asyncio.run(
        run_matrix(
            url, todo, results, max_tokens=max_tokens, concurrency=concurrency,
            api_key=api_key, read_timeout=timeout, config=config, progress=progress,
        )
    )  # fmt: skip
    records = [r for r in read_results(results) if r["key"] in wanted]
    summary = summarize(records, quantile=quantile, margin=margin, max_tokens=max_tokens)
    summary["source"] = {"url": url, "max_tokens": max_tokens, "seeds": seeds}
    write_outputs(summary, output)
    return summary


# -- the command -------------------------------------------------------------------------------


def _prompts_of(args: argparse.Namespace) -> list[Prompt]:
    if args.prompts:
        return load_prompts(Path(args.prompts))
    return builtin_prompts(args.tasks, args.languages)


def _print_summary(summary: dict[str, Any], output: Path, out: IO[str]) -> None:
    for model, data in summary["models"].items():
        rec = data["recommendation"]
        cap = rec.get("max_tokens_cap")
        print(f"{model}:", file=out)
        print(f"  {rec.get('cap_reason', '')}", file=out)
        if cap is not None:
            print(f"  GUARD_MAX_TOKENS_CAP={cap}", file=out)
        if rec.get("sampling_reason"):
            print(f"  {rec['sampling_reason']}", file=out)
    print(f"\nreport: {output / 'report.md'}\nsettings: {output / 'calibrate.env'}", file=out)


def run(args: argparse.Namespace) -> int:
    from proxy.settings import ConfigError

    output = Path(args.output)
    for name in ("seeds", "max_tokens", "concurrency"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            print(f"coherence-guard calibrate: {flag} must be >= 1", file=sys.stderr)
            return EXIT_USAGE
    if not 0.0 <= args.quantile <= 1.0:
        print("coherence-guard calibrate: --quantile must be in [0, 1]", file=sys.stderr)
        return EXIT_USAGE
    try:  # the plots come at the end of a run: find out before it, not after
        import matplotlib  # noqa: F401
    except ImportError:
        print(
            "coherence-guard calibrate: the report's plots need matplotlib: "
            "pip install 'coherence-guard[calibrate]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        if args.from_prometheus:
            from proxy.cli.calibrate.report import write_outputs

            summary = from_prometheus(
                args.from_prometheus, args.range_, quantile=args.quantile, margin=args.margin,
                models=args.model,
            )  # fmt: skip
            output.mkdir(parents=True, exist_ok=True)
            write_outputs(summary, output)
        elif args.demo:
            from proxy.cli.children import sigterm_as_interrupt

            with sigterm_as_interrupt():  # the engine child is stopped on SIGTERM too
                summary = _run_demo(args, output)
        elif args.url:
            summary = calibrate(
                args.url, output, models=args.model, prompts=_prompts_of(args),
                penalties=args.repetition_penalty, temperatures=args.temperature,
                seeds=args.seeds, max_tokens=args.max_tokens, concurrency=args.concurrency,
                quantile=args.quantile, margin=args.margin, api_key=args.api_key,
                timeout=args.timeout,
            )  # fmt: skip
        else:
            print(
                "coherence-guard calibrate: give --url, --from-prometheus or --demo",
                file=sys.stderr,
            )
            return EXIT_USAGE
    except (CalibrateError, ConfigError) as exc:
        print(f"coherence-guard calibrate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"\ninterrupted; a rerun resumes from {output / RESULTS_JSONL}", file=sys.stderr)
        return 130
    _print_summary(summary, output, sys.stdout)
    return EXIT_OK


def _run_demo(args: argparse.Namespace, output: Path) -> dict[str, Any]:
    """The demo's engine, started here, and a small matrix unless the flags say otherwise. Its
    log goes to a temporary directory, removed at the end (errors carry the log's end)."""
    from proxy.cli import demo, local_engine
    from proxy.cli.children import DemoError, log_directory

    status = demo.Status(sys.stderr)
    with log_directory(None, "coherence-guard-calibrate-") as log_dir:
        try:
            status.begin("finding the model file")
            gguf = local_engine.find_gguf(None, local_engine.default_cache_dir())
            status.end(str(gguf))
            status.begin("starting llama-server (SmolLM2-135M-Instruct)")
            engine = local_engine.start_engine(gguf, log_dir, parallel=args.concurrency)
            status.end(f"{engine.url}, log {log_dir / 'engine.log'}")
        except DemoError as exc:
            raise CalibrateError(str(exc)) from None
        try:
            return calibrate(
                engine.url, output, models=[local_engine.SERVED_MODEL], prompts=_prompts_of(args),
                penalties=args.repetition_penalty, temperatures=args.temperature,
                seeds=args.seeds, max_tokens=args.max_tokens, concurrency=args.concurrency,
                quantile=args.quantile, margin=args.margin, timeout=args.timeout,
            )  # fmt: skip
        finally:
            engine.stop()
