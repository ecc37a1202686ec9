"""``coherence-guard calibrate`` against a server on a real socket, and from a real Prometheus.

The engine is the project's fake vLLM (``tests/fakes/vllm.py``), taught one rule: a request with
``repetition_penalty`` below 1.1 gets a loop, one with more a healthy answer. So the run must find
the loops, place them, recommend a cap below them, and name 1.2 as the penalty that removes them.
The real engines are in ``tests/e2e/test_calibrate.py``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai import OpenAI

from proxy.cli import main
from proxy.cli.calibrate import matrix
from proxy.cli.calibrate import run as calibrate
from proxy.cli.calibrate.prompts import LANGUAGES, PROMPTS, TASKS
from proxy.observability.metrics import Metrics
from tests.fakes.vllm import FakeVLLM, Recorded, Script
from tests.net import HANG_GUARD, free_port

MODEL = "fake-model"
LOOP = "I will check the file again to make sure it is correct. " * 60
HEALTHY = (
    "Photosynthesis is the process by which green plants, algae and some bacteria turn light "
    "into chemical energy. In the chloroplasts, chlorophyll absorbs mostly red and blue light; "
    "that energy splits water molecules, releasing oxygen, and drives the synthesis of sugars "
    "from carbon dioxide in the Calvin cycle."
)
#: The same healthy answer for prompts written in Italian: calibrate expects an answer in the
#: prompt's language, and an English answer to an Italian prompt is (rightly) language drift.
HEALTHY_IT = (
    "La fotosintesi è il processo con cui le piante verdi, le alghe e alcuni batteri "
    "trasformano la luce in energia chimica. Nei cloroplasti la clorofilla assorbe soprattutto "
    "la luce rossa e blu; quell'energia scinde le molecole d'acqua, libera ossigeno e alimenta "
    "la sintesi degli zuccheri a partire dall'anidride carbonica nel ciclo di Calvin."
)
_ITALIAN_PROMPTS = {by_lang["it"] for by_lang in PROMPTS.values() if "it" in by_lang}


class PenaltyFake(FakeVLLM):
    """Loops unless the request carries a repetition penalty of at least 1.1."""

    async def _completion(self, rec: Recorded, reader: Any, writer: Any, script: Script) -> bool:
        body = rec.json if isinstance(rec.json, dict) else {}
        looping = float(body.get("repetition_penalty", 1.0)) < 1.1
        asked = " ".join(
            str(m.get("content")) for m in body.get("messages", []) if isinstance(m, dict)
        )
        healthy = HEALTHY_IT if any(p in asked for p in _ITALIAN_PROMPTS) else HEALTHY
        # A loop begins where a healthy answer would have ended: a cap can then stop loops
        # without cutting healthy answers (else none is recommended; see the test below).
        script = Script(
            texts=[f"{healthy} {LOOP}" if looping else healthy],
            finish_reason="length" if looping else "stop",
            model=MODEL,
            chunk_delay=0.002 if looping else 0.0,
        )
        return await super()._completion(rec, reader, writer, script)


@pytest.fixture
def fake_upstream() -> Iterator[FakeVLLM]:
    """Overrides conftest's fake (``proxy_server`` fronts this one)."""
    with PenaltyFake() as fake:
        yield fake


def _run(url: str, out: Path, **overrides: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "models": [MODEL],
        "prompts": matrix.builtin_prompts(["narrative", "qa"], ["en", "it"]),
        "penalties": [1.0, 1.2],
        "temperatures": [0.0],
        "seeds": 2,
        "max_tokens": 2000,
        "concurrency": 3,
        "quantile": 0.1,
        "margin": 16,
        "stream": open(out.parent / "progress.txt", "a"),  # noqa: SIM115
    }
    options.update(overrides)
    try:
        return calibrate.calibrate(url, out, **options)
    finally:
        options["stream"].close()


def _completions(fake: FakeVLLM) -> list[Recorded]:
    return [r for r in fake.requests if r.path.startswith("/v1/chat/completions")]


