"""Build the block-loop set: long real generations that loop while changing their words.

Two steps, both resumable:

``generate``
    Starts llama.cpp's server (the ``xllamacpp`` wheel, from the manifest
    ``scripts/prepare-e2e.sh`` wrote, as ``build_realgen.py`` does) and asks
    SmolLM2-135M-Instruct each coding and math prompt of :data:`PROMPTS` at several sampling
    temperatures with a long ``max_tokens``, several requests at a time, until every job is
    done or ``--budget`` seconds have passed. Answers are stored verbatim (text,
    ``finish_reason``, settings) in ``blockloops-raw.jsonl`` (not in git).

``label``
    Applies the onset rule (:func:`onset_of`, written out in ``BLOCKLOOPS.md``) to every raw
    answer and writes ``blockloops.jsonl.gz`` in the format ``coherence-guard score`` reads:
    degenerate answers with their onset, and the answers that ended by themselves with no
    recurring block as ``healthy``; the rest is ``unsure``. Every line keeps its ``split``
    (``dev`` or ``held-out``, by a hash of its id), so thresholds are judged on ``dev`` and
    reported on both.

Run (niced: the machine is shared)::

    nice -n 19 python bench/data/build_blockloops.py generate --parallel 4 --budget 1200
    python bench/data/build_blockloops.py label
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from blockloops_prompts import (  # noqa: E402
    PENALTY_PROMPTS,
    PENALTY_SETTINGS,
    PENALTY_STOP_SETTINGS,
)
from build_realgen import _manifest  # noqa: E402

RAW = HERE / "blockloops-raw.jsonl"
OUT = HERE / "blockloops.jsonl.gz"

#: Coding and math prompts that invite templated code, restated doubts and redone steps.
PROMPTS: dict[str, str] = {
    "powers": "Write Python code that precomputes prefix sums of A[i]**k for every k from 1 to "
    "32 for an array A, one array per power, and explain each step.",
    "cases": "Write a C function that converts a month number (1-12) to its name with a switch "
    "statement, then write unit tests for every month.",
    "dp": "Solve this competitive programming problem in C++: given N up to 100000 and an "
    "array, count the subarrays whose sum is divisible by K. Explain your reasoning, handle "
    "all edge cases and be careful about overflow.",
    "grid": "Write a Python program that fills a 10x10 grid where each cell (i, j) holds "
    "i*j, prints it, and then computes the sum of each row and each column separately.",
    "bits": "Write a Java method that counts the set bits of each of 16 registers r0 to r15 "
    "and stores the counts in variables count0 to count15.",
    "proof": "Prove step by step that the sum of the first n odd numbers is n squared. Check "
    "every step carefully and think again if anything is unclear.",
    "equation": "Solve for x: 3x + 7 = 2(x - 4) + 15. Show every step, verify the answer, and "
    "if the verification fails, think again.",
    "primes": "Is 9991 a prime number? Reason step by step, trying every divisor, and double "
    "check your work.",
    "series": "Compute the sum 1/(1*2) + 1/(2*3) + ... + 1/(99*100). Think step by step and "
    "re-examine your reasoning before you answer.",
    "sql": "Write SQL migrations that create tables users, orders, products, payments, "
    "reviews and shipments, each with an id, timestamps and foreign keys, then add indexes.",
    "enum": "Write a Rust enum of the 20 amino acids with a method that returns the "
    "three-letter code, the one-letter code and the mass of each one.",
    "parser": "Write a tokenizer in JavaScript for arithmetic expressions with + - * / and "
    "parentheses, with comments explaining every design decision and its trade-offs.",
    "matrix": "Write C code that multiplies two 4x4 matrices with the loops fully unrolled, "
    "then explain why unrolling helps.",
    "probability": "Two dice are rolled. What is the probability that the sum is 7 or 11? "
    "Reason carefully, list all cases, and reconsider your answer before giving it.",
    "fizzbuzz": "Write FizzBuzz in Python for 1 to 100, then rewrite it three different ways "
    "and compare them.",
    "sort": "Implement merge sort in Python, then explain its complexity, then handle the edge "
    "cases of empty lists, one element and duplicates, with tests.",
    "triangle": "A triangle has sides 7, 24 and 25. Is it a right triangle? Find its area, its "
    "inradius and its circumradius. Verify each result a second way.",
    "config": "Write a Kubernetes YAML with a Deployment, a Service and a ConfigMap for each of "
    "five microservices named auth, cart, catalog, payment and shipping.",
    "recursion": "Explain recursion with the Fibonacci sequence: compute fib(1) to fib(20) by "
    "hand, showing how each value comes from the two before it.",
    "speed": "A train leaves at 3 pm at 60 km/h and another at 4 pm at 80 km/h on the same "
    "track. When does the second catch up? Think it through and check your reasoning again.",
}

#: Prompts that ask for long enumerations, where a small model's answer runs on (the second
#: round: at these temperatures the first round's answers all ended by themselves).
LONG_PROMPTS: dict[str, str] = {
    "tests50": "Write 50 separate pytest test functions for a function add(a, b), each with "
    "different numbers and a comment explaining what it checks.",
    "squares": "For every number from 1 to 100, write one Python line that prints its square "
    "and a comment saying why the result is correct.",
    "methods": "Write a Python class Calculator with 40 methods, one per operation, each with a "
    "docstring and an example.",
    "powers2": "Write C code that defines variables pow_2_1 to pow_2_64 holding 2 to the power "
    "of each exponent, one line per variable, each with its own comment.",
    "months": "Write a Java switch statement over all 12 months that prints the number of days "
    "and the season of each month, with a comment on each case.",
    "reason": "Think step by step about whether 0.999... equals 1. After each step, question "
    "your reasoning, then think again and re-check every step until you are certain.",
    "collatz": "Compute the Collatz sequence of 27 step by step, explaining every step in a "
    "full sentence.",
    "table": "Write a SQL script that inserts 60 rows into a table products, each row with an "
    "id, a name, a price and a comment explaining the price.",
    "edge": "Write a Python function that parses a date string. Before writing it, discuss at "
    "length every edge case and whether it should be handled, weighing both sides each time.",
    "derive": "Derive the quadratic formula, then re-derive it a second way, then check both "
    "derivations line by line, then explain any doubts you still have.",
}

#: The third round: raw continuations (``/v1/completions``, no chat template) of openings of
#: code and reasoning, which is where a small model runs on to the token limit. Only the
#: continuation is stored and judged; the opening is the row's ``prompt``.
OPENINGS: dict[str, str] = {
    "o-powers": "# Prefix sums of A[i]**k, one array per power k\nN = len(A)\n"
    "sum_B_1 = [0] * (N + 1)\nfor i in range(N):\n    sum_B_1[i + 1] = sum_B_1[i] + A[i]\n",
    "o-switch": "switch (month) {\n    case 1:\n        // January has 31 days\n"
    "        days = 31;\n        break;\n",
    "o-tests": "import pytest\n\n\ndef test_add_small_numbers():\n"
    "    # two small positive numbers\n    assert add(1, 2) == 3\n",
    "o-edge": "def parse(s):\n    # First, handle the empty string. But for correctness we "
    "should also think about whitespace.\n",
    "o-reason": "Question: Is 1001 a prime number?\nAnswer: Let's think step by step.\n"
    "1001 is odd, so it is not divisible by 2.\n",
    "o-proof": "We want to prove that the sum of the first n odd numbers is n^2.\n"
    "Step 1: For n = 1, the sum is 1 = 1^2.\n",
    "o-sql": "-- Migration 001: create the users table\nCREATE TABLE users (\n"
    "    id SERIAL PRIMARY KEY,\n    name TEXT NOT NULL\n);\n\n",
    "o-essay": "The history of the printing press is a story of ideas spreading faster than "
    "ever before. ",
}

#: (setting name, sampling fields): temperatures 0.6 to 1.0.
SETTINGS: dict[str, dict[str, Any]] = {
    "t06": {"temperature": 0.6, "top_p": 0.95, "seed": 3},
    "t08": {"temperature": 0.8, "top_p": 0.95, "seed": 5},
    "t10": {"temperature": 1.0, "top_p": 0.95, "seed": 7},
}
#: The second round's settings: the same temperatures with the tail cut (top-k), which is
#: how many servers sample.
LONG_SETTINGS: dict[str, dict[str, Any]] = {
    "k06": {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "seed": 13},
    "k07": {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "seed": 17},
    "k08": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 19},
}
OPENING_SETTINGS: dict[str, dict[str, Any]] = {
    "c06": {"temperature": 0.6, "top_k": 40, "top_p": 0.95, "seed": 23},
    "c08": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 29},
    "c10": {"temperature": 1.0, "top_k": 40, "top_p": 0.95, "seed": 31},
}
#: The fourth round: the model's end-of-sequence token ignored (``ignore_eos``), as when an
#: engine's stop handling fails or a model never learnt to stop: every answer runs to the
#: token limit, which is what a runaway generation is. Coding and math prompts of both rounds.
RUNAWAY_PROMPTS: dict[str, str] = {
    k: {**PROMPTS, **LONG_PROMPTS}[k]
    for k in ("powers", "cases", "dp", "proof", "equation", "primes", "sql", "parser",
              "tests50", "methods", "reason", "edge", "derive", "months", "bits", "series")
}  # fmt: skip
RUNAWAY_SETTINGS: dict[str, dict[str, Any]] = {
    "e06": {"temperature": 0.6, "top_k": 40, "top_p": 0.95, "seed": 37, "ignore_eos": True},
    "e08": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 41, "ignore_eos": True},
    "e07": {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "seed": 43, "ignore_eos": True},
}
MAX_TOKENS = 2048


def _start_llama(
    port: int, threads: int, parallel: int, max_tokens: int
) -> subprocess.Popen[bytes]:
    """The end-to-end tests' llama.cpp server, with room for ``parallel`` long answers."""
    argv = [part.replace("{port}", str(port)) for part in _manifest()["llamacpp"]["command"]]
    ctx = parallel * (max_tokens + 512)  # llama.cpp splits its context between the slots
    argv += ["--threads", str(threads), "--parallel", str(parallel), "--ctx-size", str(ctx)]
    log = (HERE / ".blockloops-server.log").open("wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=HERE.parent.parent)


def generate(
    port: int, threads: int, parallel: int, budget: float, max_tokens: int, round_name: str
) -> None:
    import httpx

    # Interleaved (prompt i at setting i mod 3 first), so a run stopped by its budget still
    # covers every prompt and every temperature.
    prompts, settings = {
        "chat": (PROMPTS, SETTINGS),
        "long": (LONG_PROMPTS, LONG_SETTINGS),
        "openings": (OPENINGS, OPENING_SETTINGS),
        "runaway": (RUNAWAY_PROMPTS, RUNAWAY_SETTINGS),
        "penalty": (PENALTY_PROMPTS, PENALTY_SETTINGS),
        "penalty-stop": (PENALTY_PROMPTS, PENALTY_STOP_SETTINGS),
    }[round_name]
    names = list(settings)
    picks = [
        (pid, names[(i + round_) % len(names)])
        for round_ in range(len(names))
        for i, pid in enumerate(prompts)
    ]
    jobs = [(f"blockloop-{pid}-{name}", pid, name) for pid, name in picks]
    done = {row["id"] for row in _raw_rows()}
    todo = [job for job in jobs if job[0] not in done]
    print(f"{len(jobs)} jobs, {len(done)} done, {len(todo)} to run", flush=True)
    if not todo:
        return
    server = _start_llama(port, threads, parallel, max_tokens)

    def stop(*_: object) -> None:
        server.kill()
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, stop)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + budget
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise SystemExit("llama.cpp server did not start; see .blockloops-server.log")
            time.sleep(0.5)
        lock = threading.Lock()
        with httpx.Client(base_url=url, timeout=3000) as client, RAW.open("a") as out:

            def run(job: tuple[str, str, str]) -> None:
                if time.monotonic() > deadline:
                    return  # the budget is spent: what is left waits for the next run
                row = _generate_one(client, *job, max_tokens)
                with lock:
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    out.flush()
                print(job[0], row["finish_reason"], len(row["text"]), row["seconds"], flush=True)

            with ThreadPoolExecutor(parallel) as pool:
                for _ in pool.map(run, todo):
                    pass
    finally:
        server.terminate()
        server.wait(timeout=10)


