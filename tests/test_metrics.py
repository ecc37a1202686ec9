"""The metrics layer: values after known records, the two-registry split, label caps.

Values are read back from the rendered exposition text (what Prometheus scrapes), not from
collector internals.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import Counter, Histogram

from proxy.core.records import ChoiceRecord, GenerationRecord
from proxy.detect import SIGNALS, Summary, Verdict
from proxy.observability.labels import OTHER, CappedLabel
from proxy.observability.metrics import Metrics
from proxy.observability.multiprocess import prepare_multiprocess
from tests.exposition_server import families, parse, value
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD, free_port, wait_healthy

QUALITY_FAMILIES = {
    "guard_generations",
    "guard_detections",
    "guard_channel_detections",
    "guard_abort_position_tokens",
    "guard_completion_tokens",
    "guard_finish_reason",
    "guard_tokens_saved",
    "guard_max_tokens_rewritten",
    "guard_language_constraint",
    "guard_language_expectation",
    "guard_repetition_score",
    "guard_lexical_diversity",
    "guard_token_entropy",
    "guard_heals",
    "guard_heal_attempts",
    "guard_heal_successes",
    "guard_heal_discarded_tokens",
}


def summary(
    *,
    tokens: int = 100,
    repetition: float | None = 0.1,
    diversity: float | None = 0.8,
    entropy: float | None = 2.0,
    verdict: Verdict | None = None,
) -> Summary:
    return Summary(
        chars=tokens * 4,
        tokens=tokens,
        repetition_score=repetition,
        lexical_diversity=diversity,
        token_entropy=entropy,
        verdict=verdict,
    )


def loop_verdict(at_token: int = 300, signal: str = "repetition") -> Verdict:
    return Verdict(
        signal=signal,
        score=0.97,
        fired_at_char=at_token * 4,
        fired_at_token=at_token,
        onset_char=at_token * 2,
    )


def aborted(model: str = "m", at_token: int = 300, max_tokens: int = 1000) -> GenerationRecord:
    choice = ChoiceRecord(
        index=0,
        finish_reason="content_filter",
        completion_tokens=at_token,
        summary=summary(tokens=at_token, repetition=0.9, verdict=loop_verdict(at_token)),
        detection_action="aborted",
        max_tokens=max_tokens,
    )
    return GenerationRecord(model=model, endpoint="chat", outcome="aborted", choices=[choice])


def completed(model: str = "m", tokens: int = 50, finish: str | None = "stop") -> GenerationRecord:
    choice = ChoiceRecord(
        index=0,
        finish_reason=finish,
        completion_tokens=tokens,
        summary=summary(tokens=tokens),
        max_tokens=1000,
    )
    return GenerationRecord(model=model, endpoint="chat", outcome="completed", choices=[choice])


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(max_models=3)


def test_n_aborted_generations_counted(metrics: Metrics) -> None:
    for _ in range(7):
        metrics.record_generation(aborted())
    for _ in range(3):
        metrics.record_generation(completed())
    q = parse(metrics.render_quality()[0])
    gen = "guard_generations_total"
    assert value(q, gen, model="m", endpoint="chat", outcome="aborted") == 7
    assert value(q, gen, model="m", endpoint="chat", outcome="completed") == 3
    assert value(q, gen, model="m", endpoint="chat", outcome="client_disconnected") == 0
    det = "guard_detections_total"
    assert value(q, det, model="m", signal="repetition", action="aborted") == 7
    chan = "guard_channel_detections_total"
    assert value(q, chan, model="m", channel="content", action="aborted") == 7
    assert value(q, chan, model="m", channel="reasoning", action="aborted") == 0
    # Aborted choices count as the guard's own finish, not what the client was told.
    assert value(q, "guard_finish_reason_total", model="m", finish_reason="guard") == 7
    assert value(q, "guard_finish_reason_total", model="m", finish_reason="stop") == 3
    assert value(q, "guard_finish_reason_total", model="m", finish_reason="content_filter") == 0
    assert value(q, "guard_tokens_saved_total", model="m") == 7 * (1000 - 300)
    pos = "guard_abort_position_tokens"
    assert value(q, pos + "_count", model="m", signal="repetition") == 7
    assert value(q, pos + "_sum", model="m", signal="repetition") == 7 * 300
    assert value(q, pos + "_bucket", model="m", signal="repetition", le="256.0") == 0
    assert value(q, pos + "_bucket", model="m", signal="repetition", le="512.0") == 7
    assert value(q, "guard_completion_tokens_count", model="m") == 10
    assert value(q, "guard_completion_tokens_sum", model="m") == 7 * 300 + 3 * 50
    assert value(q, "guard_repetition_score_count", model="m") == 10
    assert value(q, "guard_repetition_score_sum", model="m") == pytest.approx(7 * 0.9 + 3 * 0.1)
    assert value(q, "guard_lexical_diversity_bucket", model="m", le="0.8") == 10
    assert value(q, "guard_token_entropy_bucket", model="m", le="1.5") == 0
    assert value(q, "guard_token_entropy_bucket", model="m", le="2.0") == 10


def test_monitor_mode_detection_is_observed_not_aborted(metrics: Metrics) -> None:
    choice = ChoiceRecord(
        index=0,
        finish_reason="length",
        completion_tokens=1000,
        summary=summary(tokens=1000, verdict=loop_verdict(400, "token-flood")),
        detection_action="observed",
        max_tokens=1000,
    )
    metrics.record_generation(
        GenerationRecord(model="m", endpoint="completions", outcome="completed", choices=[choice])
    )
    q = parse(metrics.render_quality()[0])
    det = "guard_detections_total"
    assert value(q, det, model="m", signal="token-flood", action="observed") == 1
    assert value(q, det, model="m", signal="token-flood", action="aborted") == 0
    assert value(q, "guard_finish_reason_total", model="m", finish_reason="length") == 1
    assert value(q, "guard_tokens_saved_total", model="m") == 0
    gen = "guard_generations_total"
    assert value(q, gen, model="m", endpoint="completions", outcome="completed") == 1


def test_choices_without_summary_or_values(metrics: Metrics) -> None:
    choices = [
        ChoiceRecord(index=0, finish_reason=None, completion_tokens=5, summary=None),
        ChoiceRecord(
            index=1,
            finish_reason="made-up",
            completion_tokens=8,
            summary=summary(repetition=None, diversity=None, entropy=None),
        ),
    ]
    metrics.record_generation(
        GenerationRecord(model="m", endpoint="chat", outcome="client_disconnected", choices=choices)
    )
    metrics.record_generation(
        GenerationRecord(model="m", endpoint="chat", outcome="upstream_error")
    )
    q = parse(metrics.render_quality()[0])
    assert value(q, "guard_finish_reason_total", model="m", finish_reason="none") == 1
    assert value(q, "guard_finish_reason_total", model="m", finish_reason=OTHER) == 1
    assert value(q, "guard_completion_tokens_count", model="m") == 2
    assert value(q, "guard_repetition_score_count", model="m") == 0
    gen = "guard_generations_total"
    assert value(q, gen, model="m", endpoint="chat", outcome="client_disconnected") == 1
    assert value(q, gen, model="m", endpoint="chat", outcome="upstream_error") == 1


def test_no_family_on_both_registries(metrics: Metrics) -> None:
    metrics.record_generation(aborted())
    metrics.request_finished("/v1/chat/completions", 200, 0.5)
    metrics.upstream_error("timeout")
    metrics.upstream_kv_cache_dtype("auto")
    quality = families(metrics.render_quality()[0])
    infra = families(metrics.render_infra()[0])
    assert quality == QUALITY_FAMILIES
    assert not quality & infra
    assert {
        "guard_proxy_requests",
        "guard_proxy_request_duration_seconds",
        "guard_proxy_time_to_first_token_seconds",
        "guard_proxy_streams_in_flight",
        "guard_proxy_upstream_errors",
        "guard_upstream_kv_cache_dtype_info",
        "process_cpu_seconds",
    } <= infra


def test_rendered_content_type_is_prometheus_text(metrics: Metrics) -> None:
    body, ctype = metrics.render_infra()
    assert ctype.startswith("text/plain; version=0.0.4")
    assert b"# TYPE guard_proxy_streams_in_flight gauge" in body


def test_model_label_is_capped(metrics: Metrics) -> None:
    for model in ("a", "b", "c", "d", "e"):
        metrics.record_generation(completed(model=model))
    metrics.record_generation(completed(model="has space"))
    metrics.record_generation(completed(model="a"))
    q = parse(metrics.render_quality()[0])
    gen = "guard_generations_total"
    assert value(q, gen, model="a", endpoint="chat", outcome="completed") == 2
    assert value(q, gen, model="c", endpoint="chat", outcome="completed") == 1
    assert value(q, gen, model="d", endpoint="chat", outcome="completed") == 0
    assert value(q, gen, model=OTHER, endpoint="chat", outcome="completed") == 3
    models = {dict(labels)["model"] for (name, labels) in q if name == gen}
    assert models == {"a", "b", "c", OTHER}


def test_configured_models_are_admitted_first() -> None:
    m = Metrics(max_models=2, models=["org/llama-3.1-8b"])
    m.record_generation(completed(model="x"))
    m.record_generation(completed(model="y"))
    m.record_generation(completed(model="org/llama-3.1-8b"))
    q = parse(m.render_quality()[0])
    gen = "guard_generations_total"
    assert value(q, gen, model="org/llama-3.1-8b", endpoint="chat", outcome="completed") == 1
    assert value(q, gen, model="x", endpoint="chat", outcome="completed") == 1
    assert value(q, gen, model=OTHER, endpoint="chat", outcome="completed") == 1


def _models_labelled(m: Metrics) -> dict[str, float]:
    q = parse(m.render_quality()[0])
    out: dict[str, float] = {}
    for (name, labels), v in q.items():
        if name == "guard_generations_total":
            model = dict(labels)["model"]
            out[model] = out.get(model, 0.0) + v
    return out


def test_junk_model_names_cannot_crowd_out_the_engines_models() -> None:
    """Once the engine's model list is known, names it does not serve are ``other`` however
    early and often they come, and every model it serves still gets its own label."""
    m = Metrics(max_models=3)
    m.set_engine_models(["llama-3.1-8b", "qwen-7b"])
    for i in range(10):
        m.record_generation(completed(model=f"junk-{i}"))
    m.record_generation(completed(model="qwen-7b"))
    m.record_generation(completed(model="llama-3.1-8b"))
    assert _models_labelled(m) == {OTHER: 10, "qwen-7b": 1, "llama-3.1-8b": 1}
    assert m.model_label("junk-0") == OTHER


def test_before_the_engine_list_first_come_then_the_list_decides() -> None:
    """Until the engine's list is read the cap is first-come; from then on a name admitted
    earlier that the engine does not serve is ``other``, and a listed one takes its place."""
    m = Metrics(max_models=2)
    m.record_generation(completed(model="early-junk"))
    m.record_generation(completed(model="other-junk"))
    assert m.model_label("real") == OTHER  # cap full, list unknown
    m.set_engine_models(["real"])
    assert m.model_label("early-junk") == OTHER
    assert m.model_label("real") == "real"
    m.record_generation(completed(model="real"))
    labelled = _models_labelled(m)
    assert labelled["real"] == 1
    assert labelled["early-junk"] == 1  # the series written before stays, frozen


def test_models_named_in_sampling_defaults_keep_their_label_when_the_engine_omits_them() -> None:
    """GUARD_SAMPLING_DEFAULTS names count as known models (say, a LoRA the engine's list does
    not show); the cap still bounds the total."""
    from proxy.settings import load_settings

    settings = load_settings(metrics_max_models=2, sampling_defaults={"adapter-a": {"top_k": 5}})
    m = Metrics.from_settings(settings)
    m.set_engine_models(["base", "second", "third"])
    assert m.model_label("adapter-a") == "adapter-a"
    assert m.model_label("base") == "base"
    assert m.model_label("second") == OTHER  # two labels already taken


def test_signal_label_is_the_detectors_fixed_set(metrics: Metrics) -> None:
    record = aborted()
    summary = record.choices[0].summary
    assert summary is not None and summary.verdict is not None
    odd = Verdict("made-up-signal", 1.0, 10, 5, 0)
    record.choices[0].summary = Summary(40, 5, None, None, None, odd)
    metrics.record_generation(record)
    q = parse(metrics.render_quality()[0])
    assert value(q, "guard_detections_total", model="m", signal=OTHER, action="aborted") == 1
    assert "repetition" in SIGNALS


def test_capped_label_rejects_junk() -> None:
    label = CappedLabel(10)
    assert label("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    assert label("a" * 129) == OTHER
    assert label("bad\nvalue") == OTHER
    assert label("") == OTHER
    assert label(None) == OTHER
    assert label.seen == {"Qwen/Qwen2.5-7B-Instruct"}


def test_fixed_label_sets(metrics: Metrics) -> None:
    metrics.max_tokens_rewritten("m", "clamped")
    metrics.max_tokens_rewritten("m", "clamped")
    metrics.max_tokens_rewritten("m", "exploded")
    metrics.language_constraint("m", "DE")
    metrics.language_expectation("m", "request", "strong")
    metrics.language_expectation("m", "the-moon", "very")
    metrics.upstream_error("timeout")
    metrics.upstream_error("cosmic-ray")
    metrics.request_finished("/v1/chat/completions", 200, 0.2)
    metrics.request_finished("/v1/chat/completions", 999, 0.2)
    q = parse(metrics.render_quality()[0])
    assert value(q, "guard_max_tokens_rewritten_total", model="m", action="clamped") == 2
    assert value(q, "guard_max_tokens_rewritten_total", model="m", action=OTHER) == 1
    assert value(q, "guard_language_constraint_total", model="m", language="de") == 1
    expectation = "guard_language_expectation_total"
    assert value(q, expectation, model="m", source="request", strength="strong") == 1
    assert value(q, expectation, model="m", source=OTHER, strength=OTHER) == 1
    i = parse(metrics.render_infra()[0])
    assert value(i, "guard_proxy_upstream_errors_total", kind="timeout") == 1
    assert value(i, "guard_proxy_upstream_errors_total", kind=OTHER) == 1
    req = "guard_proxy_requests_total"
    assert value(i, req, route="/v1/chat/completions", status="200") == 1
    assert value(i, req, route="/v1/chat/completions", status=OTHER) == 1
    dur = "guard_proxy_request_duration_seconds_count"
    assert value(i, dur, route="/v1/chat/completions") == 2


def test_infra_gauges_and_counters(metrics: Metrics) -> None:
    metrics.stream_opened()
    metrics.stream_opened()
    metrics.stream_closed()
    metrics.time_to_first_token(0.03)
    i = parse(metrics.render_infra()[0])
    assert value(i, "guard_proxy_streams_in_flight") == 1
    assert value(i, "guard_proxy_time_to_first_token_seconds_count") == 1
    assert value(i, "guard_proxy_time_to_first_token_seconds_bucket", le="0.05") == 1
    assert value(i, "guard_proxy_time_to_first_token_seconds_bucket", le="0.025") == 0


def test_kv_cache_dtype_info_tracks_the_current_dtype(metrics: Metrics) -> None:
    metrics.upstream_kv_cache_dtype("auto")
    metrics.upstream_kv_cache_dtype("fp8_e4m3")
    i = parse(metrics.render_infra()[0])
    info = "guard_upstream_kv_cache_dtype_info"
    assert value(i, info, cache_dtype="fp8_e4m3") == 1
    assert value(i, info, cache_dtype="auto") == 0
    assert (info, frozenset({("cache_dtype", "auto")})) in i


def test_label_children_are_cached(metrics: Metrics, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first stream of a kind, recording another never goes through labels()."""
    metrics.record_generation(aborted())
    metrics.record_generation(completed())
    metrics.request_finished("/v1/chat/completions", 200, 0.1)

    def forbidden(self: object, *args: object, **kwargs: object) -> None:
        raise AssertionError("labels() called on the hot path")

    monkeypatch.setattr(Counter, "labels", forbidden)
    monkeypatch.setattr(Histogram, "labels", forbidden)
    for _ in range(5):
        metrics.record_generation(aborted())
        metrics.record_generation(completed())
        metrics.request_finished("/v1/chat/completions", 200, 0.1)
    monkeypatch.undo()
    q = parse(metrics.render_quality()[0])
    gen = "guard_generations_total"
    assert value(q, gen, model="m", endpoint="chat", outcome="aborted") == 6


