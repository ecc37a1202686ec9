"""Request shapes written blind, paired with real answers, measured through a running proxy.

The shapes (``bench/data/language_shapes_*.jsonl``) were written by a writer who had not read
the language rule: each is a real-looking request (chat, Responses or Messages; system and
developer prompts, several turns, the ``x-guard-language`` header) with the languages a correct
answer may be in (``accept``) and, where the request demands one language outright, that
language (``required``). Each shape is sent through the proxy (uvicorn, the real app, default
settings; ``GUARD_ALLOW_CLIENT_OVERRIDE`` so the header is read) to the fake engine, which
streams a real text from ``bench/data/language_pool.jsonl.gz``:

* **correct**: for every accepted language with texts in the pool, two of them. A
  ``language-drift`` or ``script-intrusion`` abort is a correct answer cut (target 0); an abort
  by another signal is counted apart (the pool's texts are healthy, so it is a false alarm of
  another issue).
* **wrong**: where a language is required and it is not English, two real English answers;
  where English is required, two answers in a language the shape does not accept. A
  language abort is a catch (target 90 %).
* **auto**: the same shape once more through a proxy with ``GUARD_LANGUAGE=auto``; the
  instruction the engine received is read from its recorded request. Injecting a language the
  shape does not require (or does not declare with the header) is a violation (target 0).

::

    python bench/measure/language/measure_language_blind.py \\
        bench/data/language_shapes_dev.jsonl --misses
    MEASURE_PROXY_ROOT=/path/to/other/checkout \\
        python bench/measure/language/measure_language_blind.py FILE
    python bench/measure/language/measure_language_blind.py --cost \\
        bench/data/language_shapes_{dev,held,third}.jsonl

``--cost`` times the derivation of each shape's expectation instead (what a request pays once,
in-process, the memo of texts seen a moment ago emptied before each: the cost of a request
whose texts are all new), and prints the median and p90 per request.

The proxy's verdicts are read from its own metrics (``guard_detections_total`` by signal and
action), one request at a time.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, os.environ.get("MEASURE_PROXY_ROOT", str(ROOT)))

import httpx  # noqa: E402

from proxy.observability.metrics import Metrics  # noqa: E402
from proxy.server.app import create_app  # noqa: E402
from proxy.settings import load_settings  # noqa: E402
from tests.conftest import ProxyServer  # noqa: E402
from tests.fakes.vllm import FakeVLLM, Script  # noqa: E402

POOL = ROOT / "bench" / "data" / "language_pool.jsonl.gz"
LANGUAGE_SIGNALS = frozenset({"language-drift", "script-intrusion"})
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
#: A language for a wrong answer where English is the one required: the first the shape does
#: not accept.
OTHERS = ("zh", "es", "ru", "de", "ja")


def load_pool() -> dict[str, list[str]]:
    pool: dict[str, list[str]] = defaultdict(list)
    with gzip.open(POOL, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            pool[row["lang"]].append(row["text"])
    return pool


def pick(texts: list[str], key: str, k: int = 2) -> list[str]:
    """``k`` texts, the same for the same key in every run."""
    if not texts:
        return []
    start = int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(texts)
    return [texts[(start + i) % len(texts)] for i in range(min(k, len(texts)))]


def body_of(shape: dict[str, Any]) -> dict[str, Any]:
    body = dict(shape["request"])
    body["model"] = "fake-model"
    body["stream"] = True
    if shape["surface"] == "responses":
        body["max_output_tokens"] = 4096
    else:
        body["max_tokens"] = 4096
    return body


class Proxy:
    """One running proxy with its own metrics, in front of ``fake``."""

    def __init__(self, fake: FakeVLLM, **settings: Any) -> None:
        self.metrics = Metrics()
        app = create_app(
            load_settings(
                upstream_url=fake.url,
                upstream_metrics_interval=0,
                allow_client_override=True,
                **settings,
            ),
            metrics=self.metrics,
        )
        self.server = ProxyServer(app).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=60)

    def detections(self) -> Counter[tuple[str, str]]:
        """Verdicts by (signal, action), and ``("", "generations")``: generations ended."""
        out: Counter[tuple[str, str]] = Counter()
        for metric in self.metrics.quality_registry.collect():
            if metric.name not in ("guard_detections", "guard_generations"):
                continue
            for sample in metric.samples:
                if not sample.name.endswith("_total"):
                    continue
                if metric.name == "guard_generations":
                    out[("", "generations")] += int(sample.value)
                else:
                    out[(sample.labels["signal"], sample.labels["action"])] += int(sample.value)
        return out

    def settled(self, before: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
        """The counters once this request's generation is counted as ended: the relay counts
        it as it closes, which may come a moment after the client read the last byte, and a
        verdict read too early would be given to the next request."""
        deadline = time.monotonic() + 5
        while True:
            after = self.detections()
            ended = after[("", "generations")] > before[("", "generations")]
            if ended or time.monotonic() > deadline:
                return after
            time.sleep(0.002)

    def send(self, shape: dict[str, Any]) -> tuple[list[tuple[str, str]], str, int]:
        """The verdicts this request added, the x-guard-language header, the status."""
        before = self.detections()
        headers = dict(shape.get("headers") or {})
        # A client sends a header's UTF-8 bytes (httpx would refuse a str beyond Latin-1).
        raw = [(k.encode(), v.encode("utf-8")) for k, v in headers.items()]
        with self.client.stream(
            "POST", PATHS[shape["surface"]], json=body_of(shape), headers=raw
        ) as r:
            for _ in r.iter_bytes():
                pass
            status = r.status_code
            said = r.headers.get("x-guard-language", "")
        after = self.settled(before) if status == 200 else self.detections()
        added = [k for k in after if k[0] and after[k] > before.get(k, 0)]
        return added, said, status

    def close(self) -> None:
        self.client.close()
        self.server.stop()


def injected_language(fake: FakeVLLM, shape: dict[str, Any]) -> str | None:
    """The language of the instruction the proxy added to the request the engine received."""
    from proxy.core.language_names import resolve
    from proxy.core.language_rule import LANGUAGE_INSTRUCTIONS

    sent = json.dumps(fake.client_requests[-1].json, ensure_ascii=False)
    original = json.dumps(shape["request"], ensure_ascii=False)
    for code, text in LANGUAGE_INSTRUCTIONS.items():
        if text in sent and text not in original:
            return code
    marker = "Respond only in "
    at = sent.find(marker)
    if at >= 0 and marker not in original:
        name = sent[at + len(marker) :].split(".")[0]
        return resolve(name) or name
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", type=Path, nargs="+")
    parser.add_argument("--misses", action="store_true", help="print every miss and wrong cut")
    parser.add_argument("--json", type=Path, help="write every verdict to this file")
    parser.add_argument("--cost", action="store_true", help="time the derivation per request")
    args = parser.parse_args(argv)
    shapes = [
        json.loads(x)
        for path in args.shapes
        for x in path.read_text(encoding="utf-8").splitlines()
        if x
    ]
    if args.cost:
        derivation_cost(shapes)
        return
    pool = load_pool()
    counts: Counter[str] = Counter()
    by_category: dict[str, Counter[str]] = defaultdict(Counter)
    lines: list[str] = []
    rows: list[dict[str, Any]] = []
    with FakeVLLM() as fake:
        default = Proxy(fake)
        auto = Proxy(fake, language="auto")
        try:
            for shape in shapes:
                sid = shape["id"]
                accept = list(dict.fromkeys(shape["accept"]))
                required = shape.get("required")
                cats = shape.get("category") or []
                row: dict[str, Any] = {"id": sid, "correct": [], "wrong": [], "auto": None}
                for lang in accept:
                    texts = pick(pool.get(lang, []), f"{sid}:{lang}")
                    if not texts:
                        counts["correct: no text in the pool"] += 1
                        continue
                    for text in texts:
                        fake.script = Script(texts=[text])
                        added, said, status = default.send(shape)
                        cut = [s for s, a in added if a == "aborted"]
                        lang_cut = [s for s in cut if s in LANGUAGE_SIGNALS]
                        other = [s for s in cut if s not in LANGUAGE_SIGNALS]
                        counts["correct: sent"] += 1
                        counts["correct: cut for language"] += bool(lang_cut)
                        counts["correct: cut by another signal"] += bool(other and not lang_cut)
                        counts["correct: refused (status not 200)"] += status != 200
                        for cat in cats:
                            by_category[cat]["correct sent"] += 1
                            by_category[cat]["correct cut"] += bool(lang_cut)
                        row["correct"].append({"lang": lang, "cut": cut, "header": said})
                        if (lang_cut or status != 200) and args.misses:
                            lines.append(f"CUT  {sid} [{lang}] {status} {','.join(cut)}  {said}")
                if required:
                    wrong = "en" if required != "en" else next(o for o in OTHERS if o not in accept)
                    for text in pick(pool.get(wrong, []), f"{sid}:wrong:{wrong}"):
                        fake.script = Script(texts=[text])
                        added, said, status = default.send(shape)
                        caught = status == 200 and any(
                            s in LANGUAGE_SIGNALS for s, a in added if a == "aborted"
                        )
                        key = (
                            "wrong (English for another)"
                            if wrong == "en"
                            else "wrong (other for English)"
                        )
                        counts[f"{key}: sent"] += 1
                        counts[f"{key}: caught"] += caught
                        for cat in cats:
                            by_category[cat]["wrong sent"] += 1
                            by_category[cat]["wrong caught"] += caught
                        row["wrong"].append({"lang": wrong, "caught": caught, "header": said})
                        if not caught and args.misses:
                            lines.append(f"MISS {sid} [{wrong} for {required}]  {said}")
                texts = pick(pool.get(required or accept[0], []), f"{sid}:auto") or ["Ok."]
                fake.script = Script(texts=[texts[0]])
                auto.send(shape)
                injected = injected_language(fake, shape)
                declared = _declared(shape)
                allowed = {declared} if declared else ({required} if required else set())
                counts["auto: shapes"] += 1
                counts["auto: injected"] += injected is not None
                bad = injected is not None and injected not in allowed
                counts["auto: injected a language not declared or required"] += bad
                if required and injected == required:
                    counts["auto: required language injected"] += 1
                if required:
                    counts["auto: shapes with a required language"] += 1
                row["auto"] = injected
                if bad and args.misses:
                    lines.append(f"AUTO {sid} injected {injected}, allowed {sorted(allowed)}")
                rows.append(row)
        finally:
            default.close()
            auto.close()
    _report(counts, by_category, len(shapes))
    for line in lines:
        print(line)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=0, ensure_ascii=False), encoding="utf-8")


def derivation_cost(shapes: list[dict[str, Any]]) -> None:
    """Median and p90 time to derive each shape's expectation, every text new to the memo.

    Its first pass loads what the derivation reads (the language model, the name index), as the
    server does beside serving; the second pass is timed."""
    from proxy.core.requested_language import MEMO
    from proxy.core.rewrite import RewritePolicy, expect_language

    policy = RewritePolicy()
    bodies = [(body_of(s), s["surface"], _declared(s)) for s in shapes]
    times: list[float] = []
    for timed in (False, True):
        for body, surface, header in bodies:
            MEMO.clear()
            start = time.perf_counter()
            expect_language(body, surface, policy, header)
            if timed:
                times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2] * 1000
    p90 = times[int(len(times) * 0.9)] * 1000
    print(f"{len(times)} requests: derivation {median:.2f} ms median, {p90:.2f} ms p90")


def _declared(shape: dict[str, Any]) -> str | None:
    from proxy.core.language_names import resolve

    value = (shape.get("headers") or {}).get("x-guard-language")
    return resolve(value) if value else None


def _report(counts: Counter[str], by_category: dict[str, Counter[str]], n: int) -> None:
    print(f"{n} shapes")
    for key in sorted(counts):
        print(f"  {key}: {counts[key]}")

    def share(a: int, b: int) -> str:
        return f"{a} / {b} ({100 * a / b:.1f} %)" if b else "0 / 0"

    print(
        "correct answers cut for language:",
        share(counts["correct: cut for language"], counts["correct: sent"]),
    )
    print(
        "correct answers refused (the request got no answer):",
        share(counts["correct: refused (status not 200)"], counts["correct: sent"]),
    )
    for key in ("wrong (English for another)", "wrong (other for English)"):
        print(f"{key} caught:", share(counts[f"{key}: caught"], counts[f"{key}: sent"]))
    print("by category (correct cut / sent; wrong caught / sent):")
    for cat in sorted(by_category):
        c = by_category[cat]
        print(
            f"  {cat:16} {c['correct cut']:4} / {c['correct sent']:4}"
            f"   {c['wrong caught']:4} / {c['wrong sent']:4}"
        )


if __name__ == "__main__":
    main()
