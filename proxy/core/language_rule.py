"""The instruction that asks the model for a language, and where it goes in each surface's request.

An explicit instruction in the user's own language measurably reduces drift into English (or
Chinese) on long answers; it is written in that language where a native sentence is known, else
in English naming the language. Chat gets it in its system message, Responses in
``instructions``, Messages in ``system``; completions get none (their prompt is raw text the
proxy must not edit). :func:`request_turns` reads the texts the expected language is derived
from (:mod:`proxy.core.requested_language`). Pure: dicts in, dicts out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.core.language_names import english_name
from proxy.core.records import Endpoint
from proxy.core.requested_language import Expectation, Role

LANGUAGE_INSTRUCTIONS: Mapping[str, str] = {
    "en": "Respond only in English. Do not use any other language.",
    "it": "Rispondi esclusivamente in italiano. Non usare altre lingue.",
    "fr": "Réponds uniquement en français. N'utilise aucune autre langue.",
    "de": "Antworte ausschließlich auf Deutsch. Verwende keine andere Sprache.",
    "es": "Responde únicamente en español. No uses ningún otro idioma.",
    "pt": "Responda exclusivamente em português. Não use nenhum outro idioma.",
    "nl": "Antwoord uitsluitend in het Nederlands. Gebruik geen andere taal.",
    "pl": "Odpowiadaj wyłącznie po polsku. Nie używaj żadnego innego języka.",
    "ru": "Отвечай только на русском языке. Не используй другие языки.",
    "uk": "Відповідай лише українською мовою. Не використовуй інших мов.",
    "zh": "请只用中文回答。不要使用其他语言。",
    "ja": "日本語のみで回答してください。他の言語は使用しないでください。",
    "ko": "한국어로만 답변하세요. 다른 언어를 사용하지 마세요.",
    "tr": "Yalnızca Türkçe yanıt ver. Başka bir dil kullanma.",
    "sv": "Svara endast på svenska. Använd inget annat språk.",
    "cs": "Odpovídej výhradně česky. Nepoužívej žádný jiný jazyk.",
    "hi": "केवल हिंदी में उत्तर दें। किसी अन्य भाषा का उपयोग न करें।",
    "ar": "أجب باللغة العربية فقط. لا تستخدم أي لغة أخرى.",
    "id": "Jawablah hanya dalam bahasa Indonesia. Jangan gunakan bahasa lain.",
    "vi": "Chỉ trả lời bằng tiếng Việt. Không sử dụng ngôn ngữ nào khác.",
    "th": "ตอบเป็นภาษาไทยเท่านั้น ห้ามใช้ภาษาอื่น",
    "el": "Απάντησε μόνο στα ελληνικά. Μη χρησιμοποιείς καμία άλλη γλώσσα.",
    "he": "ענה רק בעברית. אל תשתמש בשום שפה אחרת.",
    "fa": "فقط به زبان فارسی پاسخ بده. از هیچ زبان دیگری استفاده نکن.",
}


def language_instruction(code: str) -> str:
    """The instruction for ``code``, in that language where we have it, else in English naming
    the language (its English name from langcodes, :mod:`proxy.core.language_names`)."""
    if code in LANGUAGE_INSTRUCTIONS:
        return LANGUAGE_INSTRUCTIONS[code]
    name = english_name(code) or f"the language with ISO 639-1 code '{code}'"
    return f"Respond only in {name}. Do not use any other language."


def _injected(setting: str, expectation: Expectation) -> str | None:
    """The language to inject: only a strong expectation (an explicit setting or request, or a
    prompt in a language other than English) is told to the model; a weak one (a language the
    prompt is about, an English prompt) is not, since an instruction could contradict a request
    the derivation did not read."""
    if setting == "off" or expectation.strength != "strong":
        return None
    return expectation.code


def constrain_surface_language(
    body: dict[str, Any], endpoint: Endpoint, setting: str, expectation: Expectation
) -> str | None:
    """The language constraint in ``instructions`` (Responses) or ``system`` (Messages)."""
    code = _injected(setting, expectation)
    if code is None:
        return None
    instruction = language_instruction(code)
    key = "instructions" if endpoint == "responses" else "system"
    current = body.get(key)
    if isinstance(current, str) and current:
        if instruction not in current:
            body[key] = f"{current}\n\n{instruction}"
    elif isinstance(current, list):
        body[key] = [*current, {"type": "text", "text": instruction}]
    else:
        body[key] = instruction
    return code


def constrain_language(
    body: dict[str, Any], endpoint: Endpoint, setting: str, expectation: Expectation
) -> str | None:
    """Inject the expected language's instruction (chat only; the language whose instruction
    was injected, or None). Completions get none: their prompt is raw text we must not edit."""
    code = _injected(setting, expectation)
    if code is None or endpoint != "chat":
        return None
    add_system_instruction(body, language_instruction(code))
    return code


def request_turns(body: dict[str, Any], endpoint: Endpoint) -> list[tuple[Role, str]]:
    """Every text of any surface's request in order, with who wrote it: system and developer
    messages, Responses ``instructions`` and Messages ``system`` (the operator's), user turns,
    and assistant turns (the model's own, which the derivation does not read). A completion's
    prompt is the user's."""
    if endpoint == "completions":
        prompt = body.get("prompt")
        return [("user", prompt)] if isinstance(prompt, str) else []
    out: list[tuple[Role, str]] = []
    if endpoint == "responses":
        given = body.get("instructions")
        if isinstance(given, str):
            out.append(("system", given))
        turns = body.get("input")
        if isinstance(turns, str):
            out.append(("user", turns))
            return out
    elif endpoint == "messages":
        system = body.get("system")
        if isinstance(system, str):
            out.append(("system", system))
        elif isinstance(system, list):
            out.append(("system", message_text({"content": system})))
        turns = body.get("messages")
    else:
        turns = body.get("messages")
    for message in turns if isinstance(turns, list) else ():
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role in ("system", "developer"):
            out.append(("system", message_text(message)))
        elif role in ("user", "assistant"):
            out.append((role, message_text(message)))
    return out


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def add_system_instruction(body: dict[str, Any], instruction: str) -> None:
    messages = list(body["messages"])
    first = messages[0]
    if first.get("role") in ("system", "developer"):
        content = first.get("content")
        if isinstance(content, str):
            if instruction not in content:
                messages[0] = {**first, "content": f"{content}\n\n{instruction}".lstrip()}
        elif isinstance(content, list):
            messages[0] = {**first, "content": [*content, {"type": "text", "text": instruction}]}
        else:
            messages[0] = {**first, "content": instruction}
    else:
        messages.insert(0, {"role": "system", "content": instruction})
    body["messages"] = messages
