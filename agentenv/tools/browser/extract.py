"""Bytes -> readable text: content types, charsets, HTML main content, PDF.

All functions here are synchronous CPU work; the tool runs them in a thread.
"""

from __future__ import annotations

import codecs
import io
import logging
import re
from typing import Literal

from agentenv.tools.browser.page import Page, PageError, RawPage

log = logging.getLogger(__name__)

Kind = Literal["html", "text", "pdf", "sniff", "binary"]

_HTML_TYPES = {"text/html", "application/xhtml+xml"}
_TEXT_TYPES = {"application/json", "application/xml", "application/javascript", "application/x-javascript",
               "application/ld+json", "application/rss+xml", "application/atom+xml"}
_SNIFF_TYPES = {"", "application/octet-stream", "binary/octet-stream", "application/unknown", "application/download"}
# Single-byte charsets decode any byte string without error, so declaring one
# proves nothing: bytes that are valid UTF-8 (with non-ASCII in them) are UTF-8.
_CATCH_ALL = {"ascii"} | {f"iso8859-{i}" for i in range(1, 17)} | {f"cp125{i}" for i in range(0, 9)}
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_BLANKS = re.compile(r"\n{3,}")
# Text codecs that are not document charsets (see `_codec`); utf-16/utf-32 with a BOM are read before.
_NOT_CHARSETS = {"punycode", "idna", "utf-7", "undefined", "unicode-escape", "raw-unicode-escape", "charmap", "utf-32"}
_WHATWG_ALIASES = {"utf-16": "utf-16-le"}

PDF_INSTALL_HINT = "PDF reading is not installed on this browser (an operator can `pip install 'agentenv[pdf]'`)"


def classify(content_type: str) -> Kind:
    """How a media type is read; `sniff` means look at the bytes, `binary` means refuse."""
    ct = content_type.lower()
    if ct in _HTML_TYPES:
        return "html"
    if ct == "application/pdf" or ct == "application/x-pdf":
        return "pdf"
    if ct.startswith("text/") or ct in _TEXT_TYPES or ct.endswith("+json") or ct.endswith("+xml"):
        return "text"
    if ct in _SNIFF_TYPES:
        return "sniff"
    return "binary"


def extract_page(raw: RawPage, full_extraction_max_bytes: int) -> Page:
    """Turn a fetched body into a `Page`.

    Raises:
        PageError: The body is binary, an unreadable PDF, cannot be decoded, or has no text.
    """
    kind = classify(raw.content_type)
    if kind == "sniff":
        kind = _sniff(raw.body)
    if kind == "binary":
        raise PageError("unsupported_type", unsupported_message(raw.content_type or "unknown", len(raw.body), raw.final_url))
    if kind == "pdf":
        title, text = _pdf(raw)
        encoding = None
    else:
        try:
            text, encoding = decode_body(raw.body, raw.charset, html=kind == "html")
            if kind == "html":
                title, text = html_to_text(text, raw.final_url, fast=len(raw.body) > full_extraction_max_bytes)
            else:
                title = ""
        except Exception as e:  # noqa: BLE001 - a hostile page is the page's fault: a result, never a crash
            raise PageError(
                "undecodable", f"the page {raw.final_url} could not be decoded as text ({type(e).__name__}: {e})"
            ) from None
    text = _BLANKS.sub("\n\n", text).strip()
    if not text:
        raise PageError("empty", f"the page {raw.final_url} has no readable text")
    return Page(
        url=raw.url,
        final_url=raw.final_url,
        title=title.strip(),
        text=text,
        content_type=raw.content_type,
        encoding=encoding,
        num_bytes=len(raw.body),
        truncated=raw.truncated,
    )


def unsupported_message(content_type: str, num_bytes: int | None, url: str) -> str:
    size = f", {_human(num_bytes)}" if num_bytes is not None else ""
    return (
        f"cannot read {url}: it is a binary file ({content_type}{size}). "
        "The browser reads HTML, plain text and PDF pages."
    )


def decode_body(body: bytes, declared: str | None, html: bool = False) -> tuple[str, str]:
    """Decode with the declared charset when it fits the bytes, else detect it.

    Order: byte-order mark; the declared charset (HTTP header, then for HTML a
    `<meta charset>`) unless it is a single-byte charset (or UTF-16 while the
    bytes hold no NUL) and the bytes are valid UTF-8; UTF-8; charset-normalizer's guess; UTF-8 with replacement.

    Returns:
        (text, codec name used)
    """
    for bom, enc in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if body.startswith(bom):
            return body.decode(enc, errors="replace"), enc
    candidates = [declared]
    if html:
        m = _META_CHARSET.search(body[:4096])
        candidates.append(m.group(1).decode("ascii", "ignore") if m else None)
    utf8 = _try(body, "utf-8")
    for name in candidates:
        codec = _codec(name)
        if codec is None:
            continue
        if utf8 is not None and (codec in _CATCH_ALL or (codec.startswith("utf-16") and b"\x00" not in body)):
            # UTF-16 of any Latin text is full of NUL bytes; bytes without one that are valid UTF-8 are UTF-8.
            return utf8, "utf-8"
        text = _try(body, codec)
        if text is not None:
            return text, codec
    if utf8 is not None:
        return utf8, "utf-8"
    guess = _detect(body)
    if guess is not None:
        return body.decode(guess, errors="replace"), guess
    return body.decode("utf-8", errors="replace"), "utf-8"


