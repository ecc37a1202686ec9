"""``coherence-guard check`` against the fake vLLM over real sockets, directly and via the proxy."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import pytest

from proxy.cli import main
from proxy.cli.check import _sse_data
from tests.fakes.vllm import FakeVLLM, Script

FACTUAL = "The capital of France is Paris."
STORY = (
    "Every evening Marta climbed the ninety steps of the old lighthouse to light the lamp. "
    "One stormy night in October she found a green bottle wedged between the rocks below the "
    "tower. Inside was a letter written in faded ink by a sailor named Tomas, who had been "
    "shipwrecked on a tiny island forty years earlier. He wrote that he had survived by "
    "catching fish and collecting rain, and that he watched her beam sweep the horizon every "
    "night, hoping someone would come. Marta showed the letter to the harbour master, who "
    "laughed at first, then grew quiet when he recognised the name of his own grandfather. "
    "Together they sailed north at dawn, following the coordinates scrawled along the margin. "
    "They found only a stone hut, a carved calendar and a second bottle, addressed to whoever "
    "kept the light."
)
CODE = (
    "```python\n"
    "def fibonacci(n):\n"
    '    """Return the n-th Fibonacci number, computed iteratively."""\n'
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n"
    "```"
)
LOOP = "The keeper climbed the stairs and lit the lamp again. " * 60


def healthy_scripts() -> list[Script]:
    return [Script(texts=[FACTUAL]), Script(texts=[STORY]), Script(texts=[CODE])]


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_healthy_deployment_exits_0_with_report(
    fake_upstream: FakeVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three coherent answers: exit 0, each answer previewed, one coherent row per tier."""
    fake_upstream.scripts = healthy_scripts()
    code, out, _ = run_check(capsys, "--url", fake_upstream.url)
    assert code == 0
    assert "(model fake-model)" in out  # discovered from /v1/models
    assert "[1] factual: The capital of France is Paris." in out
    assert "[2] story: Every evening Marta climbed" in out
    preview = out.split("[2] story: ", 1)[1].split("\n", 1)[0]
    assert len(preview) == 201 and preview.endswith("…")  # first 200 characters
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line[:5] in TIER_ROWS}
    assert [rows[t][1] for t in ("factual", "story", "code")] == ["coherent"] * 3
    assert all(rows[t][2] == "stop" for t in rows)
    assert "all tiers coherent" in out

    chats = [r.json for r in fake_upstream.requests if r.path == "/v1/chat/completions"]
    assert [c["max_tokens"] for c in chats] == [200, 700, 500]
    assert all(c["temperature"] == 0 and c["model"] == "fake-model" for c in chats)
    assert "capital of France" in chats[0]["messages"][0]["content"]


TIER_ROWS = ("factu", "story", "code ")


