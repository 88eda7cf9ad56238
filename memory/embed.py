"""Embeddings through the API everyone serves: ``POST {CTXPROXY_EMBEDDINGS_URL}/embeddings``.

OpenAI, Ollama, vLLM, llama.cpp and TEI all answer ``{"input": [...], "model": ...}`` with
``{"data": [{"index": i, "embedding": [...]}]}``. ``HttpEmbedder.embed`` raises
``EmbedError`` only: a timeout, an HTTP error, an answer that is not a list of finite vectors
of one size per input. After ``FAILURES`` failures in a row the breaker opens for
``COOLDOWN_S``: calls fail at once, then one call tries again. Callers degrade (recall stays
lexical, ingest retries later); an embeddings endpoint never fails the agent's request.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import httpx
import numpy as np
import orjson

from ctxproxy.config import Settings

__all__ = [
    "COOLDOWN_S", "FAILURES", "Breaker", "EmbedError", "Embedder", "HttpEmbedder",
    "embedder_from",
]

FAILURES = 3
COOLDOWN_S = 30.0
MAX_ANSWER_BYTES = 64 * 1024 * 1024
MAX_INPUT_CHARS = 8000  # a text is cut here: every model reads only its first few hundred tokens


class EmbedError(Exception):
    """An embeddings call failed; the message says why (never the key)."""


class Embedder(Protocol):
    """Texts to unit vectors (float32, one row per text)."""

    model: str

    async def embed(self, texts: Sequence[str], *, timeout_s: float) -> np.ndarray: ...


class Breaker:
    """Opens after ``failures`` failures in a row; lets one call through after ``cooldown_s``."""

    def __init__(
        self, failures: int = FAILURES, cooldown_s: float = COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._failures = failures
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._in_a_row = 0
        self._open_until = 0.0

    @property
    def open(self) -> bool:
        return self._in_a_row >= self._failures and self._clock() < self._open_until

    def ok(self) -> None:
        self._in_a_row = 0

    def failed(self) -> None:
        self._in_a_row += 1
        if self._in_a_row >= self._failures:
            self._open_until = self._clock() + self._cooldown_s


def embedder_from(settings: Settings) -> HttpEmbedder | None:
    """The embeddings client when ``CTXPROXY_EMBEDDINGS_URL`` is set, else None (lexical)."""
    if not settings.embeddings_url:
        return None
    key = settings.embeddings_api_key
    return HttpEmbedder(
        settings.embeddings_url, model=settings.embeddings_model,
        api_key=key.get_secret_value() if key is not None else None,
        # The client's bound is the ingest batches'; a turn's question passes its own.
        timeout_s=settings.embeddings_timeout_ms / 1000 * 10,
    )


class HttpEmbedder:
    """One httpx client for the process, closed with ``aclose``."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
        breaker: Breaker | None = None,
    ) -> None:
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.model = model
        self.dim: int | None = None  # the model's, from its first answer
        self.breaker = breaker or Breaker()
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=httpx.Timeout(timeout_s),
            transport=transport, follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def embed(self, texts: Sequence[str], *, timeout_s: float) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        if self.breaker.open:
            raise EmbedError("circuit open after repeated failures")
        try:
            # One deadline for the whole call: httpx's timeouts are per read, and a server
            # that drips its answer would pass them all.
            async with asyncio.timeout(timeout_s):
                raw = await self._post([t[:MAX_INPUT_CHARS] for t in texts], timeout_s)
            vectors = self._parse(raw, len(texts))
        except TimeoutError as exc:
            self.breaker.failed()
            raise EmbedError(f"no answer within {round(timeout_s * 1000)} ms") from exc
        except EmbedError:
            self.breaker.failed()
            raise
        self.breaker.ok()
        return vectors

    async def _post(self, texts: list[str], timeout_s: float) -> bytes:
        body = orjson.dumps({"input": texts, "model": self.model})
        try:
            async with self._client.stream(
                "POST", "/embeddings", content=body, timeout=httpx.Timeout(timeout_s)
            ) as response:
                if not response.is_success:
                    raise EmbedError(f"HTTP {response.status_code}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise EmbedError(f"answer is over {MAX_ANSWER_BYTES} bytes")
                    chunks.append(chunk)
        except httpx.TimeoutException as exc:
            raise EmbedError(f"no answer within {round(timeout_s * 1000)} ms") from exc
        except httpx.HTTPError as exc:
            raise EmbedError(f"{type(exc).__name__}: {exc}") from exc
        return b"".join(chunks)

    def _parse(self, raw: bytes, n: int) -> np.ndarray:
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise EmbedError("answer is not JSON") from exc
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or len(data) != n:
            raise EmbedError(f"answer has no data list of {n} embeddings")
        vectors = parse_vectors(data, n, self.dim)
        self.dim = vectors.shape[1]
        return vectors


def parse_vectors(data: list[Any], n: int, dim: int | None) -> np.ndarray:
    """The ``data`` items as unit rows in input order; EmbedError for anything else."""
    rows: list[Any] = [None] * n
    for position, item in enumerate(data):
        if not isinstance(item, dict):
            raise EmbedError("an embedding item is not an object")
        index = item.get("index", position)
        vector = item.get("embedding")
        if not isinstance(index, int) or not 0 <= index < n or rows[index] is not None:
            raise EmbedError("embedding indices are not 0..n-1")
        if not isinstance(vector, list) or not vector:
            raise EmbedError("an embedding is not a list of numbers")
        rows[index] = vector
    try:
        matrix = np.asarray(rows, dtype=np.float32)
    except (ValueError, TypeError) as exc:
        raise EmbedError("embeddings are not lists of numbers of one size") from exc
    if matrix.ndim != 2 or (dim is not None and matrix.shape[1] != dim):
        raise EmbedError(f"embeddings are not {dim or 'equal'}-dimensional")
    if not np.isfinite(matrix).all():
        raise EmbedError("an embedding holds a non-finite number")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    if (norms < 1e-12).any() or not all(math.isfinite(float(x)) for x in norms.flat):
        raise EmbedError("an embedding is all zeros")
    return np.ascontiguousarray(matrix / norms, dtype=np.float32)