def html_to_text(html: str, url: str, fast: bool = False) -> tuple[str, str]:
    """Main content of an HTML page via trafilatura (boilerplate removed).

    Falls back to the whole page's text when trafilatura finds no main content
    (short pages, listings). `fast` skips main-content detection (huge pages).

    Returns:
        (title, text)
    """
    import trafilatura

    title = _title(html)
    text = None
    if not fast:
        try:
            # with_metadata would cost ~4x the extraction itself (date detection); the title comes from <title>.
            doc = trafilatura.bare_extraction(
                html, url=url, with_metadata=False, include_comments=False, include_tables=True, favor_recall=True
            )
        except Exception as e:  # trafilatura on hostile markup: fall back, never crash
            log.debug("trafilatura failed on %s: %s", url, e)
            doc = None
        if doc is not None:
            text = doc.text  # type: ignore[union-attr]  # as_dict=False (the default): a Document, never a dict
    if not text:
        text = trafilatura.html2txt(html) or ""
    return title or "", text


def _pdf(raw: RawPage) -> tuple[str, str]:
    try:
        import pypdf
    except ImportError:
        raise PageError("pdf_unavailable", f"cannot read the PDF {raw.final_url}: {PDF_INSTALL_HINT}") from None
    if raw.truncated:
        raise PageError("too_large", f"the PDF {raw.final_url} is larger than the browser's limit of {_human(len(raw.body))}")
    try:
        reader = pypdf.PdfReader(io.BytesIO(raw.body))
        title = ""
        if reader.metadata is not None and reader.metadata.title:
            title = str(reader.metadata.title)
        text = "\n\n".join((p.extract_text() or "").strip() for p in reader.pages)
    except Exception as e:  # pypdf raises many types on broken files
        raise PageError("broken", f"the PDF {raw.final_url} could not be read ({type(e).__name__}: {e})") from None
    return title, text


def _sniff(body: bytes) -> Kind:
    head = body[:1024].lstrip()
    if head.startswith(b"%PDF-"):
        return "pdf"
    low = head[:512].lower()
    if low.startswith((b"<!doctype html", b"<html")) or b"<body" in low or b"<head" in low:
        return "html"
    sample = body[:8192]
    if not sample or b"\x00" in sample:
        return "binary"
    if _try(sample, "utf-8") is not None:
        return "text"
    guess = _detect(sample)
    if guess is None:
        return "binary"
    text = sample.decode(guess, errors="replace")
    printable = sum(c.isprintable() or c.isspace() for c in text)
    return "text" if printable > 0.97 * len(text) else "binary"


def _detect(body: bytes) -> str | None:
    from charset_normalizer import from_bytes

    matches = list(from_bytes(body[:200_000]))
    if not matches:
        return None
    best = matches[0]
    # Western pages are the common case and cp1250/cp1252 decode most Western
    # text identically, so the detector's ties often land on the wrong one; the
    # WHATWG default for legacy pages is windows-1252.
    for m in matches:
        if m.encoding == "cp1252" and m.chaos <= best.chaos + 0.01 and m.coherence >= best.coherence - 0.05:
            return "cp1252"
    return best.encoding


def _codec(name: str | None) -> str | None:
    """The Python codec a declared charset names, if it is a charset a page can be written in.

    A page picks the name, so it must not pick any codec: `zlib`, `bz2` or
    `base64` would run a decompressor or a transform on the body (`zlib` without
    a size limit), and `punycode`, `idna`, `utf-7` or `unicode_escape` are text
    codecs no web page is written in. Like browsers (WHATWG Encoding), `utf-16`
    without a byte-order mark means UTF-16LE; `utf-32` has no web meaning.
    """
    if not name:
        return None
    try:
        info = codecs.lookup(name.strip().strip("'\""))
    except (LookupError, ValueError, TypeError):  # ValueError: a name with NUL in it
        return None
    if not getattr(info, "_is_text_encoding", True) or info.name in _NOT_CHARSETS:
        return None
    return _WHATWG_ALIASES.get(info.name, info.name)


def _try(body: bytes, codec: str) -> str | None:
    """Strict decode, except that an incomplete character at the very end is dropped
    (a body cut at the size cap, or a sniffing sample, may end mid-character).
    Any failure of the codec is a non-match, never an exception."""
    try:
        return codecs.getincrementaldecoder(codec)().decode(body, final=False)
    except Exception:  # noqa: BLE001 - UnicodeError, or whatever a codec raises on hostile bytes
        return None


_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)


def _title(html: str) -> str:
    import html as htmllib

    m = _TITLE.search(html[:200_000])
    return " ".join(htmllib.unescape(m.group(1)).split()) if m else ""


def _human(n: int) -> str:
    if n < 1000:
        return f"{n} bytes"
    return f"{n / 1e3:.1f} kB" if n < 1_000_000 else f"{n / 1e6:.1f} MB"