def test_from_settings_uses_cap_and_configured_models() -> None:
    from proxy.settings import load_settings

    settings = load_settings(
        metrics_max_models=1,
        sampling_defaults={"qwen*": {}, "big-model": {"temperature": 0.7}, "*": {}},
    )
    m = Metrics.from_settings(settings)
    m.record_generation(completed(model="big-model"))
    m.record_generation(completed(model="small-model"))
    q = parse(m.render_quality()[0])
    gen = "guard_generations_total"
    assert value(q, gen, model="big-model", endpoint="chat", outcome="completed") == 1
    assert value(q, gen, model=OTHER, endpoint="chat", outcome="completed") == 1


# -- multiprocess mode ------------------------------------------------------------------------

_WORKER = textwrap.dedent(
    """
    import sys
    from proxy.observability.metrics import Metrics
    from proxy.observability.multiprocess import multiprocess_enabled
    from proxy.core.records import GenerationRecord
    assert multiprocess_enabled()
    m = Metrics()
    for _ in range(int(sys.argv[1])):
        m.record_generation(GenerationRecord(model="m", endpoint="chat", outcome="aborted"))
        m.request_finished("/v1/chat/completions", 200, 0.1)
    m.stream_opened()
    if sys.argv[2] == "render":
        sys.stdout.buffer.write(m.render_quality()[0] + b"\\n#---\\n" + m.render_infra()[0])
    """
)


