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

    nice -n 19 python bench/data/build_realgen.py generate [--limit N]
    python bench/data/build_realgen.py label
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RAW = HERE / "realgen-raw.jsonl"
OUT = HERE / "realgen.jsonl"

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
MAX_TOKENS = 300


def _manifest() -> dict[str, Any]:
    home = Path(
        os.environ.get("COHERENCE_GUARD_E2E_HOME", Path.home() / ".cache/coherence-guard-e2e")
    )
    data: dict[str, Any] = json.loads((home / "manifest.json").read_text())
    return data


def _start_llama(port: int) -> subprocess.Popen[bytes]:
    entry = _manifest()["llamacpp"]
    argv = [part.replace("{port}", str(port)) for part in entry["command"]]
    log = (HERE / ".realgen-server.log").open("wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _done_keys() -> set[str]:
    if not RAW.exists():
        return set()
    return {json.loads(line)["id"] for line in RAW.open(encoding="utf-8") if line.strip()}


def generate(limit: int | None, port: int) -> None:
    import httpx

    jobs = [
        (f"realgen-{pid}-{lang}-{setting}", pid, lang, setting)
        for setting in SETTINGS
        for pid, texts in PROMPTS.items()
        for lang in LANGUAGES
        if lang in texts
    ]
    done = _done_keys()
    todo = [job for job in jobs if job[0] not in done][:limit]
    print(f"{len(jobs)} jobs, {len(done)} done, {len(todo)} to run", flush=True)
    if not todo:
        return
    server = _start_llama(port)
    # A SIGTERM to the builder must not leave the engine running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
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
        with httpx.Client(base_url=url, timeout=600) as client, RAW.open("a") as out:
            for key, pid, lang, setting in todo:
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
                content = choice.get("logprobs", {}).get("content") or []
                row = {
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
                        {a["token"]: a["logprob"] for a in e.get("top_logprobs") or []}
                        for e in content
                    ],
                    "seconds": round(time.monotonic() - started, 2),
                }
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                out.flush()
                print(key, row["finish_reason"], len(row["text"]), row["seconds"], flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    gen = sub.add_parser("generate")
    gen.add_argument("--limit", type=int, default=None)
    gen.add_argument("--port", type=int, default=18931)
    sub.add_parser("label")
    args = parser.parse_args(argv)
    if args.step == "generate":
        generate(args.limit, args.port)
    else:
        from bench.data.realgen_label import label_all

        label_all(RAW, OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
