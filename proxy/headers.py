"""Which headers cross the proxy, in each direction."""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict, CIMultiDictProxy

from ctxproxy.proxy.errors import BadRequest

# RFC 9110 7.6.1 hop-by-hop headers, plus the ones the proxy recomputes itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Identity headers meant for ctxproxy alone: never forwarded upstream.
PRIVATE_PREFIXES = ("x-tdai-", "x-ctxproxy-")


def _connection_tokens(headers: CIMultiDictProxy[str]) -> set[str]:
    tokens: set[str] = set()
    for value in headers.getall("connection", ()):
        tokens.update(t.strip().lower() for t in value.split(","))
    return tokens


def _copy(headers: CIMultiDictProxy[str], drop: Iterable[str]) -> CIMultiDict[str]:
    dropped = HOP_BY_HOP | _connection_tokens(headers) | set(drop)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower in dropped or lower.startswith(PRIVATE_PREFIXES):
            continue
        out.add(name, value)
    return out


def request_headers(
    headers: CIMultiDictProxy[str],
    upstream_authorization: str | None,
    *,
    body_decoded: bool = False,
) -> CIMultiDict[str]:
    """End-to-end request headers for the upstream; the configured key replaces the client's.

    ``body_decoded``: the body goes out decoded, so its Content-Encoding no longer applies
    (and Content-Length, dropped with the hop-by-hop ones, is recomputed by the client).
    """
    drop = ("authorization",) if upstream_authorization else ()
    out = _copy(headers, (*drop, "content-encoding") if body_decoded else drop)
    if upstream_authorization:
        out["Authorization"] = upstream_authorization
    return out


def check_utf8(headers: CIMultiDictProxy[str]) -> None:
    """Refuse a request with a header that is not UTF-8 before anything reads it.

    aiohttp decodes such bytes to lone surrogates: an identity digested from one, a store
    row or a log line holding one, or the header forwarded (aiohttp's client would send it
    altered) would each fail or change it somewhere later."""
    for name, value in headers.items():
        if not value.isascii() and not _utf8(value):
            raise BadRequest(f"header {name} is not valid UTF-8")


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def response_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """End-to-end response headers for the client (length kept: the body is relayed unchanged)."""
    out = _copy(headers, ())
    if "content-length" in headers and "transfer-encoding" not in headers:
        out["Content-Length"] = headers["content-length"]
    return out