def _generate_one(client: Any, key: str, pid: str, setting: str, max_tokens: int) -> dict[str, Any]:
    prompt = {**PROMPTS, **LONG_PROMPTS, **OPENINGS, **PENALTY_PROMPTS}[pid]
    sampling = {
        **SETTINGS,
        **LONG_SETTINGS,
        **OPENING_SETTINGS,
        **RUNAWAY_SETTINGS,
        **PENALTY_SETTINGS,
        **PENALTY_STOP_SETTINGS,
    }[setting]
    body: dict[str, Any] = {
        "model": _manifest()["served_model_name"],
        "max_tokens": max_tokens,
        "repeat_penalty": 1.0,
        **sampling,
    }
    opening = pid in OPENINGS
    if opening:
        body["prompt"] = prompt
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
    started = time.monotonic()
    reply = client.post("/v1/completions" if opening else "/v1/chat/completions", json=body)
    reply.raise_for_status()
    choice = reply.json()["choices"][0]
    text = (choice.get("text") if opening else choice["message"].get("content")) or ""
    return {
        "id": key,
        "engine": "llama.cpp (xllamacpp), SmolLM2-135M-Instruct Q4_1",
        "prompt_id": pid,
        "prompt": prompt,
        "setting": setting,
        "sampling": sampling,
        "max_tokens": max_tokens,
        "finish_reason": choice.get("finish_reason"),
        "endpoint": "completions" if opening else "chat",
        "text": text,
        "seconds": round(time.monotonic() - started, 2),
    }