@pytest.fixture
def multiproc_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "mp"))
    (tmp_path / "mp").mkdir()
    (tmp_path / "mp" / "counter_999999.db").write_bytes(b"stale")  # from a previous run
    assert prepare_multiprocess(workers=3) == str(tmp_path / "mp")
    assert not (tmp_path / "mp" / "counter_999999.db").exists()
    yield dict(os.environ)


def test_multiprocess_workers_are_summed_and_split(multiproc_env: dict[str, str]) -> None:
    """Three worker processes record; a fourth renders the sum, still split in two registries."""
    for n in (4, 5):
        subprocess.run(
            [sys.executable, "-c", _WORKER, str(n), "quiet"], env=multiproc_env, check=True
        )
    out = subprocess.run(
        [sys.executable, "-c", _WORKER, "2", "render"],
        env=multiproc_env,
        check=True,
        capture_output=True,
    ).stdout
    quality_body, infra_body = out.split(b"\n#---\n")
    q, i = parse(quality_body), parse(infra_body)
    gen = "guard_generations_total"
    assert value(q, gen, model="m", endpoint="chat", outcome="aborted") == 11
    assert value(i, "guard_proxy_requests_total", route="/v1/chat/completions", status="200") == 11
    assert families(quality_body) <= QUALITY_FAMILIES
    assert not families(quality_body) & families(infra_body)
    assert "guard_proxy_streams_in_flight" in families(infra_body)


