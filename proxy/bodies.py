"""Content codings at the edge: request bodies decoded once, response streams read on the side.

A request body goes upstream decoded and without its ``Content-Encoding``: the pipeline has to
read it, and one rule for every route keeps the header and the bytes in agreement. The
server is run with ``auto_decompress=False`` (``SERVER_OPTIONS``) so that every coding reaches
this module and an unknown one gets a JSON 415 rather than aiohttp's plain-text 400; when a
server does decode (its default), the body arrives decoded and only the header is dropped.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from aiohttp import web

from ctxproxy.proxy.errors import BadRequest, BodyTooLarge, UnsupportedEncoding

__all__ = [
    "DECODED",
    "SERVER_OPTIONS",
    "StreamDecoder",
    "codings",
    "decode_request_body",
]

# Keyword arguments for web.AppRunner (or web.Application's handler_args).
SERVER_OPTIONS: dict[str, Any] = {"auto_decompress": False}

# Set on a request whose body was decoded: its Content-Encoding must not be forwarded.
DECODED = web.RequestKey("body_decoded", bool)

_GZIP = ("gzip", "x-gzip")
_DEFLATE = ("deflate",)
SUPPORTED = (*_GZIP, *_DEFLATE)
# Bigger bodies are decoded in a worker thread (zlib releases the GIL), off the event loop.
_THREAD_BYTES = 256 * 1024
# The most the response-side decoder returns at once: a small chunk may expand a lot.
_PIECE = 1024 * 1024


def codings(values: Sequence[str]) -> list[str]:
    """The codings of the Content-Encoding header lines, in the order applied, no identity."""
    found = [c.strip().lower() for value in values for c in value.split(",")]
    return [c for c in found if c and c != "identity"]


async def decode_request_body(request: web.Request, raw: bytes, limit: int) -> bytes:
    """``raw`` without its content codings, at most ``limit`` bytes decoded.

    Raises UnsupportedEncoding (415) for a coding the proxy cannot decode, BadRequest for
    bytes that are not what their coding says, BodyTooLarge when the decoded body is too big.
    """
    applied = codings(request.headers.getall("Content-Encoding", ()))
    if not applied:
        return raw
    request[DECODED] = True
    # aiohttp counts the compressed bytes only when its server decoded the body itself.
    if getattr(request.content, "total_compressed_bytes", None) is not None:
        return raw
    unsupported = [c for c in applied if c not in SUPPORTED]
    if unsupported:
        raise UnsupportedEncoding(
            f"Content-Encoding {', '.join(unsupported)} is not supported; send the body "
            "uncompressed, or as gzip or deflate"
        )
    if len(raw) > _THREAD_BYTES:
        return await asyncio.to_thread(_decode_all, raw, applied, limit)
    return _decode_all(raw, applied, limit)


def _decode_all(raw: bytes, applied: list[str], limit: int) -> bytes:
    body = raw
    for coding in reversed(applied):  # the last coding listed was applied last
        body = _decode(body, coding, limit)
    return body


def _decode(data: bytes, coding: str, limit: int) -> bytes:
    """One coding undone, every gzip member of it, never more than ``limit`` bytes out."""
    out = bytearray()
    try:
        while data:
            decoder = zlib.decompressobj(_wbits(coding, data))
            # max_length bounds the output: a small bomb never expands past the limit.
            out += decoder.decompress(data, limit + 1 - len(out))
            if len(out) > limit or decoder.unconsumed_tail:
                raise BodyTooLarge(f"request body is over {limit} bytes once decoded")
            if not decoder.eof:
                raise BadRequest(f"request body is truncated {coding} data")
            data = decoder.unused_data
    except zlib.error as exc:
        raise BadRequest(f"request body is not valid {coding} data: {exc}") from exc
    return bytes(out)


def _wbits(coding: str, data: bytes) -> int:
    if coding in _GZIP:
        return 16 + zlib.MAX_WBITS
    # deflate means zlib-wrapped (RFC 9110 8.4.1.2), but some clients send a raw stream;
    # a zlib header's low nibble is 8, as aiohttp checks too.
    return zlib.MAX_WBITS if data[0] & 0x0F == 8 else -zlib.MAX_WBITS


class StreamDecoder:
    """Decodes a gzip or deflate response stream chunk by chunk, to read it on the side.

    The relayed bytes are never touched; a stream this cannot decode yields nothing.
    """

    def __init__(self, content_encoding: str) -> None:
        applied = codings([content_encoding])
        self._identity = not applied
        self._coding = applied[0] if len(applied) == 1 and applied[0] in SUPPORTED else None
        self._decoder: zlib._Decompress | None = None
        self.failed = self._coding is None and not self._identity

    def decode(self, chunk: bytes) -> Iterator[bytes]:
        """The decoded bytes of ``chunk``, in pieces of at most 1 MiB."""
        if self._identity:
            yield chunk
            return
        data = chunk
        while data and not self.failed:
            if self._decoder is None:
                assert self._coding is not None
                self._decoder = zlib.decompressobj(_wbits(self._coding, data))
            try:
                piece = self._decoder.decompress(data, _PIECE)
            except zlib.error:
                self.failed = True
                return
            if piece:
                yield piece
            if self._decoder.eof:  # the next gzip member, if any, starts afresh
                data = self._decoder.unused_data
                self._decoder = None
            else:
                data = self._decoder.unconsumed_tail
