"""Start-up loads what the detector would otherwise load inside a request (where it would
stall every stream of the worker): the language model and the salad signal's word lists that
requests may need."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from proxy.detect.salad import SALAD_LANGUAGES, lexicon
from proxy.server.app import _salad_languages
from proxy.settings import load_settings


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"language": "it"}, {"it"}),
        ({"language": "en", "expect_language": "off"}, {"en"}),
        ({"language": "ja", "expect_language": "off"}, set()),
        ({"language": "off", "expect_language": "off"}, set()),
        ({"language": "off", "expect_language": "prompt"}, set(SALAD_LANGUAGES)),
        ({"language": "auto", "expect_language": "off"}, set(SALAD_LANGUAGES)),
    ],
)
def test_which_word_lists_a_worker_loads(overrides: dict[str, str], expected: set[str]) -> None:
    assert _salad_languages(load_settings(**overrides)) == expected


def test_start_up_loads_the_lists_before_the_first_request(
    proxy_server: Callable[..., str],
) -> None:
    lexicon.cache_clear()
    base = proxy_server(language="pt")
    assert httpx.get(base + "/health").status_code == 200
    info = lexicon.cache_info()
    assert (info.currsize, info.misses) == (1, 1)
    lexicon("pt")
    assert lexicon.cache_info().hits == info.hits + 1  # the request path finds it loaded