# -- the onset rule -------------------------------------------------------------------------

_UNIT = re.compile(r"[^\n.!?]+(?:[.!?]+|$)", re.MULTILINE)
_WORD = re.compile(r"[^\W\d_]{2,}")
_DIGITS = re.compile(r"\d+")
_OPERATOR_RUN = re.compile(r"(\s*([-+*/%&|^,])\s*[\w.]+)(?:\s*\2\s*[\w.]+)+")
#: Units ahead in which a unit's normalised form must recur.
K = 16
#: Contentful units in the window that opens the loop, and the share of them that must recur.
W, OPEN_SHARE = 8, 0.75
#: Share of recurring units every later window of W must keep, to the end of the answer.
KEEP_SHARE = 0.5


def normalise(unit: str) -> str:
    """A unit's normalised form: case folded, numbers (and so identifiers' numeric suffixes)
    masked, a run of one operator with its operands collapsed, whitespace collapsed."""
    text = _DIGITS.sub("0", unit.lower())
    text = _OPERATOR_RUN.sub(r"\1", text)
    return " ".join(text.split())


def _units(text: str) -> list[tuple[int, str]]:
    """The contentful units (start, normalised form): lines, and sentences inside lines, that
    hold 3 words of 2+ letters."""
    return [
        (m.start(), normalise(m.group()))
        for m in _UNIT.finditer(text)
        if len(_WORD.findall(m.group())) >= 3
    ]


