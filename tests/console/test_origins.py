"""Allowed origins are normalised to what browsers send in the Origin header."""
from __future__ import annotations

import pytest

from console.origins import MAX_ORIGINS, InvalidOrigin, normalize_origin, parse_origin_lines


@pytest.mark.parametrize(
    "raw, origin",
    [
        ("https://shop.example", "https://shop.example"),
        ("http://localhost:8000", "http://localhost:8000"),
        ("  HTTPS://Shop.Example  ", "https://shop.example"),
        ("https://shop.example/", "https://shop.example"),
        ("https://shop.example:443", "https://shop.example"),
        ("http://shop.example:80", "http://shop.example"),
        ("https://shop.example:8443", "https://shop.example:8443"),
        ("http://127.0.0.1:3000", "http://127.0.0.1:3000"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("https://bücher.example", "https://xn--bcher-kva.example"),
    ],
)
def test_an_origin_is_accepted_in_the_form_a_browser_sends(raw, origin):
    assert normalize_origin(raw) == origin


@pytest.mark.parametrize(
    "raw",
    [
        "shop.example",
        "localhost:8000",
        "ftp://shop.example",
        "https://",
        "https://shop.example/path",
        "https://shop.example/?q=1",
        "https://shop.example#top",
        "https://shop.example?",
        "https://user:pw@shop.example",
        "https://shop.example:0x50",
        "https://shop.example:70000",
        "https://*.shop.example",
        "https://shop .example",
        "*",
    ],
)
def test_anything_that_is_not_an_origin_is_refused(raw):
    with pytest.raises(InvalidOrigin):
        normalize_origin(raw)


def test_lines_are_normalised_deduplicated_and_blank_lines_skipped():
    origins, errors = parse_origin_lines("https://a.example\n\nHTTPS://A.example/\nhttp://localhost:8000\n")
    assert (origins, errors) == (["https://a.example", "http://localhost:8000"], [])


def test_each_bad_line_is_reported_with_its_number():
    _, errors = parse_origin_lines("https://ok.example\nhttps://bad.example/x\nnope")
    assert [e.split(":")[0] for e in errors] == ["line 2", "line 3"]


def test_more_than_the_maximum_number_of_origins_is_refused():
    text = "\n".join(f"https://s{i}.example" for i in range(MAX_ORIGINS + 1))
    _, errors = parse_origin_lines(text)
    assert errors == [f"at most {MAX_ORIGINS} origins per key"]
