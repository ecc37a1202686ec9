"""Build the real-engine development set: SmolLM2-135M-Instruct generations with token logprobs.

Two steps, both resumable:

``generate``
    Starts llama.cpp's server (the ``xllamacpp`` wheel, as the end-to-end tests do, from the
    manifest ``scripts/prepare-e2e.sh`` wrote) and asks it every prompt of :data:`PROMPTS` in
    every language of :data:`LANGUAGES` under every setting of :data:`SETTINGS` (greedy and
    sampled, with and without a repetition penalty). Each answer is stored verbatim with its
    tokens, their logprobs and the top-5 alternatives, as the engine returned them, in
    ``realgen-raw.jsonl``. A 135M model is small enough to loop, flood and fall back to English
    for real, which is what the detector has to see.

``label``
    Applies the written rules of ``REALGEN.md`` to every raw line (loops: an exactly periodic
    tail, raw or with digits normalised, that runs to the end; floods; drift: the answer's
    sentences identified with ``langid.py`` — a different identifier from the detector's fastText,
    so the label is not the detector's own opinion) and writes ``realgen.jsonl`` in the format
    ``coherence-guard score`` reads. Lines whose rules disagree or sit at a threshold are marked
    ``label: "unsure"`` and left out of the figures; ``review.tsv`` lists a random sample for
    reading by eye, with the verdicts given.

Run (niced, one thread: the machine is shared)::

    nice -n 19 python bench/data/build_realgen.py generate [--limit N] [--threads N]
    python bench/data/build_realgen.py label
    python bench/data/build_realgen.py review     # what the manual review reads
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
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
ROOT = HERE.parent.parent
RAW = HERE / "realgen-raw.jsonl"  # the capture (not in git: every field is also in OUT)
OUT = HERE / "realgen.jsonl.gz"

#: Languages asked in (ISO 639-1), each prompt written natively in that language.
LANGUAGES = ("en", "it", "es", "fr", "de", "pt", "ru", "zh", "ja", "tr", "vi", "id", "nl", "pl")

#: (prompt id, {language: prompt}). Short answers, lists, stories that invite a loop, facts.
PROMPTS: dict[str, dict[str, str]] = {
    "capital": {
        "en": "What is the capital of France? Answer in one short paragraph.",
        "it": "Qual è la capitale della Francia? Rispondi in un breve paragrafo.",
        "es": "¿Cuál es la capital de Francia? Responde en un párrafo corto.",
        "fr": "Quelle est la capitale de la France ? Réponds en un court paragraphe.",
        "de": "Was ist die Hauptstadt von Frankreich? Antworte in einem kurzen Absatz.",
        "pt": "Qual é a capital da França? Responda em um parágrafo curto.",
        "ru": "Какая столица Франции? Ответь одним коротким абзацем.",
        "zh": "法国的首都是哪里？请用一小段话回答。",
        "ja": "フランスの首都はどこですか？短い段落で答えてください。",
        "tr": "Fransa'nın başkenti neresidir? Kısa bir paragrafla cevap ver.",
        "vi": "Thủ đô của Pháp là gì? Hãy trả lời trong một đoạn văn ngắn.",
        "id": "Apa ibu kota Prancis? Jawab dalam satu paragraf pendek.",
        "nl": "Wat is de hoofdstad van Frankrijk? Antwoord in een korte alinea.",
        "pl": "Jaka jest stolica Francji? Odpowiedz w jednym krótkim akapicie.",
    },
    "story": {
        "en": "Write a short story about a cat who learns to fly.",
        "it": "Scrivi una breve storia su un gatto che impara a volare.",
        "es": "Escribe un cuento corto sobre un gato que aprende a volar.",
        "fr": "Écris une courte histoire sur un chat qui apprend à voler.",
        "de": "Schreibe eine kurze Geschichte über eine Katze, die fliegen lernt.",
        "pt": "Escreva uma história curta sobre um gato que aprende a voar.",
        "ru": "Напиши короткий рассказ о коте, который научился летать.",
        "zh": "写一个关于一只学会飞翔的猫的短篇故事。",
        "ja": "空を飛ぶことを覚えた猫についての短い物語を書いてください。",
        "tr": "Uçmayı öğrenen bir kedi hakkında kısa bir hikâye yaz.",
        "vi": "Hãy viết một câu chuyện ngắn về một con mèo học bay.",
        "id": "Tulis cerita pendek tentang seekor kucing yang belajar terbang.",
        "nl": "Schrijf een kort verhaal over een kat die leert vliegen.",
        "pl": "Napisz krótkie opowiadanie o kocie, który uczy się latać.",
    },
    "list": {
        "en": "List 20 tips for learning a new language, numbered.",
        "it": "Elenca 20 consigli numerati per imparare una nuova lingua.",
        "es": "Enumera 20 consejos numerados para aprender un idioma nuevo.",
        "fr": "Donne 20 conseils numérotés pour apprendre une nouvelle langue.",
        "de": "Nenne 20 nummerierte Tipps, um eine neue Sprache zu lernen.",
        "pt": "Liste 20 dicas numeradas para aprender um novo idioma.",
        "ru": "Перечисли 20 пронумерованных советов по изучению нового языка.",
        "zh": "列出20条学习新语言的建议，并编号。",
        "ja": "新しい言語を学ぶための20のコツを番号付きで挙げてください。",
        "tr": "Yeni bir dil öğrenmek için numaralı 20 ipucu listele.",
        "vi": "Liệt kê 20 mẹo có đánh số để học một ngôn ngữ mới.",
        "id": "Sebutkan 20 tips bernomor untuk belajar bahasa baru.",
        "nl": "Noem 20 genummerde tips om een nieuwe taal te leren.",
        "pl": "Wypisz 20 ponumerowanych wskazówek do nauki nowego języka.",
    },
    "paragraphs": {
        "en": "Write a 30-paragraph story, numbering each paragraph.",
        "it": "Scrivi una storia di 30 paragrafi, numerando ogni paragrafo.",
        "es": "Escribe una historia de 30 párrafos, numerando cada párrafo.",
        "fr": "Écris une histoire de 30 paragraphes, en numérotant chaque paragraphe.",
        "de": "Schreibe eine Geschichte mit 30 Absätzen und nummeriere jeden Absatz.",
        "pt": "Escreva uma história de 30 parágrafos, numerando cada parágrafo.",
        "ru": "Напиши рассказ из 30 абзацев, пронумеровав каждый абзац.",
        "zh": "写一个30段的故事，每一段都编号。",
        "ja": "30段落の物語を書き、各段落に番号を付けてください。",
        "tr": "Her paragrafı numaralandırarak 30 paragraflık bir hikâye yaz.",
        "vi": "Hãy viết một câu chuyện 30 đoạn, đánh số từng đoạn.",
        "id": "Tulis cerita 30 paragraf, beri nomor pada setiap paragraf.",
        "nl": "Schrijf een verhaal van 30 alinea's en nummer elke alinea.",
        "pl": "Napisz opowiadanie z 30 akapitów, numerując każdy akapit.",
    },
    "explain": {
        "en": "Explain how photosynthesis works to a ten-year-old.",
        "it": "Spiega come funziona la fotosintesi a un bambino di dieci anni.",
        "es": "Explica cómo funciona la fotosíntesis a un niño de diez años.",
        "fr": "Explique comment fonctionne la photosynthèse à un enfant de dix ans.",
        "de": "Erkläre einem zehnjährigen Kind, wie die Photosynthese funktioniert.",
        "pt": "Explique como funciona a fotossíntese para uma criança de dez anos.",
        "ru": "Объясни десятилетнему ребёнку, как работает фотосинтез.",
        "zh": "向一个十岁的孩子解释光合作用是如何进行的。",
        "ja": "光合作用の仕組みを10歳の子どもに説明してください。",
        "tr": "Fotosentezin nasıl çalıştığını on yaşındaki bir çocuğa açıkla.",
        "vi": "Hãy giải thích quang hợp hoạt động như thế nào cho một đứa trẻ mười tuổi.",
        "id": "Jelaskan cara kerja fotosintesis kepada anak berusia sepuluh tahun.",
        "nl": "Leg aan een kind van tien uit hoe fotosynthese werkt.",
        "pl": "Wyjaśnij dziesięcioletniemu dziecku, jak działa fotosynteza.",
    },
    "email": {
        "en": "Write a polite email to my landlord asking to fix the heating.",
        "it": (
            "Scrivi un'email cortese al mio padrone di casa per chiedere di riparare "
            "il riscaldamento."
        ),
        "es": "Escribe un correo educado a mi casero pidiéndole que arregle la calefacción.",
        "fr": "Écris un e-mail poli à mon propriétaire pour lui demander de réparer le chauffage.",
        "de": (
            "Schreibe eine höfliche E-Mail an meinen Vermieter mit der Bitte, die Heizung "
            "zu reparieren."
        ),
        "pt": "Escreva um e-mail educado ao meu senhorio pedindo para consertar o aquecimento.",
        "ru": "Напиши вежливое письмо арендодателю с просьбой починить отопление.",
        "zh": "给我的房东写一封礼貌的邮件，请他修理暖气。",
        "ja": "暖房を修理してもらうよう大家さんに丁寧なメールを書いてください。",
        "tr": "Ev sahibime kaloriferi tamir etmesini rica eden kibar bir e-posta yaz.",
        "vi": "Hãy viết một email lịch sự cho chủ nhà nhờ sửa hệ thống sưởi.",
        "id": "Tulis email sopan kepada pemilik rumah untuk meminta perbaikan pemanas.",
        "nl": (
            "Schrijf een beleefde e-mail aan mijn huisbaas met het verzoek de verwarming "
            "te repareren."
        ),
        "pl": "Napisz uprzejmy e-mail do właściciela mieszkania z prośbą o naprawę ogrzewania.",
    },
    "poem": {
        "en": "Write a poem about the sea with a repeated refrain.",
        "it": "Scrivi una poesia sul mare con un ritornello ripetuto.",
        "es": "Escribe un poema sobre el mar con un estribillo repetido.",
        "fr": "Écris un poème sur la mer avec un refrain répété.",
        "de": "Schreibe ein Gedicht über das Meer mit einem wiederkehrenden Refrain.",
        "pt": "Escreva um poema sobre o mar com um refrão repetido.",
        "ru": "Напиши стихотворение о море с повторяющимся припевом.",
        "zh": "写一首关于大海的诗，要有重复的副歌。",
        "ja": "繰り返しのリフレインがある海についての詩を書いてください。",
        "tr": "Tekrarlanan bir nakaratı olan deniz hakkında bir şiir yaz.",
        "vi": "Hãy viết một bài thơ về biển có điệp khúc lặp lại.",
        "id": "Tulis puisi tentang laut dengan refrein yang diulang.",
        "nl": "Schrijf een gedicht over de zee met een herhaald refrein.",
        "pl": "Napisz wiersz o morzu z powtarzającym się refrenem.",
    },
    "recipe": {
        "en": "Give me a simple recipe for pancakes with the steps numbered.",
        "it": "Dammi una ricetta semplice per i pancake con i passaggi numerati.",
        "es": "Dame una receta sencilla de tortitas con los pasos numerados.",
        "fr": "Donne-moi une recette simple de crêpes avec les étapes numérotées.",
        "de": "Gib mir ein einfaches Rezept für Pfannkuchen mit nummerierten Schritten.",
        "pt": "Me dê uma receita simples de panquecas com os passos numerados.",
        "ru": "Дай простой рецепт блинов с пронумерованными шагами.",
        "zh": "给我一个简单的煎饼食谱，步骤要编号。",
        "ja": "パンケーキの簡単なレシピを、手順に番号を付けて教えてください。",
        "tr": "Adımları numaralandırılmış basit bir krep tarifi ver.",
        "vi": "Cho tôi một công thức làm bánh kếp đơn giản với các bước được đánh số.",
        "id": "Berikan resep panekuk sederhana dengan langkah-langkah bernomor.",
        "nl": "Geef me een eenvoudig recept voor pannenkoeken met genummerde stappen.",
        "pl": "Podaj prosty przepis na naleśniki z ponumerowanymi krokami.",
    },
    "dialogue": {
        "en": "Write a dialogue between a teacher and a student about homework.",
        "it": "Scrivi un dialogo tra un insegnante e uno studente sui compiti.",
        "es": "Escribe un diálogo entre un profesor y un alumno sobre los deberes.",
        "fr": "Écris un dialogue entre un professeur et un élève à propos des devoirs.",
        "de": "Schreibe einen Dialog zwischen einem Lehrer und einem Schüler über Hausaufgaben.",
        "pt": "Escreva um diálogo entre um professor e um aluno sobre a lição de casa.",
        "ru": "Напиши диалог между учителем и учеником о домашнем задании.",
        "zh": "写一段老师和学生关于家庭作业的对话。",
        "ja": "宿題について先生と生徒の対話を書いてください。",
        "tr": "Ödev hakkında bir öğretmen ile bir öğrenci arasında bir diyalog yaz.",
        "vi": "Hãy viết một đoạn hội thoại giữa giáo viên và học sinh về bài tập về nhà.",
        "id": "Tulis dialog antara guru dan murid tentang pekerjaan rumah.",
        "nl": "Schrijf een dialoog tussen een leraar en een leerling over huiswerk.",
        "pl": "Napisz dialog między nauczycielem a uczniem o pracy domowej.",
    },
    "compare": {
        "en": "Compare trains and planes for travelling in Europe.",
        "it": "Confronta treni e aerei per viaggiare in Europa.",
        "es": "Compara los trenes y los aviones para viajar por Europa.",
        "fr": "Compare le train et l'avion pour voyager en Europe.",
        "de": "Vergleiche Züge und Flugzeuge für Reisen in Europa.",
        "pt": "Compare trens e aviões para viajar pela Europa.",
        "ru": "Сравни поезда и самолёты для путешествий по Европе.",
        "zh": "比较在欧洲旅行时乘坐火车和飞机的优缺点。",
        "ja": "ヨーロッパ旅行における電車と飛行機を比較してください。",
        "tr": "Avrupa'da seyahat için trenleri ve uçakları karşılaştır.",
        "vi": "Hãy so sánh tàu hỏa và máy bay khi du lịch ở châu Âu.",
        "id": "Bandingkan kereta dan pesawat untuk bepergian di Eropa.",
        "nl": "Vergelijk treinen en vliegtuigen om door Europa te reizen.",
        "pl": "Porównaj pociągi i samoloty do podróżowania po Europie.",
    },
}

#: Sampling settings: greedy and sampled, each without and with a repetition penalty.
SETTINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0, "repeat_penalty": 1.0},
    "greedy-rp": {"temperature": 0.0, "repeat_penalty": 1.2},
    "sampled": {"temperature": 0.8, "top_p": 0.95, "repeat_penalty": 1.0, "seed": 7},
    "sampled-rp": {"temperature": 0.8, "top_p": 0.95, "repeat_penalty": 1.15, "seed": 11},
}
MAX_TOKENS = 200


def _manifest() -> dict[str, Any]:
    home = Path(
        os.environ.get("COHERENCE_GUARD_E2E_HOME", Path.home() / ".cache/coherence-guard-e2e")
    )
    data: dict[str, Any] = json.loads((home / "manifest.json").read_text())
    return data


def _start_llama(port: int, threads: int, parallel: int) -> subprocess.Popen[bytes]:
    entry = _manifest()["llamacpp"]
    argv = [part.replace("{port}", str(port)) for part in entry["command"]]
    # Several slots decode as one batch: on one thread that is nearly free per extra sequence.
    argv += ["--threads", str(threads), "--parallel", str(parallel)]
    log = (HERE / ".realgen-server.log").open("wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _done_keys() -> set[str]:
    if not RAW.exists():
        return set()
    return {json.loads(line)["id"] for line in RAW.open(encoding="utf-8") if line.strip()}


def generate(limit: int | None, port: int, threads: int, parallel: int) -> None:
    import httpx

    # Settings interleaved, so a run stopped early still covers all of them.
    jobs = [
        (f"realgen-{pid}-{lang}-{setting}", pid, lang, setting)
        for pid, texts in PROMPTS.items()
        for lang in LANGUAGES
        for setting in SETTINGS
        if lang in texts
    ]
    done = _done_keys()
    todo = [job for job in jobs if job[0] not in done][:limit]
    print(f"{len(jobs)} jobs, {len(done)} done, {len(todo)} to run", flush=True)
    if not todo:
        return
    server = _start_llama(port, threads, parallel)

    # A SIGTERM to the builder must not leave the engine running (nor wait for requests in
    # flight: the rows already written are kept, the rest is generated on the next run).
    def stop(*_: object) -> None:
        server.kill()
        os._exit(143)

    signal.signal(signal.SIGTERM, stop)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("llama.cpp server did not start; see .realgen-server.log")
            time.sleep(0.5)
        lock = threading.Lock()
        with httpx.Client(base_url=url, timeout=600) as client, RAW.open("a") as out:

            def run(job: tuple[str, str, str, str]) -> None:
                row = _generate_one(client, *job)
                with lock:
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    out.flush()
                print(job[0], row["finish_reason"], len(row["text"]), row["seconds"], flush=True)

            with ThreadPoolExecutor(parallel) as pool:
                for _ in pool.map(run, todo):
                    pass
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def _generate_one(client: Any, key: str, pid: str, lang: str, setting: str) -> dict[str, Any]:
    """One chat completion with logprobs, stored as the engine returned it."""
    prompt = PROMPTS[pid][lang]
    body = {
        "model": _manifest()["served_model_name"],
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "logprobs": True,
        "top_logprobs": 5,
        **SETTINGS[setting],
    }
    started = time.monotonic()
    reply = client.post("/v1/chat/completions", json=body)
    reply.raise_for_status()
    choice = reply.json()["choices"][0]
    content = (choice.get("logprobs") or {}).get("content") or []
    return {
        "id": key,
        "engine": "llama.cpp (xllamacpp), SmolLM2-135M-Instruct Q4_1",
        "prompt_id": pid,
        "prompt_language": lang,
        "prompt": prompt,
        "setting": setting,
        "sampling": SETTINGS[setting],
        "max_tokens": MAX_TOKENS,
        "finish_reason": choice.get("finish_reason"),
        "text": choice["message"].get("content") or "",
        "tokens": [e.get("token", "") for e in content],
        "token_logprobs": [e.get("logprob") for e in content],
        "top_logprobs": [
            {a["token"]: a["logprob"] for a in e.get("top_logprobs") or []} for e in content
        ],
        "seconds": round(time.monotonic() - started, 2),
    }


# -- labelling (the rules of REALGEN.md) ------------------------------------------------------

_DIGITS = re.compile(r"\d+")
_SENTENCE = re.compile(r"[^.!?。！？\n]+[.!?。！？]*")
_MARKUP = re.compile(r"[\d#*_`|>\[\]()]+")
#: Languages langid.py confuses on sentences; a switch inside a group is not drift.
_CLOSE = (
    {"es", "pt", "gl", "ca", "it", "an"}, {"id", "ms", "jv"}, {"no", "nb", "da", "sv"},
    {"hr", "sr", "bs", "sl"}, {"ru", "uk", "be", "bg"}, {"cs", "sk"}, {"zh", "ja"},
    {"nl", "af", "fy"},
)  # fmt: skip
#: Sentences shorter than this (characters, markup removed) are not identified.
MIN_SENTENCE = 30
#: Probability langid.py must give a sentence for it to count.
MIN_PROB = 0.8


def _same(a: str, b: str) -> bool:
    return a == b or any(a in g and b in g for g in _CLOSE)


def periodic_suffix(text: str, period: int) -> int:
    """Length of the longest suffix of ``text`` equal to itself shifted by ``period``."""
    n = len(text)
    lo, hi = 0, n - period
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text[n - mid :] == text[n - mid - period : n - period]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def loop_rule(text: str) -> tuple[str, int, int, float] | None:
    """(kind, onset, period, copies) of the periodic region that ends the text, digits
    normalised (a counter loop is a loop): at least 3 copies over 120 characters, or a unit of
    at most 10 characters repeated 10 times (a flood). The smallest such period wins."""
    body = text.rstrip()
    norm = _DIGITS.sub("0", body)
    # Map normalised offsets back to raw ones through the digit runs.
    n = len(norm)
    for period in range(1, n // 3 + 1):
        suffix = periodic_suffix(norm, period)
        covered = suffix + period
        copies = covered / period
        flood = period <= 10 and copies >= 10 and covered >= 30
        if flood or (copies >= 3 and covered >= 120):
            onset_norm = n - covered
            onset = _raw_offset(body, onset_norm)
            return ("token-flood" if period <= 10 else "repetition-loop", onset, period, copies)
    return None


def _raw_offset(raw: str, norm_offset: int) -> int:
    """The raw offset whose digit-normalised prefix has ``norm_offset`` characters."""
    count = 0
    pos = 0
    for match in _DIGITS.finditer(raw):
        gap = match.start() - pos
        if count + gap >= norm_offset:
            return pos + (norm_offset - count)
        count += gap + 1
        pos = match.end()
        if count >= norm_offset:
            return pos
    return pos + (norm_offset - count)


def repeated_lines(text: str) -> tuple[int, int] | None:
    """(onset, copies) of a line of at least 20 characters (digits normalised, case folded)
    that occurs three times or more: a loop with small edits around it."""
    seen: dict[str, list[int]] = {}
    pos = 0
    for line in text.split("\n"):
        key = " ".join(_DIGITS.sub("0", line).lower().split())
        if len(key) >= 20:
            seen.setdefault(key, []).append(pos)
        pos += len(line) + 1
    best = max(seen.values(), key=len, default=[])
    return (best[0], len(best)) if len(best) >= 3 else None


def sentence_languages(text: str) -> list[tuple[int, int, str]]:
    """(start, characters, language) of each sentence langid.py is sure of."""
    from langid.langid import LanguageIdentifier, model

    identifier = _identifier(LanguageIdentifier, model)
    out = []
    for match in _SENTENCE.finditer(text):
        clean = " ".join(_MARKUP.sub(" ", match.group()).split())
        if len(clean) < MIN_SENTENCE:
            continue
        code, prob = identifier.classify(clean)
        if prob >= MIN_PROB:
            out.append((match.start() + len(match.group()) - len(match.group().lstrip()),
                        len(clean), code))  # fmt: skip
    return out


_IDENTIFIERS: list[Any] = []


def _identifier(cls: Any, model: Any) -> Any:
    if not _IDENTIFIERS:
        _IDENTIFIERS.append(cls.from_modelstring(model, norm_probs=True))
    return _IDENTIFIERS[0]


#: Fields of the capture kept in the labelled file, so the capture itself need not be kept.
_CAPTURE_FIELDS = (
    "engine", "prompt_id", "prompt", "setting", "sampling", "max_tokens", "finish_reason",
    "seconds",
)  # fmt: skip


def label_row(raw: dict[str, Any]) -> dict[str, Any]:
    """Apply the written rules to one generation; see REALGEN.md."""
    text: str = raw["text"]
    lang: str = raw["prompt_language"]
    row: dict[str, Any] = {
        **{k: raw[k] for k in _CAPTURE_FIELDS},
        "id": raw["id"],
        "text": text,
        "label": "unsure",
        "kind": "llm-answer",
        "lang": lang,
        "prompt_language": lang,
        "onset_char": None,
        "source": f"{raw['engine']}; {raw['setting']} {raw['sampling']}; "
        f"max_tokens {raw['max_tokens']}; finish_reason {raw['finish_reason']}",
        "tokens": raw["tokens"],
        "token_logprobs": raw["token_logprobs"],
        "top_logprobs": raw["top_logprobs"],
    }
    sentences = sentence_languages(text)
    identified = sum(n for _, n, _ in sentences)
    native = sum(n for _, n, c in sentences if _same(lang, c))
    english = [(s, n) for s, n, c in sentences if c == "en" and not _same(lang, "en")]
    english_chars = sum(n for _, n in english)
    ran_out = raw["finish_reason"] == "length"
    loop = loop_rule(text)
    lines = repeated_lines(text) if ran_out else None
    rule = None
    onset = None
    degen = None
    if loop is not None:
        degen, onset, rule = loop[0], loop[1], f"periodic tail p={loop[2]} x{loop[3]:.1f}"
    elif lines is not None:
        degen, onset, rule = "repetition-loop", lines[0], f"line repeated x{lines[1]}"
    if english_chars >= 100 and english_chars >= 0.3 * identified:
        drift_onset = english[0][0]
        if onset is None or drift_onset < onset:
            degen, onset = "language-drift", drift_onset
            rule = f"English {english_chars}/{identified} identified chars (langid.py)"
    if degen is not None:
        row.update(label="degenerate", degen_type=degen, onset_char=onset, label_rule=rule)
    elif lang != "en":
        # The review found word salad in most of these (invented words that langid.py, like
        # fastText, still calls the prompt's language): no rule can call them healthy.
        row["label_rule"] = f"native {native}/{identified}: word salad not ruled out"
    elif len(text.strip()) < 40 or (identified and native >= 0.6 * identified):
        row.update(label="healthy", label_rule=f"native {native}/{identified} identified chars")
    else:
        row["label_rule"] = f"native {native}/{identified}, English {english_chars}: no rule"
    return row


#: Labels corrected by reading the text (see REALGEN.md, "Manual review"): id -> (label,
#: degen_type, onset_char, reason).
REVIEWED: dict[str, tuple[str, str | None, int | None, str]] = {
    "realgen-capital-de-sampled": (
        "degenerate", "language-drift", 40,
        "German question restated, then English; langid.py calls the English German because"
        " of the German words it quotes",
    ),
    "realgen-paragraphs-pl-greedy": (
        "degenerate", "language-drift", 59,
        "Polish prompt restated, then an English sentence about it that quotes the prompt",
    ),
    "realgen-list-pt-sampled": (
        "unsure", None, None,
        "'1. 1' to '20. 20' and stop: an empty list that ends where it was asked to, not a loop",
    ),
    "realgen-paragraphs-pt-greedy-rp": (
        "unsure", None, None,
        "the 'English' is the comments of a fenced Python block after Portuguese salad",
    ),
}  # fmt: skip


def _read(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def label_all(raw_path: Path, out_path: Path) -> None:
    """Label the capture (or, without it, the labelled file itself: it carries every field of
    the capture) and write ``out_path`` (gzip, reproducible bytes)."""
    rows = _read(raw_path if raw_path.exists() else out_path)
    rows.sort(key=lambda r: r["id"])
    counts: dict[str, int] = {}
    with (
        gzip.GzipFile(out_path, "wb", mtime=0) as raw_out,
        io.TextIOWrapper(raw_out, encoding="utf-8") as out,
    ):
        for raw in rows:
            row = label_row(raw)
            if raw["id"] in REVIEWED:
                label, degen, onset, reason = REVIEWED[raw["id"]]
                row.pop("degen_type", None)
                row.update(label=label, onset_char=onset, label_rule=f"manual: {reason}")
                if degen is not None:
                    row["degen_type"] = degen
            key = f"{row['label']}/{row.get('degen_type', '-')}"
            counts[key] = counts.get(key, 0) + 1
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    for key in sorted(counts):
        print(f"{key:<32}{counts[key]:>5}")


def review(out_path: Path, sample: int = 30, seed: int = 5) -> None:
    """Print what a reviewer reads: every line where the detector and the rules disagree, and
    a random sample of lines where they agree."""
    import random

    from proxy.cli.score import score_rows

    results = list(score_rows(_read(out_path)))
    disagree = [r for r in results if r.row["label"] != "unsure"
                and (r.row["label"] == "degenerate") != r.degenerate]  # fmt: skip
    agree = [r for r in results if r.row["label"] != "unsure" and r not in disagree]
    picked = random.Random(seed).sample(agree, min(sample, len(agree)))
    for title, group in (("DISAGREE", disagree), ("AGREE (sample)", picked)):
        for r in group:
            row = r.row
            print(f"=== {title} {row['id']} rules={row['label']}/{row.get('degen_type')}"
                  f"@{row['onset_char']} ({row.get('label_rule')}) detector={r.signal}"
                  f"@{r.onset_char}")  # fmt: skip
            print(row["text"][:700])
            print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    gen = sub.add_parser("generate")
    gen.add_argument("--limit", type=int, default=None)
    gen.add_argument("--port", type=int, default=18931)
    gen.add_argument("--threads", type=int, default=1)
    gen.add_argument("--parallel", type=int, default=4)
    sub.add_parser("label")
    sub.add_parser("review")
    args = parser.parse_args(argv)
    if args.step == "generate":
        generate(args.limit, args.port, args.threads, args.parallel)
    elif args.step == "label":
        label_all(RAW, OUT)
    else:
        review(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
