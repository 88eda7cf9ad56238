"""Which headers cross the proxy, in each direction."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from multidict import CIMultiDict, CIMultiDictProxy

from ctxproxy.config import Settings
from ctxproxy.proxy.errors import BadRequest, NoUpstreamKey

__all__ = ["CREDENTIAL_HEADERS", "Credential", "check_utf8", "request_headers",
           "response_headers", "upstream_credential"]

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


# Where a client puts its key: OpenAI's clients in Authorization, Anthropic's (Claude Code,
# the anthropic SDK) in x-api-key, or in Authorization for an OAuth-style token.
CREDENTIAL_HEADERS = ("authorization", "x-api-key")


@dataclass(frozen=True, slots=True)
class Credential:
    """The client's headers its upstream request leaves out, and the ones put in instead."""

    drop: tuple[str, ...] = ()
    add: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # a secret


def upstream_credential(settings: Settings, *, anthropic: bool, keyed: bool,
                        chat: bool = False) -> Credential:
    """What a request to the OpenAI upstream, or (``anthropic``) to ANTHROPIC_URL, or
    (``chat``) a Chat Completions request, to CHAT_URL when that is set, carries as its
    credential. ``keyed``: under CLIENT_KEYS, where whatever credential the client sent is
    its key to this proxy and never leaves it (settings refuse CHAT_URL without its key
    there).

    Raises NoUpstreamKey for an Anthropic request under client keys with no
    ANTHROPIC_API_KEY: it would reach Anthropic with no key, or with the client's.
    """
    drop = CREDENTIAL_HEADERS if keyed else ()
    if anthropic:
        key = settings.anthropic_api_key
        if key is not None:
            return Credential(CREDENTIAL_HEADERS, (("x-api-key", key.get_secret_value()),))
        if keyed:
            raise NoUpstreamKey(
                "this proxy has no key for the Anthropic API: set CTXPROXY_ANTHROPIC_API_KEY "
                "(client keys are never forwarded upstream)")
        return Credential()
    key = settings.chat_api_key if chat and settings.chat_url else settings.upstream_api_key
    if key is None:
        return Credential(drop)
    return Credential(drop or ("authorization",),
                      (("Authorization", f"Bearer {key.get_secret_value()}"),))


def request_headers(
    headers: CIMultiDictProxy[str],
    credential: Credential,
    *,
    body_decoded: bool = False,
) -> CIMultiDict[str]:
    """End-to-end request headers for the upstream, with ``credential`` in place of the
    client's.

    ``body_decoded``: the body goes out decoded, so its Content-Encoding no longer applies
    (and Content-Length, dropped with the hop-by-hop ones, is recomputed by the client).
    """
    drop = credential.drop
    out = _copy(headers, (*drop, "content-encoding") if body_decoded else drop)
    for name, value in credential.add:
        out[name] = value
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
