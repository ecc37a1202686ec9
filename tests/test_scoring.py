"""``coherence-guard score`` end to end: a real subprocess over real JSONL files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.scoring import split_deltas

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "detect" / "sample.jsonl"


def _score(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.scoring", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )


def test_split_deltas_reassembles_the_text() -> None:
    text = "Hello,  world!\n\n你好世界，这是一个很长的句子。 end "
    deltas = list(split_deltas(text))
    assert "".join(deltas) == text
    assert all(len(d) <= 12 for d in deltas)


def test_score_writes_one_verdict_line_per_text(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = _score(str(SAMPLE), "-o", str(out))
    assert result.returncode == 0, result.stderr
    inputs = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    outputs = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [o["id"] for o in outputs] == [i["id"] for i in inputs]
    for o in outputs:
        assert set(o) == {"id", "degenerate", "signal", "score", "fired_at_char", "onset_char"}
        if o["degenerate"]:
            assert isinstance(o["signal"], str) and o["fired_at_char"] >= o["onset_char"] >= 0
        else:
            assert o["signal"] is None and o["fired_at_char"] is None


def test_summary_prints_precision_recall_and_delay() -> None:
    result = _score(str(SAMPLE), "--summary")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["group", "n", "deg"]
    overall = next(line for line in lines if line.startswith("overall")).split()
    assert overall[1] == str(len(SAMPLE.read_text(encoding="utf-8").splitlines()))
    assert any(line.startswith("kind=code") for line in lines)
    assert any(line.startswith("degen_type=repetition-loop") for line in lines)
    assert any(line.startswith("lang=") for line in lines)
    assert "detection delay after onset" in lines[-1]


def test_stdin_and_unlabelled_input() -> None:
    lines = [
        {"id": "loop", "text": "Sure. " + "I will try again. " * 60},
        {"id": "fine", "text": "A short and perfectly ordinary answer."},
    ]
    result = _score("-", stdin="".join(json.dumps(x) + "\n" for x in lines))
    assert result.returncode == 0, result.stderr
    verdicts = {o["id"]: o for o in map(json.loads, result.stdout.splitlines())}
    assert verdicts["loop"]["degenerate"] is True
    assert verdicts["loop"]["signal"] == "repetition"
    assert verdicts["fine"]["degenerate"] is False


def test_summary_without_labels_says_so() -> None:
    result = _score("-", "--summary", stdin='{"id": "a", "text": "hello there"}\n')
    assert result.returncode == 0
    assert "no labelled lines" in result.stdout


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("not json\n", "line 1: not JSON"),
        ('{"id": "x"}\n', "without a string 'text'"),
        ("[1, 2]\n", "not a JSON object"),
    ],
)
def test_bad_input_fails_with_a_message(payload: str, message: str) -> None:
    result = _score("-", stdin=payload)
    assert result.returncode == 2
    assert message in result.stderr


def test_missing_file_and_bad_config(tmp_path: Path) -> None:
    result = _score(str(tmp_path / "absent.jsonl"))
    assert result.returncode == 2 and "cannot read" in result.stderr
    env_result = subprocess.run(
        [sys.executable, "-m", "proxy.scoring", str(SAMPLE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"GUARD_WINDOW_CHARS": "lots", "PATH": "/usr/bin:/bin"},
        timeout=120,
        check=False,
    )
    assert env_result.returncode == 2 and "GUARD_WINDOW_CHARS" in env_result.stderr


def test_the_cli_sub_command_is_the_same_code_path(tmp_path: Path) -> None:
    """``coherence-guard score`` (python -m proxy.cli score) gives identical output."""
    direct = _score(str(SAMPLE))
    via_cli = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "score", str(SAMPLE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert via_cli.returncode == 0, via_cli.stderr
    assert via_cli.stdout == direct.stdout