def test_a_run_finds_the_loops_recommends_a_cap_below_them_and_the_penalty(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """2 tasks x 2 languages x 2 penalties x 2 seeds = 16 answers; the 8 at penalty 1.0 loop."""
    out = tmp_path / "cal"
    summary = _run(fake_upstream.url, out)
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 16
    records = [json.loads(line) for line in lines]
    loops = [r for r in records if r["repetition_penalty"] == 1.0]
    assert all(r["degenerate_at"] and r["signal"] for r in loops)
    assert not any(r["degenerate_at"] for r in records if r["repetition_penalty"] == 1.2)
    assert {r["finish_reason"] for r in records if r["repetition_penalty"] == 1.2} == {"stop"}
    # The loops were hung up on at the verdict: the engine saw each of those clients leave.
    sent = _completions(fake_upstream)
    assert len(sent) == 16
    assert all(r.json["repeat_penalty"] == r.json["repetition_penalty"] for r in sent)
    hung_up = [r for r in sent if r.json["repetition_penalty"] == 1.0]
    assert fake_upstream.wait_for(lambda: all(r.disconnected for r in hung_up))
    assert all(r.chunks_sent < len(LOOP.split()) for r in hung_up)

    model = summary["models"][MODEL]
    assert (model["answers"], model["degenerate"]) == (16, 8)
    cap = model["recommendation"]["max_tokens_cap"]
    assert cap is not None and cap < min(r["degenerate_at"] for r in loops)
    assert model["recommendation"]["sampling"] == {"repetition_penalty": 1.2}
    assert "removes the loops" in model["recommendation"]["sampling_reason"]
    survival = model["survival"]
    assert survival[0] == (0, 1.0) and survival[-1] == (2000, 0.5)
    assert {(c["task"], c["language"]) for c in model["cells"]} == {
        ("narrative", "en"), ("narrative", "it"), ("qa", "en"), ("qa", "it"),
    }  # fmt: skip

    for cell in model["cells"]:  # each task x language is cured by the same penalty
        assert cell["best_setting"] == {
            "repetition_penalty": 1.2, "temperature": 0.0, "answers": 2, "degenerate": 0,
        }  # fmt: skip
    env = (out / "calibrate.env").read_text()
    assert f"\nGUARD_MAX_TOKENS_CAP={cap}\n" in env
    assert 'GUARD_SAMPLING_DEFAULTS=\'{"fake-model": {"repetition_penalty": 1.2}}\'' in env
    data = json.loads((out / "results.json").read_text())
    assert data["models"][MODEL]["recommendation"]["max_tokens_cap"] == cap
    report = (out / "report.md").read_text()
    assert f"cap {cap} = the 0.1 quantile of 8 degeneration positions" in report
    assert "| narrative | it | 2/4 |" in report
    assert report.count("| repetition_penalty=1.2 temperature=0: 0/2 |") == 4
    for png in ("survival-fake-model-tasks.png", "survival-fake-model-settings.png"):
        assert f"![{png}]({png})" in report
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_calibrate_env_is_what_the_proxy_accepts(
    fake_upstream: FakeVLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The written variables, read as a .env file, load through the proxy's own settings."""
    from dotenv import dotenv_values

    from proxy.settings import load_settings

    _run(fake_upstream.url, tmp_path / "cal", seeds=1)
    values = {k: v for k, v in dotenv_values(tmp_path / "cal" / "calibrate.env").items() if v}
    assert set(values) == {
        "GUARD_MAX_TOKENS_CAP", "GUARD_MAX_TOKENS_DEFAULT", "GUARD_SAMPLING_DEFAULTS",
    }  # fmt: skip
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    assert settings.sampling_defaults == {MODEL: {"repetition_penalty": 1.2}}
    assert (
        settings.max_tokens_cap
        == settings.max_tokens_default
        == int(values["GUARD_MAX_TOKENS_CAP"])
    )


def test_a_rerun_resumes_and_only_asks_what_is_missing(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """Answers already in results.jsonl are not asked again; a torn last line (a run killed
    mid-write) is ignored and its answer asked again; more seeds ask only the new ones."""
    out = tmp_path / "cal"
    _run(fake_upstream.url, out, seeds=1)
    assert len(_completions(fake_upstream)) == 8
    jsonl = out / "results.jsonl"
    kept = jsonl.read_text().splitlines()
    jsonl.write_text("\n".join(kept[:-1]) + "\n" + kept[-1][:25])
    _run(fake_upstream.url, out, seeds=1)
    assert len(_completions(fake_upstream)) == 9
    summary = _run(fake_upstream.url, out, seeds=2)
    assert len(_completions(fake_upstream)) == 17
    assert summary["models"][MODEL]["answers"] == 16
    assert "resuming: 8 of 16 answers" in (tmp_path / "progress.txt").read_text()


def test_through_the_proxy_the_guard_and_the_monitor_agree(
    fake_upstream: FakeVLLM, proxy_server: Callable[..., str], tmp_path: Path
) -> None:
    """Calibrating the proxy itself (enforce mode): the guard aborts the loops, and the
    calibration's own detector places them at the same token."""
    base = proxy_server()
    _run(base, tmp_path / "cal", seeds=1)
    records = [
        json.loads(x) for x in (tmp_path / "cal" / "results.jsonl").read_text().split("\n") if x
    ]
    loops = [r for r in records if r["repetition_penalty"] == 1.0]
    assert loops and all(r["guard_signal"] == r["signal"] for r in loops)
    assert all(r["guard_at"] == r["degenerate_at"] for r in loops)
    assert {r["finish_reason"] for r in loops} == {"content_filter"}


def test_prompt_files_take_jsonl_or_plain_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        '# my prompts\n{"task": "support", "language": "de", "prompt": "Hallo?"}\n\n'
        '{"prompt": "no task"}\nplain text prompt\n'
    )
    assert matrix.load_prompts(path) == [
        matrix.Prompt("support", "de", "Hallo?"),
        matrix.Prompt("prompt4", "any", "no task"),
        matrix.Prompt("prompt5", "any", "plain text prompt"),
    ]
    path.write_text('{"task": "x"}\n')
    with pytest.raises(matrix.CalibrateError, match=r"p.jsonl:1"):
        matrix.load_prompts(path)
    path.write_text("\n# nothing\n")
    with pytest.raises(matrix.CalibrateError, match="no prompts"):
        matrix.load_prompts(path)


def test_every_built_in_task_is_written_in_every_built_in_language() -> None:
    assert set(PROMPTS) == set(TASKS)
    for task in TASKS:
        assert set(PROMPTS[task]) == set(LANGUAGES), task
    assert len({PROMPTS["narrative"][lang] for lang in LANGUAGES}) == len(LANGUAGES)
    with pytest.raises(matrix.CalibrateError, match="--prompts"):
        matrix.builtin_prompts(["narrative"], ["xx"])
    with pytest.raises(matrix.CalibrateError, match="unknown task"):
        matrix.builtin_prompts(["poetry"], ["en"])


def test_cli_prints_the_recommendation_and_exits_0(
    fake_upstream: FakeVLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model comes from /v1/models when --model is not given."""
    code = main([
        "calibrate", "--url", fake_upstream.url + "/v1", "--tasks", "list", "--languages", "en",
        "--repetition-penalty", "1.0,1.1", "--seeds", "1", "--max-tokens", "1500",
        "--output", str(tmp_path / "o"),
    ])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "GUARD_MAX_TOKENS_CAP=" in out.out and "repetition_penalty=1.1" in out.out
    assert "2/2 answers" in out.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "http://127.0.0.1:9"], "cannot list the models"),
        (["--url", "http://127.0.0.1:9", "--seeds", "0"], "--seeds must be >= 1"),
        (["--url", "http://127.0.0.1:9", "--languages", "xx"], "no built-in prompts"),
        ([], "give --url"),
        (
            ["--from-prometheus", "http://127.0.0.1:9", "--range", "7d]) or vector(1"],
            "not a Prometheus duration",
        ),
    ],
    ids=["unreachable", "no-seeds", "unknown-language", "no-source", "bad-range"],
)
def test_cli_errors_exit_2_with_a_reason(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["calibrate", *argv, "--output", str(tmp_path)])
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


# -- from production: a real Prometheus scraping a real proxy ---------------------------------


@pytest.mark.prometheus
def test_from_prometheus_reads_the_proxys_histograms(
    fake_upstream: FakeVLLM, proxy_server: Callable[..., str], tmp_path: Path
) -> None:
    """Loops aborted by a live proxy, scraped by Prometheus 2.x: the cap comes out of
    guard_abort_position_tokens at the position the guard reported, minus the margin."""
    from tests.deploy_tools import require

    binary = require("prometheus", "apt-get install -y --no-install-recommends prometheus")
    metrics = Metrics()
    # The same looping request is sent twice per round: retry memory would answer the
    # second one in heal mode (a different abort position), which is not under test here.
    base = proxy_server(metrics=metrics, retry_after_abort="off")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{
            "job_name": "proxy-quality", "metrics_path": "/metrics/quality",
            "static_configs": [{"targets": [base.removeprefix("http://")]}],
        }],
    }  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    prom = f"http://127.0.0.1:{port}"
    try:
        positions: list[int] = []
        with OpenAI(base_url=base + "/v1", api_key="x", max_retries=0) as client:

            def traffic() -> None:
                for penalty in (1.0, 1.0, 1.2):
                    stream = client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "go"}], stream=True,
                        max_tokens=2000, extra_body={"repetition_penalty": penalty},
                    )  # fmt: skip
                    for chunk in stream:
                        for choice in chunk.choices:
                            guard = (choice.model_extra or {}).get("guard")
                            if guard:
                                positions.append(guard["completion_tokens"])

            def aborted() -> float:
                try:
                    result = httpx.get(
                        prom + "/api/v1/query",
                        params={"query": "sum(guard_abort_position_tokens_count)"},
                    ).json()["data"]["result"]
                except (httpx.HTTPError, KeyError):
                    return -1
                return float(result[0]["value"][1]) if result else 0.0

            # Two rounds: the series exist (at their first value) before they grow, so
            # increase() over the window sees the second round.
            for want in (2.0, 4.0):
                traffic()
                deadline = time.monotonic() + HANG_GUARD
                while aborted() < want:
                    assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
                    assert time.monotonic() < deadline, f"Prometheus never saw {want} aborts"
                    time.sleep(0.25)
        assert len(positions) == 4 and len(set(positions)) == 1
        position = positions[0]
        out = tmp_path / "prod"
        code = main([
            "calibrate", "--from-prometheus", prom, "--range", "5m", "--quantile", "0.5",
            "--margin", "8", "--output", str(out),
        ])  # fmt: skip
        assert code == 0
        summary = json.loads((out / "results.json").read_text())
        model = summary["models"][MODEL]
        # All aborts sit in one power-of-two bucket (lo, hi]: the interpolated median is its
        # middle, whatever increase() extrapolated.
        hi = 2 ** math.ceil(math.log2(position))
        lo = hi // 2
        assert lo < position <= hi
        assert model["recommendation"]["max_tokens_cap"] == (lo + hi) // 2 - 8
        assert model["degenerate"] > 0 and model["answers"] > model["degenerate"]
        assert set(model["signals"]) == {"repetition"} or len(model["signals"]) == 1
        assert "guard" in model["finish_reasons"] and "stop" in model["finish_reasons"]
        assert (out / f"survival-{MODEL}.png").read_bytes()[:4] == b"\x89PNG"
        env = (out / "calibrate.env").read_text()
        assert f"GUARD_MAX_TOKENS_CAP={(lo + hi) // 2 - 8}" in env
        assert "GUARD_SAMPLING_DEFAULTS" not in env
    finally:
        proc.terminate()
        try:
            proc.wait(HANG_GUARD)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_progress_prints_whole_lines_when_not_a_terminal(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    with path.open("w") as stream:
        progress = calibrate.Progress(20, 0, stream)
        for i in range(20):
            progress.advance(i % 4 == 0)
    lines = path.read_text().splitlines()
    assert lines[-1].startswith("[" + "#" * 30 + "] 20/20 answers, 5 degenerate")
    assert 10 <= len(lines) <= 21 and "\r" not in path.read_text()


def test_a_server_error_stops_the_run_with_its_reason(tmp_path: Path) -> None:
    """A server that answers 500: the run stops with the server's reason, and the next run in
    the same process starts afresh."""
    with FakeVLLM() as fake:
        fake.script = Script(status=500)
        with pytest.raises(matrix.CalibrateError, match="HTTP 500"):
            _run(fake.url, tmp_path / "a", seeds=1)
        fake.script = Script(texts=[HEALTHY], model=MODEL)
        english = matrix.builtin_prompts(["narrative", "qa"], ["en"])
        summary = _run(fake.url, tmp_path / "b", seeds=1, penalties=[1.0], prompts=english)
        assert summary["models"][MODEL]["degenerate"] == 0


def test_no_cap_is_recommended_when_every_cap_below_the_loops_cuts_healthy_answers(
    tmp_path: Path,
) -> None:
    """Loops that begin early while healthy answers run long (SmolLM2: loops from token ~60,
    answers of 200-600 tokens): a cap below the loops would cut most healthy answers. Then no
    cap is recommended, and the reason says so and what to use instead."""
    from proxy.cli.calibrate.report import render_env, summarize

    def record(tokens: int, at: int | None, penalty: float) -> dict[str, Any]:
        return {
            "model": MODEL, "task": "qa", "language": "en", "repetition_penalty": penalty,
            "temperature": 0.0, "seed": 0, "tokens": tokens, "degenerate_at": at,
            "signal": "repetition" if at else None,
        }  # fmt: skip

    records = [record(600, 60 + 10 * i, 1.0) for i in range(6)]
    records += [record(200 + 40 * i, None, 1.2) for i in range(10)]
    summary = summarize(records, quantile=0.1, margin=16, max_tokens=600)
    rec = summary["models"][MODEL]["recommendation"]
    assert rec["max_tokens_cap"] is None
    assert "no cap separates the loops from the coherent answers" in rec["cap_reason"]
    assert "100% of the coherent answers" in rec["cap_reason"]
    assert "GUARD_MODE=heal" in rec["cap_reason"]
    env = render_env(summary)
    assert "GUARD_MAX_TOKENS_CAP=" not in env.replace("# GUARD_MAX_TOKENS_CAP", "")
    assert "GUARD_SAMPLING_DEFAULTS=" in env  # the penalty is what is recommended
    # A cap that cuts at most 1 % of the healthy answers is still recommended.
    records = [record(600, 300 + 10 * i, 1.0) for i in range(6)]
    records += [record(100 + 10 * i, None, 1.2) for i in range(10)]
    rec = summarize(records, quantile=0.1, margin=16, max_tokens=600)["models"][MODEL]
    assert rec["recommendation"]["max_tokens_cap"] is not None


def test_a_missing_calibrate_extra_is_said_before_the_run(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """Without matplotlib the report cannot be written: said at once (exit 2), not as a
    traceback after the whole matrix ran."""
    blocked = "import sys; sys.modules['matplotlib'] = None; from proxy.cli import main; "
    argv = [
        "calibrate", "--url", fake_upstream.url, "--model", MODEL, "--tasks", "list",
        "--languages", "en", "--seeds", "1", "--max-tokens", "200",
        "--output", str(tmp_path / "o"),
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", blocked + f"sys.exit(main({argv!r}))"],
        capture_output=True, text=True, timeout=HANG_GUARD,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "pip install 'coherence-guard[calibrate]'" in out.stderr
    assert "Traceback" not in out.stderr
    assert _completions(fake_upstream) == []


def test_calibrate_demo_leaves_no_log_directory_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``calibrate --demo`` keeps the engine's log in a temporary directory, removed when it
    ends (here: the engine does not start, and the error carries the end of its log)."""
    import tempfile

    from proxy.cli import local_engine
    from proxy.cli.children import DemoError

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(local_engine, "find_gguf", lambda *_: tmp_path / "model.gguf")

    def start_engine(gguf: Path, log_dir: Path, **_: Any) -> None:
        (log_dir / "engine.log").write_text("failed to load model")
        raise DemoError("llama-server exited with 1; its log:\nfailed to load model")

    monkeypatch.setattr(local_engine, "start_engine", start_engine)
    assert main(["calibrate", "--demo", "--output", str(tmp_path / "out")]) == 2
    assert "failed to load model" in capsys.readouterr().err
    assert list(temp.iterdir()) == []
