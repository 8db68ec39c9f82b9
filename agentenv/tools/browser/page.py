"""What a fetch produces: the raw body, the page as text, and the error a model reads."""

from __future__ import annotations

from dataclasses import dataclass


class PageError(Exception):
    """A page could not be read; the message is for the model.

    Attributes:
        reason: Short code for metadata and tests (`timeout`, `http_status`,
            `redirect_loop`, `too_many_redirects`, `blocked`, `bad_url`, `dns`,
            `connect`, `unsupported_type`, `broken`, `empty`, `pdf_unavailable`, ...).
    """

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True)
class RawPage:
    """A response body as read off the wire.

    Attributes:
        url: The url asked for.
        final_url: The url of the response read (after redirects).
        status: HTTP status of that response.
        content_type: Media type from the Content-Type header, lowercase ("" when absent).
        charset: Declared charset from the Content-Type header, if any.
        body: Body bytes (content-decoded), at most `max_bytes`.
        truncated: The body was longer than `max_bytes` and was cut.
        redirects: Redirects followed.
    """

    url: str
    final_url: str
    status: int
    content_type: str
    charset: str | None
    body: bytes
    truncated: bool
    redirects: int


@dataclass(frozen=True)
class Page:
    """A fetched page as text (what the cache keeps).

    Attributes:
        url: The url asked for.
        final_url: Where it ended after redirects.
        title: The page's title ("" when it has none).
        text: Main content as plain text, paragraphs separated by newlines.
        content_type: The response's media type (`text/html`, ...).
        encoding: The charset the text was decoded with (None for PDF).
        num_bytes: Body bytes read.
        truncated: True when the body was cut at `BrowserConfig.max_bytes`.
    """

    url: str
    final_url: str
    title: str
    text: str
    content_type: str
    encoding: str | None
    num_bytes: int
    truncated: bool
