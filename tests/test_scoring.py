"""``coherence-guard score`` end to end: a real subprocess over real JSONL files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli.score import split_deltas
from tests.net import HANG_GUARD

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "detect" / "sample.jsonl"


def _score(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli.score", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=HANG_GUARD,
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
    assert any("detection delay after onset" in line for line in lines)


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


def test_summary_without_labels_says_so_and_nothing_else() -> None:
    """Only the message: a table of zeros after it would say nothing more."""
    result = _score("-", "--summary", stdin='{"id": "a", "text": "hello there"}\n')
    assert result.returncode == 0
    assert result.stdout == "no labelled lines: nothing to summarise\n"


def test_a_plain_text_file_is_pointed_to_explain(tmp_path: Path) -> None:
    """A file whose first line is not JSON is no JSON Lines file: the one-line error names the
    command that judges one answer in a text file, with the file's name ready to paste. A
    broken line further down is only that."""
    answer = tmp_path / "my answer.txt"
    answer.write_text("Paris is the capital of France.\nIt is on the Seine.\n", encoding="utf-8")
    result = _score(str(answer))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"coherence-guard score: {answer}: line 1: not JSON (Expecting value): score reads JSON "
        'Lines (one {"text": ...} object per line); to judge one answer in a text file: '
        f"coherence-guard explain '{answer}'"
    ]
    later = _score("-", stdin='{"text": "A fine answer."}\nnot json\n')
    assert later.returncode == 2 and "explain" not in later.stderr


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
        [sys.executable, "-m", "proxy.cli.score", str(SAMPLE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"GUARD_WINDOW_CHARS": "lots", "PATH": "/usr/bin:/bin"},
        timeout=HANG_GUARD,
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
        timeout=HANG_GUARD,
        check=False,
    )
    assert via_cli.returncode == 0, via_cli.stderr
    assert via_cli.stdout == direct.stdout


def _token_row(text_tokens: list[str], logprob: float, **extra: object) -> dict[str, object]:
    return {
        "id": "t",
        "text": "".join(text_tokens),
        "tokens": text_tokens,
        "token_logprobs": [logprob] * len(text_tokens),
        "top_logprobs": [{t: logprob, " other": -30.0} for t in text_tokens],
        **extra,
    }


def test_rows_with_engine_tokens_are_fed_as_those_tokens_with_their_logprobs() -> None:
    """The entropy signal only fires on logprobs: a certain (logprob 0) loop fed as the engine's
    tokens reaches it, the same text fed as words does not carry any."""
    from proxy.cli.score import score_rows, token_stream
    from proxy.detect import DetectorConfig

    tokens = [" the", " same", " words"] * 200
    row = _token_row(tokens, 0.0)
    pairs = token_stream(row)
    assert pairs is not None and [p[0] for p in pairs] == tokens
    entry = pairs[0][1][0]  # type: ignore[index]
    assert entry["logprob"] == 0.0 and entry["top_logprobs"][0] == {"token": " the", "logprob": 0.0}
    only_entropy = DetectorConfig(
        repetition=False, ngram=False, diversity=False, compression=False, end_judgement=False
    )
    with_tokens = next(score_rows([row], config=only_entropy))
    assert with_tokens.signal == "entropy-collapse"
    as_words = next(score_rows([{"id": "t", "text": row["text"]}], config=only_entropy))
    assert not as_words.degenerate


def test_tokens_that_do_not_spell_the_text_fall_back_to_words() -> None:
    from proxy.cli.score import token_stream

    assert token_stream({"text": "abc", "tokens": ["a", "b"]}) is None
    assert token_stream({"text": "abc"}) is None
    chat_format = {"text": "ab", "tokens": ["a", "b"], "token_logprobs": [-0.1, None],
                   "top_logprobs": [[{"token": "a", "logprob": -0.1}], None]}  # fmt: skip
    pairs = token_stream(chat_format)
    assert pairs is not None and pairs[1] == ("b", None)
    assert pairs[0][1] == [{"token": "a", "logprob": -0.1,
                            "top_logprobs": [{"token": "a", "logprob": -0.1}]}]  # fmt: skip


def test_summary_shows_each_signal_at_three_threshold_settings() -> None:
    result = _score(str(SAMPLE), "--summary")
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("per signal")[1].splitlines()[2:]
    settings = {line.split()[0] for line in table if line.strip()}
    assert settings == {"sensitive", "default", "strict"}
    totals = {line.split()[0]: line.split() for line in table if line.split()[1:2] == ["all"]}
    # More evidence asked, fewer verdicts: the strict setting never fires more than sensitive.
    assert int(totals["strict"][2]) <= int(totals["default"][2]) <= int(totals["sensitive"][2])


def test_scaled_config_asks_for_more_evidence_above_one() -> None:
    from proxy.cli.score import scaled_config
    from proxy.detect import DetectorConfig

    base = DetectorConfig()
    strict = scaled_config(base, 1.25)
    assert strict.repetition_min_repeats > base.repetition_min_repeats
    assert strict.diversity_min_ratio < base.diversity_min_ratio
    assert strict.language_min_confidence <= 0.99
    assert isinstance(strict.repetition_min_span_chars, int)


def test_prompt_language_only_ignores_a_documents_lang() -> None:
    """A proxy knows the request's language, never a document's: with the flag, a row's
    ``lang`` is not passed to the detector, its ``prompt_language`` is."""
    from proxy.cli.score import expected_language_of

    doc = {"text": "x", "lang": "pt"}
    asked = {"text": "x", "lang": "pt", "prompt_language": "it"}
    assert expected_language_of(doc) == "pt"
    assert expected_language_of(doc, keys=("prompt_language",)) is None
    assert expected_language_of(asked, keys=("prompt_language",)) == "it"
    result = _score(str(SAMPLE), "--summary", "--no-sweep", "--prompt-language-only")
    assert result.returncode == 0, result.stderr
    assert "default" in result.stdout and "sensitive" not in result.stdout


def test_score_reads_gzip_compressed_jsonl(tmp_path: Path) -> None:
    import gzip

    packed = tmp_path / "in.jsonl.gz"
    packed.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    plain, zipped = _score(str(SAMPLE)), _score(str(packed))
    assert zipped.returncode == 0, zipped.stderr
    assert zipped.stdout == plain.stdout and zipped.stdout
