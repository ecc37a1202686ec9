"""Hand-made texts for the detector's unit tests (written for these tests, not from a corpus)."""

from __future__ import annotations

import itertools
import random

ITALIAN = (
    "Il progetto nasce dall'esigenza di controllare le risposte dei modelli linguistici mentre "
    "vengono generate. Quando un modello entra in un ciclo, continua a produrre le stesse frasi "
    "fino al limite massimo di token, e nel frattempo occupa una scheda grafica che potrebbe "
    "servire ad altri utenti. Per questo motivo abbiamo deciso di osservare il flusso di testo "
    "in tempo reale, di misurare alcune proprietà semplici della finestra più recente e di "
    "interrompere la generazione soltanto quando le prove sono chiare. La prudenza è "
    "fondamentale: una risposta sana interrotta per errore è un danno per chi la aspetta. "
    "Inoltre, i testi tecnici contengono spesso elenchi, tabelle e frammenti di codice che si "
    "ripetono in modo legittimo, e il controllo deve saperli riconoscere senza esitazioni. "
    "Nelle prossime sezioni descriviamo i segnali utilizzati, le soglie scelte e le misure "
    "raccolte su un insieme di testi reali scritti in molte lingue diverse. "
)

ENGLISH = (
    "The results were collected on a shared machine with two cores, so every number should be "
    "read as a lower bound on what a dedicated server would achieve. We first looked at the "
    "throughput of the detector alone, then at the cost of the language identification step, "
    "which dominates when the text is long and written in a language with many short words. "
    "After that we compared the delay between the first repeated sentence and the moment the "
    "generation was stopped, and we found that most loops were caught within a few hundred "
    "characters of their start, well before they could waste a noticeable amount of time. "
    "Finally we checked that healthy answers, including tables and code, were left alone. "
)

CHINESE = (
    "这个问题的答案非常复杂，我们需要从多个角度进行分析，首先要考虑的是系统的整体结构，"
    "然后再研究每个模块之间的关系以及它们如何相互影响。"
)

JAPANESE = (
    "この文書では、検出器の仕組みについて説明します。まず、テキストを一定の間隔で確認し、"
    "繰り返しや言語の変化がないかを調べます。カタカナの用語やひらがな、漢字が混ざるのは自然な"
    "ことなので、日本語の文章では問題になりません。次に、コードや表が含まれる場合の扱いを"
    "説明します。最後に、測定結果とその解釈について述べます。"
)

PYTHON_CODE = '''
def parse_header(line: str) -> tuple[str, str]:
    """Split one header line into name and value."""
    name, _, value = line.partition(":")
    return name.strip().lower(), value.strip()


def parse_headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        if not line:
            break
        name, value = parse_header(line)
        headers[name] = value
    return headers


class Request:
    def __init__(self, method: str, path: str, headers: dict[str, str]) -> None:
        self.method = method
        self.path = path
        self.headers = headers

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)
'''

MARKDOWN_TABLE = "| Model | Params | Context | Licence |\n|---|---|---|---|\n" + "".join(
    f"| model-{name} | {size}B | {ctx}k | {lic} |\n"
    for name, size, ctx, lic in [
        ("alpha", 7, 8, "Apache-2.0"),
        ("beta", 13, 4, "MIT"),
        ("gamma", 70, 32, "custom"),
        ("delta", 1, 2, "Apache-2.0"),
        ("epsilon", 34, 16, "MIT"),
        ("zeta", 8, 128, "Llama"),
        ("eta", 3, 8, "Apache-2.0"),
        ("theta", 14, 32, "MIT"),
        ("iota", 72, 128, "Qwen"),
        ("kappa", 2, 8, "Gemma"),
    ]
)


def varied_words(count: int, seed: int) -> list[str]:
    """``count`` pseudo-words of 3-7 letters, reproducible, with little repetition."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 7))) for _ in range(count)]


def as_deltas(text: str) -> list[str]:
    """Token-sized deltas, as the score CLI cuts them."""
    from proxy.cli.score import split_deltas

    return list(split_deltas(text))


def beer_song(first: int = 99) -> str:
    """The traditional counting-down song, with digits: a counter loop that ends by itself."""
    return "".join(
        f"{n} bottles of beer on the wall, {n} bottles of beer.\n"
        f"Take one down and pass it around, {n - 1} bottles of beer on the wall.\n\n"
        for n in range(first, 2, -1)
    )


def green_bottles() -> str:
    """Ten Green Bottles: verses that differ in one word, a refrain song."""
    names = ["Ten", "Nine", "Eight", "Seven", "Six", "Five", "Four", "Three", "Two", "One", "No"]
    verses = []
    for now, then in itertools.pairwise(names):
        bottles = "bottle" if now == "One" else "bottles"
        after = "bottle" if then == "One" else "bottles"
        line = f"{now} green {bottles} hanging on the wall,\n"
        verses.append(
            line * 2 + "And if one green bottle should accidentally fall,\n"
            f"There'll be {then.lower()} green {after} hanging on the wall.\n\n"
        )
    return "".join(verses)


def twelve_days() -> str:
    """The Twelve Days of Christmas: a cumulative song, each verse repeats all before it."""
    days = "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth"
    gifts = [
        "a Partridge in a Pear Tree", "two Turtle Doves", "three French Hens",
        "four Calling Birds", "five Gold Rings", "six Geese-a-Laying", "seven Swans-a-Swimming",
        "eight Maids-a-Milking", "nine Ladies Dancing", "ten Lords-a-Leaping",
        "eleven Pipers Piping", "twelve Drummers Drumming",
    ]  # fmt: skip
    verses = []
    for i, day in enumerate(days.split()):
        given = gifts[: i + 1][::-1]
        if i:
            given[-1] = "and " + given[-1]
        verses.append(f"On the {day} day of Christmas my true love gave to me: ")
        verses.append(", ".join(given) + ".\n\n")
    return "".join(verses)