def _loop_start(units: list[tuple[int, str]], recurs: list[bool]) -> int | None:
    """The first recurring unit that opens a window of W units of which >= 75 % recur, such
    that every later window keeps >= 50 % recurring to the end of the answer."""
    n = len(units)
    if n < W:
        return None
    share = [sum(recurs[i : i + W]) / W for i in range(n - W + 1)]
    # keep[i]: every window from i on keeps KEEP_SHARE (the loop lasts to the end).
    keep = [False] * len(share)
    ok = True
    for i in range(len(share) - 1, -1, -1):
        ok = ok and share[i] >= KEEP_SHARE
        keep[i] = ok
    for i in range(len(share)):
        if recurs[i] and share[i] >= OPEN_SHARE and keep[i]:
            return units[i][0]
    return None


def onset_of(text: str) -> int | None:
    """The rule: units are lines, and sentences inside lines; a unit is *contentful* when it
    holds 3 words of 2+ letters; it *recurs* when its normalised form equals that of one of the
    next K units. The onset is the first character of the first contentful unit that recurs
    and opens a window of W contentful units of which >= 75 % recur, such that every later
    window of W contentful units keeps >= 50 % recurring to the end of the answer. None: no such
    unit."""
    units = _units(text)
    forms = [u[1] for u in units]
    recurs = [forms[i] in forms[i + 1 : i + 1 + K] for i in range(len(forms))]
    return _loop_start(units, recurs)