def test_looping_tier_exits_1_and_closes_its_stream(
    fake_upstream: FakeVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    """A looping story is judged by the detector; check stops reading and hangs up at once."""
    fake_upstream.scripts = [
        Script(texts=[FACTUAL]),
        Script(texts=[LOOP], finish_reason="length", chunk_delay=0.002),
        Script(texts=[CODE]),
    ]
    code, out, _ = run_check(capsys, "--url", fake_upstream.url, "--model", "fake-model")
    assert code == 1
    story_row = next(line for line in out.splitlines() if line.startswith("story "))
    assert "DEGENERATE" in story_row and "detector:" in story_row
    assert "1 of 3 tiers not coherent" in out
    story_request = [r for r in fake_upstream.requests if r.path == "/v1/chat/completions"][1]
    assert story_request.disconnected is not None
    assert not story_request.completed
    assert story_request.chunks_sent < len(LOOP.split())


def test_answer_failing_tier_check_exits_1(
    fake_upstream: FakeVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    """No loop, but the factual answer is wrong: the tier fails its check."""
    wrong = Script(texts=["The capital of France is Lyon."])
    fake_upstream.scripts = [wrong, *healthy_scripts()[1:]]
    code, out, _ = run_check(capsys, "--url", fake_upstream.url, "--model", "fake-model")
    assert code == 1
    factual_row = next(line for line in out.splitlines() if line.startswith("factual "))
    assert "FAILED" in factual_row and 'does not mention "Paris"' in factual_row


def test_unparsable_code_fails_the_code_tier(
    fake_upstream: FakeVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_upstream.scripts = [
        *healthy_scripts()[:2],
        Script(texts=['def fibonacci(n):\n    """Doc."""\n    for i in range(n)\n        pass']),
    ]
    code, out, _ = run_check(capsys, "--url", fake_upstream.url, "--model", "m")
    assert code == 1
    assert "code does not parse" in out


def test_length_finish_is_degenerate(
    fake_upstream: FakeVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    """A story that runs to max_tokens did not finish on its own."""
    fake_upstream.scripts = [
        Script(texts=[FACTUAL]),
        Script(texts=[STORY], finish_reason="length"),
        Script(texts=[CODE]),
    ]
    code, out, _ = run_check(capsys, "--url", fake_upstream.url, "--model", "m")
    assert code == 1
    assert "ran to max_tokens" in out


def test_unreachable_server_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    code, out, err = run_check(capsys, "--url", url)
    assert code == 2
    assert out == ""
    assert f"cannot check {url}" in err and "ConnectError" in err


def test_server_error_exits_2(fake_upstream: FakeVLLM, capsys: pytest.CaptureFixture[str]) -> None:
    """A server that answers but cannot complete is not a deployment to trust either."""
    fake_upstream.script = Script(status=500, error_body=b'{"error":{"message":"boom"}}')
    code, _, err = run_check(capsys, "--url", fake_upstream.url, "--model", "m")
    assert code == 2
    assert "HTTP 500" in err


def test_extra_body_and_api_key_reach_the_server(
    fake_upstream: FakeVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_upstream.scripts = healthy_scripts()
    code, _, _ = run_check(
        capsys,
        "--url",
        fake_upstream.url + "/v1/",
        "--model",
        "m",
        "--api-key",
        "sk-test",
        "--extra-body",
        '{"repetition_penalty": 1.1}',
    )
    assert code == 0
    chats = [r for r in fake_upstream.requests if r.path == "/v1/chat/completions"]
    assert all(r.json["repetition_penalty"] == 1.1 for r in chats)
    assert all(r.headers.get("authorization") == "Bearer sk-test" for r in chats)


def test_json_output(fake_upstream: FakeVLLM, capsys: pytest.CaptureFixture[str]) -> None:
    fake_upstream.scripts = healthy_scripts()
    code, out, _ = run_check(capsys, "--url", fake_upstream.url, "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["model"] == "fake-model"
    assert [t["name"] for t in payload["tiers"]] == ["factual", "story", "code"]
    assert payload["tiers"][0]["text"] == FACTUAL
    assert all(t["verdict"] == "coherent" for t in payload["tiers"])


def test_through_the_proxy_healthy_exits_0(
    fake_upstream: FakeVLLM,
    proxy_server: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake_upstream.scripts = healthy_scripts()
    code, out, _ = run_check(capsys, "--url", proxy_server())
    assert code == 0, out
    assert "[3] code: ```python def fibonacci(n):" in out


def test_through_the_proxy_guard_abort_exits_1(
    fake_upstream: FakeVLLM,
    proxy_server: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Behind the proxy the loop is cut by the guard: its finish reason marks the tier."""
    fake_upstream.scripts = [
        Script(texts=[FACTUAL]),
        Script(texts=[LOOP], finish_reason="length", chunk_delay=0.002),
        Script(texts=[CODE]),
    ]
    code, out, _ = run_check(capsys, "--url", proxy_server(), "--model", "fake-model")
    assert code == 1
    story_row = next(line for line in out.splitlines() if line.startswith("story "))
    assert "DEGENERATE" in story_row and "content_filter" in story_row
    assert "the proxy's guard aborted it" in story_row


@pytest.mark.parametrize(
    "pieces",
    [
        [b'data: {"a":1}\n\ndata: [DONE]\n\n'],
        [b'data: {"a":1}\r', b"\n\r\ndata: [DONE]\r\n\r\n"],
        [b'data: {"a', b'":1}\rdata: [DONE]\r'],
    ],
    ids=["lf", "crlf-split", "cr"],
)
def test_sse_lines_split_on_cr_lf_crlf_only(pieces: list[bytes]) -> None:
    assert list(_sse_data(iter(pieces))) == [b'{"a":1}', b"[DONE]"]


def test_sse_line_separator_inside_json_is_not_a_line_break() -> None:
    """vLLM writes non-ASCII unescaped, so U+2028 can appear inside a data line."""
    payload = '{"c":"a\u2028b\u0085c"}'.encode()
    assert list(_sse_data(iter([b"data: " + payload[:5], payload[5:] + b"\n\n"]))) == [payload]


def test_invalid_detector_setting_is_reported_before_connecting(
    fake_upstream: FakeVLLM, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """check judges with the proxy's GUARD_* thresholds, so a bad one is named, not ignored."""
    monkeypatch.setenv("GUARD_REPETITION_MIN_REPEATS", "many")
    code, out, err = run_check(capsys, "--url", fake_upstream.url)
    assert code == 2 and out == ""
    assert "GUARD_REPETITION_MIN_REPEATS" in err
    assert fake_upstream.requests == []
