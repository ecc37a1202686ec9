"""``coherence-guard serve`` and ``coherence-guard config`` as a user runs them."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.cli.serve import loopback
from tests.fakes.vllm import FakeVLLM, Script
from tests.net import HANG_GUARD, free_port, stop_process, wait_healthy

CLI = [sys.executable, "-m", "proxy"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUARD_")}
    env.update(extra)
    return env


def test_config_prints_the_effective_configuration_with_secrets_masked() -> None:
    env = _env(
        GUARD_API_KEYS='["sk-secret-1","sk-secret-2"]',
        GUARD_UPSTREAM_URL="http://user:hunter2@engine:8000",
        GUARD_MODE="monitor",
    )
    out = subprocess.run([*CLI, "config", "--json"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    values = json.loads(out.stdout)
    assert values["GUARD_MODE"] == "monitor"
    assert values["GUARD_API_KEYS"] == ["***", "***"]
    assert values["GUARD_UPSTREAM_URL"] == "http://user:***@engine:8000"
    assert "sk-secret" not in out.stdout and "hunter2" not in out.stdout
    lines = subprocess.run([*CLI, "config"], env=env, capture_output=True, text=True).stdout
    assert "GUARD_MODE=monitor" in lines.splitlines()


@pytest.mark.parametrize("command", [["config"], ["serve", "--port", "1"]])
def test_bad_configuration_exits_2_naming_the_variable(command: list[str]) -> None:
    out = subprocess.run(
        [*CLI, *command], env=_env(GUARD_MAX_TOKENS_CAP="lots"), capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "GUARD_MAX_TOKENS_CAP" in out.stderr
    assert "Traceback" not in out.stderr


BAD = [
    ({"GUARD_UPSTREAM_URL": "vllm:8000"}, "GUARD_UPSTREAM_URL='vllm:8000'", "http://vllm:8000"),
    ({"GUARD_LOG_LEVEL": "verbose"}, "GUARD_LOG_LEVEL='verbose'", "'critical'"),
    ({"GUARD_LANGUAGE": "english"}, "GUARD_LANGUAGE='english'", "did you mean en?"),
    ({"GUARD_API_KEYS": '["key1",'}, "GUARD_API_KEYS=(value hidden)", "k1,k2"),
    ({"GUARD_SAMPLING_DEFAULTS": "{x"}, "GUARD_SAMPLING_DEFAULTS='{x'", "JSON object"),
    (
        {"GUARD_MAX_TOKENS_DEFAULT": "40000"},
        "GUARD_MAX_TOKENS_DEFAULT=40000",
        "GUARD_MAX_TOKENS_CAP",
    ),
    ({"GUARD_ENTROPY_MAX_NATS": "low"}, "GUARD_ENTROPY_MAX_NATS='low'", "number"),
]


@pytest.mark.parametrize("command", ["config", "serve"])
@pytest.mark.parametrize(("env", "names", "allowed"), BAD, ids=[next(iter(b[0])) for b in BAD])
def test_every_bad_value_is_one_line_and_exit_2(
    command: str, env: dict[str, str], names: str, allowed: str, tmp_path: Path
) -> None:
    """Checked in the parent process, before uvicorn starts a worker: one line on stderr that
    names the variable, shows the value and says what is allowed; no traceback."""
    args = [command, "--port", str(free_port())] if command == "serve" else [command]
    out = subprocess.run(
        [*CLI, *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=HANG_GUARD,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("coherence-guard: invalid configuration: ")
    assert names in lines[0] and allowed in lines[0]
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_a_bad_flag_value_names_the_flag_too(tmp_path: Path) -> None:
    out = subprocess.run(
        [*CLI, "serve", "--log-level", "verbose"],
        env=_env(),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=HANG_GUARD,
    )
    assert out.returncode == 2
    assert "GUARD_LOG_LEVEL='verbose'" in out.stderr and "(from --log-level)" in out.stderr


def test_comma_separated_keys_are_accepted_and_masked(tmp_path: Path) -> None:
    out = subprocess.run(
        [*CLI, "config", "--json"],
        env=_env(GUARD_API_KEYS="key1,key2"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["GUARD_API_KEYS"] == ["***", "***"]
    assert "key1" not in out.stdout


def test_config_warns_about_a_misspelt_variable(tmp_path: Path) -> None:
    out = subprocess.run(
        [*CLI, "config"],
        env=_env(GUARD_MOD="monitor"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0
    assert "GUARD_MOD is not a setting (did you mean GUARD_MODE?)" in out.stderr
    assert "GUARD_MODE=enforce" in out.stdout.splitlines()


def test_config_explain_says_what_every_variable_does(tmp_path: Path) -> None:
    from proxy.cli.explain import meanings

    out = subprocess.run(
        [*CLI, "config", "--explain"],
        env=_env(GUARD_MODE="monitor", GUARD_API_KEYS="sk-secret"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "GUARD_MODE=monitor   (default enforce)" in text.splitlines()
    assert "sk-secret" not in text
    known = meanings()
    assert len(known) > 70
    for name, meaning in known.items():
        assert f"\n{name}=" in "\n" + text, name
        assert meaning.split()[0] in text
    # the meaning follows its variable, indented
    after = text.split("GUARD_MODE=monitor", 1)[1].splitlines()[1]
    assert after.startswith("    enforce: abort degenerate generations")


def test_serve_help_explains_the_modes_and_points_at_config_explain() -> None:
    out = subprocess.run([*CLI, "serve", "--help"], capture_output=True, text=True, env=_env())
    assert out.returncode == 0
    for word in ("enforce", "monitor", "off", "coherence-guard config --explain", "127.0.0.1:8000"):
        assert word in out.stdout


class _Stderr:
    """The lines a child process writes to stderr, read by a thread so the pipe never fills."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        stream.close()
        self._queue.put(None)  # the end of the pipe: nothing more will come

    def text(self) -> str:
        """What the process wrote so far, for a failure message."""
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is None:
                self._queue.put(None)
                break
            self.lines.append(line)
        return "\n".join(self.lines)

    def close(self) -> None:
        """After the process ended: the reader has seen the end of the pipe."""
        self._thread.join(HANG_GUARD)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = HANG_GUARD) -> str:
        """The first line that ``predicate`` accepts; ``timeout`` is a hang guard."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "not logged:\n" + "\n".join(self.lines)
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self._queue.put(None)  # for the next wait
                raise AssertionError("the process ended; not logged:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if predicate(line):
                return line


def _serve(args: list[str], cwd: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "serve", "--host", "127.0.0.1", *args],
        env=_env(GUARD_UPSTREAM_METRICS_INTERVAL="0", **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def _stop(proc: subprocess.Popen[str], err: _Stderr) -> None:
    proc.terminate()
    try:
        proc.wait(HANG_GUARD)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    err.close()  # the reader closes the pipe at its end


def test_serve_keeps_saying_the_engine_is_down_until_it_answers(
    tmp_path: Path,
) -> None:
    """An engine that does not answer is reported at start-up and at every check, and its
    return is reported too, with the models it serves."""
    port = free_port()
    engine_port = free_port()
    # The engine on a port of our own, given in the .env file (not the command line or the
    # environment: that is "given" too).
    (tmp_path / ".env").write_text(f"GUARD_UPSTREAM_URL=http://127.0.0.1:{engine_port}\n")
    proc = _serve(["--port", str(port)], tmp_path, GUARD_UPSTREAM_CHECK_INTERVAL="0.3")
    err = _Stderr(proc)
    try:
        report = err.wait_for(lambda line: "proxy.cli.serve: coherence-guard on" in line)
        assert f"engine http://127.0.0.1:{engine_port}" in report
        down = err.wait_for(lambda line: "does not answer" in line)
        assert "starting anyway: guarded requests get 502" in down and "WARNING" in down
        err.wait_for(lambda line: "still does not answer" in line)
        with FakeVLLM(port=engine_port) as fake:
            back = err.wait_for(lambda line: "answers again" in line)
            assert f"serves {fake.script.model}" in back
    finally:
        _stop(proc, err)


def test_serve_without_upstream_names_the_default(tmp_path: Path) -> None:
    port = free_port()
    proc = _serve(["--port", str(port)], tmp_path, GUARD_UPSTREAM_CHECK_INTERVAL="0")
    err = _Stderr(proc)
    try:
        report = err.wait_for(lambda line: "coherence-guard on" in line)
        assert "engine http://127.0.0.1:8000 (the default: neither --upstream nor " in report
        err.wait_for(lambda line: "engine at http://127.0.0.1:8000" in line)
    finally:
        _stop(proc, err)


def test_serve_reports_an_engine_that_answers_with_its_models(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    port = free_port()
    proc = _serve(["--port", str(port), "--upstream", fake_upstream.url], tmp_path)
    err = _Stderr(proc)
    try:
        report = err.wait_for(lambda line: "coherence-guard on" in line)
        assert "the default" not in report
        line = err.wait_for(lambda line: "answers" in line)
        assert f"(/health 200; serves {fake_upstream.script.model})" in line
    finally:
        _stop(proc, err)


def test_serve_json_logs_with_access_log_and_no_text_of_the_conversation(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """GUARD_LOG_FORMAT=json: every line from the parent and the workers uvicorn spawns
    (start-up, uvicorn, access, the guard's verdict) is a JSON object with the fixed fields; at
    debug level with the access log on, neither the prompt nor the completion appears."""
    loop = "the cat sat on the mat. " * 200
    fake_upstream.script = Script(texts=[loop])
    port = free_port()
    args = ["--port", str(port), "--upstream", fake_upstream.url, "--workers", "2"]
    proc = _serve(
        [*args, "--log-level", "debug"],
        tmp_path,
        GUARD_LOG_FORMAT="json",
        GUARD_ACCESS_LOG="true",
        GUARD_UPSTREAM_CHECK_INTERVAL="0",
    )
    err = _Stderr(proc)
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_healthy(base + "/health", alive=lambda: proc.poll() is None), err.text()
        prompt = "zebra-quartz-pineapple secret question"
        r = httpx.post(
            base + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": prompt}]},
            timeout=HANG_GUARD,
        )
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] != "stop"
        access = err.wait_for(lambda line: '"path":"/v1/chat/completions"' in line)
        assert json.loads(access)["status"] == 200
    finally:
        _stop(proc, err)
    err.wait_for(lambda line: "Stopping parent process" in line)
    records = [json.loads(line) for line in err.lines]
    for rec in records:
        assert {"ts", "level", "logger", "message", "request_id"} <= rec.keys()
    loggers = {rec["logger"] for rec in records}
    assert {"proxy.cli.serve", "uvicorn", "uvicorn.access", "coherence_guard"} <= loggers
    assert any("degenerate generation" in rec["message"] for rec in records)
    text = "\n".join(err.lines)
    assert "zebra-quartz" not in text and "cat sat" not in text


@pytest.fixture(params=[1, 2], ids=["1-worker", "2-workers"])
def served(fake_upstream: FakeVLLM, request: pytest.FixtureRequest) -> Iterator[str]:
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--upstream", fake_upstream.url]
    proc = subprocess.Popen(
        [*CLI, "serve", *args, "--workers", str(request.param)],
        env=_env(GUARD_UPSTREAM_METRICS_INTERVAL="0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(base + "/health", alive=lambda: proc.poll() is None):
            proc.kill()
            pytest.fail(proc.communicate()[1].decode(errors="replace") or "did not start")
        yield base
    finally:
        stop_process(proc)


def test_serve_relays_to_the_upstream_given_on_the_command_line(
    fake_upstream: FakeVLLM, served: str
) -> None:
    fake_upstream.script = Script(texts=["Served over the real command."])
    r = httpx.post(
        served + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Served over the real command."
    assert httpx.get(served + "/ready").status_code == 200
    metrics = httpx.get(served + "/metrics/quality")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")


def test_serve_with_workers_removes_the_metrics_directory_it_made(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """Several workers share counters through files in a temporary directory the proxy makes;
    stopping the server removes it (restarts would otherwise pile them up)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--upstream", fake_upstream.url]
    env = _env(GUARD_UPSTREAM_METRICS_INTERVAL="0", TMPDIR=str(tmp))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        [*CLI, "serve", *args, "--workers", "2"], env=env, stdout=subprocess.DEVNULL
    )
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_healthy(base + "/health", alive=lambda: proc.poll() is None)
        assert httpx.get(base + "/metrics").status_code == 200
        assert list(tmp.glob("coherence-guard-metrics-*"))
    finally:
        code = stop_process(proc)
    assert code == 0
    assert not list(tmp.glob("coherence-guard-metrics-*"))


