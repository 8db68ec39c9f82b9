"""Bytes to text: content types, charsets, HTML fallbacks."""

from __future__ import annotations

import pytest

from agentenv.tools.browser.extract import classify, decode_body, extract_page, html_to_text
from agentenv.tools.browser.page import PageError, RawPage

FR = "Le café de Zürich est très réputé; René Lefèvre sert des crêpes à l'intérieur."


def raw(body: bytes, content_type: str = "text/html", charset: str | None = None) -> RawPage:
    return RawPage("http://x/", "http://x/", 200, content_type, charset, body, False, 0)


@pytest.mark.parametrize(
    "ctype,kind",
    [("text/html", "html"), ("application/xhtml+xml", "html"), ("text/plain", "text"), ("text/markdown", "text"),
     ("application/json", "text"), ("application/pdf", "pdf"), ("", "sniff"), ("application/octet-stream", "sniff"),
     ("image/png", "binary"), ("application/zip", "binary"), ("video/mp4", "binary")],
)
def test_classify(ctype, kind):
    assert classify(ctype) == kind


@pytest.mark.parametrize(
    "body,declared,expected_codec",
    [
        (FR.encode("utf-8"), "utf-8", "utf-8"),
        (FR.encode("utf-8"), "iso-8859-1", "utf-8"),  # single-byte declared, bytes are UTF-8
        (FR.encode("utf-8"), None, "utf-8"),
        (FR.encode("cp1252") * 3, "utf-8", "cp1252"),  # declared UTF-8, bytes are not
        (FR.encode("cp1252") * 3, None, "cp1252"),
        (FR.encode("utf-16"), None, "utf-16"),  # BOM
        ("Zażółć gęślą jaźń, powiedział Łukasz w Łodzi.".encode("iso-8859-2"), "iso-8859-2", "iso8859-2"),
    ],
)
def test_decode_body(body, declared, expected_codec):
    text, codec = decode_body(body, declared)
    assert codec == expected_codec
    assert "ł" in text or "René Lefèvre" in text


@pytest.mark.parametrize("declared", [None, "utf-8", "iso-8859-1"])
def test_body_cut_mid_character_still_decodes_as_utf8(declared):
    body = ("Zürich café " * 100).encode("utf-8")
    cut = body[: body.index("é".encode()) + 1]  # ends inside "é"
    text, codec = decode_body(cut, declared)
    assert codec == "utf-8" and text.endswith("Zürich caf") and "ü" in text


def test_meta_charset_is_used_when_the_header_has_none():
    html = '<html><head><meta charset="iso-8859-2"></head><body>Łódź</body></html>'.encode("iso-8859-2")
    text, codec = decode_body(html, None, html=True)
    assert codec == "iso8859-2" and "Łódź" in text


def test_short_html_without_main_content_falls_back_to_all_text():
    title, text = html_to_text("<html><head><title>T</title></head><body><div>Opening hours: 9-17</div></body></html>", "http://x/")
    assert title == "T" and "Opening hours: 9-17" in text


def test_sniffed_types():
    assert extract_page(raw(b"<!DOCTYPE html><html><body><p>Hello sniffed world.</p></body></html>", ""), 10**6).text
    assert "plain words" in extract_page(raw(b"just plain words here", "application/octet-stream"), 10**6).text
    with pytest.raises(PageError, match="binary file"):
        extract_page(raw(bytes(range(256)) * 10, ""), 10**6)


def test_empty_page_is_an_error():
    with pytest.raises(PageError, match="no readable text") as e:
        extract_page(raw(b"<html><body></body></html>"), 10**6)
    assert e.value.reason == "empty"


def test_huge_html_uses_the_fast_extractor():
    body = ("<html><body>" + "<p>Some paragraph with words.</p>" * 2000 + "</body></html>").encode()
    page = extract_page(raw(body), full_extraction_max_bytes=1000)
    assert page.text.count("Some paragraph with words.") == 2000


def test_broken_pdf_is_an_error():
    pytest.importorskip("pypdf")
    with pytest.raises(PageError, match="could not be read"):
        extract_page(raw(b"%PDF-1.4 garbage", "application/pdf"), 10**6)