#: Word-set overlap (Jaccard) at which a unit restates another (the paraphrase rule).
RESTATES = 0.5


def paraphrase_onset_of(text: str) -> int | None:
    """The paraphrase rule, for loops that change their words (applied where :func:`onset_of`
    finds nothing): the same units, windows and shares, but a unit *recurs* when the set of its
    words (2+ letters, normalised) shares >= 50 % of the union (Jaccard) with that of one of
    the next K units: a restatement with a few words changed, added or dropped."""
    units = _units(text)
    sets = [set(_WORD.findall(form)) for _, form in units]
    recurs = [
        any(len(a & b) >= RESTATES * len(a | b) for b in sets[i + 1 : i + 1 + K])
        for i, a in enumerate(sets)
    ]
    return _loop_start(units, recurs)


#: Onsets marked by hand (the first occurrence of the marker), where the rule finds none or a
#: late one: id -> (marker, what the loop is).
HAND: dict[str, tuple[str, str]] = {
    "blockloop-equation-e08": (
        "Now, let's verify this answer:",
        "circular commentary: 'let's verify', 'However, if the equation … is (in)correct', "
        "'The answer to this question is' in turn, every sentence in new words",
    ),
    "blockloop-dp-e07": (
        "This solution can be improved to avoid",
        "circular commentary: 'This solution can (also) be improved to use/avoid …' restated "
        "with edits to the token limit",
    ),
    "blockloop-sql-e06": ('"usermanames": {', "nested JSON keys repeated to the limit"),
    "blockloop-parser-e08": (
        "expression, expression",
        "a flood of one word inside a line (the rule reads lines, so it found a late onset)",
    ),
    "blockloop-cp-string-n09": (
        "This is the maximum substring that can be constructed using both",
        "one sentence that never ends: 'that can be constructed/formed using the (max) number of "
        "characters' nested to the token limit (no unit boundary for the rules)",
    ),
    "blockloop-cp-bits-n09": (
        "The original one-to-one solution has a space complexity",
        "circular commentary: 'it has been added to a one-to-one solution, so it has been "
        "added …' restated in shifting words to the token limit",
    ),
    "blockloop-math-prob-n09": (
        "However, when you double-counted, you actually",
        "circular commentary: 'if you double-counting, you double-count the probability of "
        "getting …' restated in new words to the token limit",
    ),
}

#: Answers that ended by themselves with no loop but are not healthy either, read by hand
#: (the penalty-stop round's repetition penalty makes the model coin words): id -> what they
#: are. They are ``unsure``: the set is about loops, and gibberish is another signal's.
NOT_HEALTHY: dict[str, str] = {
    "blockloop-cp-bits-s07": "gibberish: identifiers of 100+ letters glued from English words",
    "blockloop-cp-powsum-s07": "gibberish: one upper-case 'word' of 1,000+ letters",
}


def split_of(key: str) -> str:
    """``held-out`` for about a third of the ids (a hash, fixed before any threshold was set)."""
    return "held-out" if hashlib.sha256(key.encode()).digest()[0] % 3 == 0 else "dev"


#: Fields ``label`` adds to a raw answer.
LABEL_FIELDS = ("label", "degen_type", "onset_char", "kind", "lang", "split", "label_rule")