def test_access_log_asked_for_is_written_at_warning_level(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """GUARD_LOG_LEVEL=warning silences the info lines, not the access log switched on."""
    port = free_port()
    proc = _serve(
        ["--port", str(port), "--upstream", fake_upstream.url],
        tmp_path,
        GUARD_LOG_LEVEL="warning",
        GUARD_ACCESS_LOG="true",
        GUARD_UPSTREAM_CHECK_INTERVAL="0",
    )
    err = _Stderr(proc)
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_healthy(base + "/health", alive=lambda: proc.poll() is None), err.text()
        line = err.wait_for(lambda line: "uvicorn.access" in line)
        assert '"GET /health HTTP/1.1" 200' in line
    finally:
        _stop(proc, err)
    others = [line for line in err.lines if " INFO " in line and "uvicorn.access" not in line]
    assert others == []


_DEAD_WORKER = """
from proxy.observability.metrics import Metrics
from proxy.observability.multiprocess import multiprocess_enabled
assert multiprocess_enabled()
m = Metrics()
m.stream_opened()
m.request_finished("/v1/chat/completions", 200, 0.1)
"""


def test_serve_with_one_worker_clears_a_previous_process_metrics_files(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """PROMETHEUS_MULTIPROC_DIR set by the operator (the Kubernetes manifests do, on an
    emptyDir that outlives a container restart) and one worker: what a dead process left
    there (a stream still open, a request counted) is not what the new process reports."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = _env(PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    # A previous process that recorded and then died without any clean-up.
    subprocess.run([sys.executable, "-c", _DEAD_WORKER], env=env, check=True)
    assert list(metrics_dir.glob("*.db"))
    port = free_port()
    proc = _serve(
        ["--port", str(port), "--upstream", fake_upstream.url, "--workers", "1"],
        tmp_path,
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        GUARD_UPSTREAM_CHECK_INTERVAL="0",
    )
    err = _Stderr(proc)
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_healthy(base + "/health", alive=lambda: proc.poll() is None), err.text()
        body = httpx.get(base + "/metrics").text
    finally:
        _stop(proc, err)
    assert "guard_proxy_streams_in_flight 0.0" in body.splitlines()
    assert 'route="/v1/chat/completions"' not in body
    # The operator's directory is kept (only one the proxy made itself is removed).
    assert metrics_dir.is_dir()


def _startup_report(host: str, engine: FakeVLLM, cwd: Path, env: dict[str, str]) -> list[str]:
    """What ``serve --host host`` logs up to the end of its start-up report (the engine's
    answer is its last line), in front of ``engine``."""
    proc = _serve(
        ["--port", str(free_port()), "--host", host, "--upstream", engine.url],
        cwd,
        GUARD_UPSTREAM_CHECK_INTERVAL="0",
        **env,
    )
    err = _Stderr(proc)
    try:
        err.wait_for(lambda line: "proxy.cli.serve: engine at" in line)
    finally:
        _stop(proc, err)
    return err.lines


OPEN_DOORS = [
    pytest.param({}, "GUARD_API_KEYS is not set, on 0.0.0.0", id="no-client-keys"),
    pytest.param(
        {"GUARD_UPSTREAM_API_KEY": "engine-key"},
        "GUARD_UPSTREAM_API_KEY is set and GUARD_API_KEYS is not, on 0.0.0.0",
        id="engine-key-without-client-keys",
    ),
]


@pytest.mark.parametrize(("env", "said"), OPEN_DOORS)
def test_serve_says_once_that_a_reachable_port_checks_no_client_key(
    env: dict[str, str], said: str, fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """``serve`` on an address other hosts can reach without GUARD_API_KEYS: whoever reaches
    the port is a client (with the engine's key, they use the operator's credential). Said at
    start-up in exactly one warning line that names the variable which closes it, never a
    secret; the report that ends the start-up (the engine answers) comes after it."""
    lines = _startup_report("0.0.0.0", fake_upstream, tmp_path, env)
    warnings = [line for line in lines if "WARNING" in line]
    assert len(warnings) == 1, lines
    assert said in warnings[0] and "Set GUARD_API_KEYS" in warnings[0]
    assert "engine-key" not in "\n".join(lines)


@pytest.mark.parametrize(
    ("host", "env"),
    [("0.0.0.0", {"GUARD_API_KEYS": "k1"}), ("127.0.0.1", {}), ("::1", {})],
    ids=["client-keys", "loopback-v4", "loopback-v6"],
)
def test_serve_says_nothing_of_keys_where_the_door_is_shut(
    host: str, env: dict[str, str], fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """Client keys checked, or an address only this host reaches: no warning about keys."""
    lines = _startup_report(host, fake_upstream, tmp_path, env)
    assert not [line for line in lines if "WARNING" in line], lines


@pytest.mark.parametrize(
    ("host", "reachable"),
    [
        ("127.0.0.1", False),
        ("127.8.9.10", False),
        ("localhost", False),
        ("::1", False),
        ("[::1]", False),
        ("0.0.0.0", True),
        ("::", True),
        ("10.1.2.3", True),
        ("proxy.example", True),
    ],
)
def test_only_loopback_addresses_count_as_shut(host: str, reachable: bool) -> None:
    assert loopback(host) is not reachable


def test_an_idle_client_connection_outlives_the_clients_own_pool_expiry(
    fake_upstream: FakeVLLM, tmp_path: Path
) -> None:
    """A client pool (httpx: 5 s) reuses a connection idle for a few seconds. Had the server
    closed it meanwhile (uvicorn's default: 5 s), the request written on it is lost: a reset,
    nothing in the proxy's log, nothing at the engine. A slow client loop (a stalled event
    loop) stretches those seconds past 5."""
    port = free_port()
    proc = _serve(["--port", str(port), "--upstream", fake_upstream.url], tmp_path)
    err = _Stderr(proc)
    try:
        assert wait_healthy(f"http://127.0.0.1:{port}/health")
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            first = b""
            while not first.endswith(b"}"):  # the whole answer: {"status":"ok"}
                first += sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200")
            time.sleep(6.5)
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                b"application/json\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
            )
            answer = b""
            with contextlib.suppress(ConnectionResetError):
                while b"\r\n\r\n" not in answer and (part := sock.recv(65536)):
                    answer += part
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert len(fake_upstream.guarded_requests()) == 1
    finally:
        _stop(proc, err)


def test_serve_help_names_every_guarded_route() -> None:
    out = subprocess.run([*CLI, "serve", "--help"], capture_output=True, text=True, env=_env())
    text = " ".join(out.stdout.split())
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"):
        assert route in text


def _startup_lines(proc: subprocess.Popen[str]) -> list[str]:
    err = _Stderr(proc)
    try:
        err.wait_for(lambda line: "Application startup complete" in line)
        return err.lines
    finally:
        _stop(proc, err)


def test_serve_warns_of_no_unguarded_route_without_an_engine(tmp_path: Path) -> None:
    lines = _startup_lines(
        _serve(["--port", str(free_port()), "--upstream", f"http://127.0.0.1:{free_port()}"],
               tmp_path)
    )  # fmt: skip
    assert not [line for line in lines if "unguarded" in line], lines


def test_serve_warns_of_the_unguarded_routes_this_engine_serves(tmp_path: Path) -> None:
    """Named from the engine's own /openapi.json (vLLM serves one): only those it has."""
    from tests.conftest import CannedEngine

    doc = json.dumps({"paths": {"/inference/v1/generate": {}, "/v1/models": {}}}).encode()
    engine = CannedEngine(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%b" % (len(doc), doc)
    )
    try:
        lines = _startup_lines(_serve(["--port", str(free_port()), "--upstream", engine.url],
                                      tmp_path))  # fmt: skip
    finally:
        engine.close()
    (warning,) = [line for line in lines if "unguarded" in line]
    assert "WARNING" in warning and "/inference/v1/generate" in warning
    assert "/v1/audio/transcriptions" not in warning and "/invocations" not in warning