def test_prepare_multiprocess_single_worker_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    assert prepare_multiprocess(workers=1) is None
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


def test_prepare_multiprocess_clears_the_operators_directory_for_one_worker_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker in the operator's PROMETHEUS_MULTIPROC_DIR still reads every file there, so a
    previous process's files go; other files in the directory are not the proxy's to remove."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    (tmp_path / "gauge_livesum_999999.db").write_bytes(b"stale")
    (tmp_path / "README").write_text("kept")
    assert prepare_multiprocess(workers=1) == str(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README"]


def test_prepare_multiprocess_makes_a_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    path = prepare_multiprocess(workers=2)
    try:
        assert path is not None and os.path.isdir(path)
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == path
    finally:
        # Not monkeypatch.delenv: it would record the value set above and restore it.
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        if path:
            os.rmdir(path)


def test_served_with_two_workers_every_scrape_sees_every_request(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """``coherence-guard serve --workers 2``: whichever worker answers a scrape, it reports the
    requests both workers handled (each request and scrape on a fresh connection). The model is
    one the engine lists, so it keeps its own label."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GUARD_", "PROMETHEUS_"))}
    env.update(
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "mp"),
        GUARD_UPSTREAM_METRICS_INTERVAL="0",
        GUARD_LOG_LEVEL="warning",
    )
    args = ["serve", "--workers", "2", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", *args, "--upstream", fake_upstream.url],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        started = wait_healthy(base + "/health", alive=lambda: proc.poll() is None)
        assert started, "serve did not start"
        fake_upstream.script = Script(texts=["A short and healthy answer."])
        model = fake_upstream.script.model
        mp = tmp_path / "mp"
        n = 0
        # Fresh connections until both workers have handled requests (the kernel picks which
        # worker accepts; a counter file appears per worker pid on its first request).
        while n < 24 or len(list(mp.glob("counter_*.db"))) < 2:
            assert n < 400, "one worker took every connection"
            r = httpx.post(
                base + "/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                timeout=HANG_GUARD,
            )
            assert r.status_code == 200, r.text
            n += 1
        for _ in range(8):
            q = parse(httpx.get(base + "/metrics/quality", timeout=HANG_GUARD).content)
            gen = "guard_generations_total"
            assert value(q, gen, model=model, endpoint="chat", outcome="completed") == n
    finally:
        proc.terminate()
        try:
            proc.wait(HANG_GUARD)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
