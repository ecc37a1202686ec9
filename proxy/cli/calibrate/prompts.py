"""The calibration prompts: five kinds of task, each written in several languages.

Each task is a kind of generation where degeneration shows up differently: a long numbered
narrative (the classic loop), free prose (drift), a technical answer, commented code (where
repetition is normal and must not count), and a long list (counter loops). A prompt is written
*in* its language, so the model answers in it and the detector expects it (language drift counts
as degeneration).
"""

from __future__ import annotations

TASKS: tuple[str, ...] = ("narrative", "prose", "qa", "code", "list")

PROMPTS: dict[str, dict[str, str]] = {
    "narrative": {
        "en": "Write a 75-paragraph story, numbering each paragraph.",
        "it": "Scrivi una storia di 75 paragrafi, numerando ogni paragrafo.",
        "de": "Schreibe eine Geschichte mit 75 Absätzen und nummeriere jeden Absatz.",
        "fr": "Écris une histoire de 75 paragraphes en numérotant chaque paragraphe.",
        "es": "Escribe una historia de 75 párrafos, numerando cada párrafo.",
    },
    "prose": {
        "en": "Write a long essay about the history of the city you know best.",
        "it": "Scrivi un lungo saggio sulla storia della città che conosci meglio.",
        "de": "Schreibe einen langen Aufsatz über die Geschichte der Stadt, die du am besten "
        "kennst.",
        "fr": "Écris un long essai sur l'histoire de la ville que tu connais le mieux.",
        "es": "Escribe un ensayo largo sobre la historia de la ciudad que mejor conoces.",
    },
    "qa": {
        "en": "Explain in detail how a TCP connection is opened and closed, step by step.",
        "it": "Spiega in dettaglio come si apre e si chiude una connessione TCP, passo dopo passo.",
        "de": "Erkläre ausführlich, Schritt für Schritt, wie eine TCP-Verbindung aufgebaut und "
        "wieder abgebaut wird.",
        "fr": "Explique en détail, étape par étape, comment une connexion TCP est ouverte puis "
        "fermée.",
        "es": "Explica en detalle, paso a paso, cómo se abre y se cierra una conexión TCP.",
    },
    "code": {
        "en": "Write a Python module that implements a small bank account class, with a comment "
        "on every line.",
        "it": "Scrivi un modulo Python che implementa una piccola classe conto bancario, con un "
        "commento in italiano su ogni riga.",
        "de": "Schreibe ein Python-Modul mit einer kleinen Bankkonto-Klasse und einem deutschen "
        "Kommentar in jeder Zeile.",
        "fr": "Écris un module Python qui implémente une petite classe de compte bancaire, avec "
        "un commentaire en français sur chaque ligne.",
        "es": "Escribe un módulo de Python que implemente una pequeña clase de cuenta bancaria, "
        "con un comentario en español en cada línea.",
    },
    "list": {
        "en": "List 100 different animals, one per line, each with a short description.",
        "it": "Elenca 100 animali diversi, uno per riga, ciascuno con una breve descrizione.",
        "de": "Nenne 100 verschiedene Tiere, eines pro Zeile, jedes mit einer kurzen Beschreibung.",
        "fr": "Donne une liste de 100 animaux différents, un par ligne, chacun avec une courte "
        "description.",
        "es": "Enumera 100 animales diferentes, uno por línea, cada uno con una breve descripción.",
    },
}

LANGUAGES: tuple[str, ...] = ("en", "it", "de", "fr", "es")