def _raw_rows() -> list[dict[str, Any]]:
    """The raw answers: ``blockloops-raw.jsonl`` where it has them, else the committed set's
    rows without their labels (the raw file is not in git; the set keeps every answer)."""
    rows: dict[str, dict[str, Any]] = {}
    if OUT.exists():
        with gzip.open(OUT, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                rows[row["id"]] = {k: v for k, v in row.items() if k not in LABEL_FIELDS}
    if RAW.exists():
        for line in RAW.open(encoding="utf-8"):
            if line.strip():
                row = json.loads(line)
                rows[row["id"]] = row
    return sorted(rows.values(), key=lambda r: r["id"])


def label() -> None:
    rows = _raw_rows()
    buf = bytearray()
    counts: dict[str, int] = {}
    for row in rows:
        onset = onset_of(row["text"])
        rule = "onset_of (BLOCKLOOPS.md)"
        runaway = row["finish_reason"] == "length"  # its loop may change its words
        if onset is None and runaway and (onset := paraphrase_onset_of(row["text"])) is not None:
            rule = "paraphrase_onset_of (BLOCKLOOPS.md)"
        if row["id"] in HAND:
            onset, rule = row["text"].index(HAND[row["id"]][0]), "by hand: " + HAND[row["id"]][1]
        if onset is not None and row["finish_reason"] == "length":
            extra = {"label": "degenerate", "degen_type": "block-loop", "onset_char": onset}
        elif row["id"] in NOT_HEALTHY:
            extra, rule = {"label": "unsure"}, "by hand: " + NOT_HEALTHY[row["id"]]
        elif onset is None and row["finish_reason"] == "stop":
            extra = {"label": "healthy"}
        else:
            extra = {"label": "unsure"}
        extra.update(kind="code-math", lang="en", split=split_of(row["id"]))
        extra["label_rule"] = rule
        counts[extra["label"]] = counts.get(extra["label"], 0) + 1
        buf += (json.dumps({**row, **extra}, ensure_ascii=False) + "\n").encode()
    with gzip.GzipFile(OUT, "wb", mtime=0) as fh:
        fh.write(bytes(buf))
    print(counts, f"{OUT.stat().st_size} bytes")


def measure(config: Any = None) -> None:
    """Per split: degenerate answers caught, characters from the onset to the verdict (median,
    p90), the signals that fired; healthy answers with a verdict. Streams as ``score`` does."""
    import statistics

    sys.path.insert(0, str(HERE.parent.parent))
    from proxy.cli.score import score_text

    with gzip.open(OUT, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    for split in ("dev", "held-out", "all"):
        group = [r for r in rows if split in ("all", r["split"])]
        delays, signals, missed, false = [], {}, [], []
        for row in group:
            if row["label"] not in ("degenerate", "healthy"):
                continue
            got = score_text(row["text"], config=config, expected_language="en")
            if row["label"] == "healthy":
                if got.degenerate:
                    false.append((row["id"], got.signal))
                continue
            if not got.degenerate or got.fired_at_char is None:
                missed.append(row["id"])
                continue
            delays.append(max(0, got.fired_at_char - row["onset_char"]))
            signals[got.signal] = signals.get(got.signal, 0) + 1
        n = len(delays) + len(missed)
        healthy = sum(r["label"] == "healthy" for r in group)
        if not n:
            continue
        delays.sort()
        p90 = delays[min(len(delays) - 1, int(0.9 * len(delays)))] if delays else None
        median = statistics.median(delays) if delays else None
        print(
            f"{split:<9} degenerate {n}: caught {len(delays)} ({len(delays) / n:.2f}), "
            f"chars after onset median {median} p90 {p90}; signals {signals}; "
            f"healthy {healthy}: verdicts {len(false)} {false}; missed {missed}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    gen = sub.add_parser("generate")
    gen.add_argument("--port", type=int, default=8093)
    gen.add_argument("--threads", type=int, default=2)
    gen.add_argument("--parallel", type=int, default=4)
    gen.add_argument("--budget", type=float, default=1200.0, help="seconds")
    gen.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    gen.add_argument(
        "--round",
        default="chat",
        choices=("chat", "long", "openings", "runaway", "penalty", "penalty-stop"),
    )
    sub.add_parser("label")
    meas = sub.add_parser("measure")
    meas.add_argument("--no-block-loop", action="store_true", help="the detector without it")
    args = ap.parse_args()
    if args.step == "generate":
        generate(args.port, args.threads, args.parallel, args.budget, args.max_tokens, args.round)
    elif args.step == "label":
        label()
    else:
        from proxy.detect import DetectorConfig

        measure(DetectorConfig(block_loop=not args.no_block_loop))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
