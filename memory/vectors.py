"""Vectors of memories: chunking, the content digest, and the exact search both stores use.

A memory is embedded as chunks of whole lines (``chunks``): a long episode (a tool output, a
long answer) gets a vector per stretch, so a match inside it is found and shown by itself.
Vectors are cached by the digest of (model, chunk text): the same text is never embedded
twice. The search is exact (a matrix product over every vector of one scope) on an
in-process copy of the scope's vectors (``VectorIndex``), loaded on the scope's first search,
kept in step by reading only the rows written since the last read, and bounded by bytes per
process (the least recently searched scopes go); no ANN index to tune, and it stays fast
enough at the scope sizes measured (bench/RESULTS.md, Hybrid recall). PostgreSQL's pgvector
(not packaged for the Debian release this project installs from) and sqlite-vec would
replace this copy.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ctxproxy.memory.model import Scope
from ctxproxy.memory.turns import INDENT, TURN_CHARS

__all__ = [
    "CHUNK_CHARS", "MAX_CHUNKS", "MAX_SENTENCES", "REREAD", "VECTOR_BYTES", "Match",
    "VectorIndex", "VectorRow", "chunks", "content_digest", "pack", "unpack",
]

# About 130 tokens: shown whole with its turn's prompt within a snippet's budget
# (memory.snippets.SNIPPET_TOKENS), and well within what a small embedding model reads.
CHUNK_CHARS = 480
# An episode is rendered to at most TURN_CHARS: all of it can be found by meaning (a whole
# turn costs MAX_CHUNKS short embeddings).
MAX_CHUNKS = TURN_CHARS // CHUNK_CHARS
# A prompt of several sentences also gets a vector per sentence, the first few: "let's ship
# every second Tuesday" said beside the task of the turn is a fact of its own, and one vector
# of both is mostly the task (a question's similarity to its fact fell with a task sentence
# beside it: bench/paraphrases.py, bench/RESULTS.md, Hybrid recall).
MAX_SENTENCES = 8
SENTENCE_MIN_CHARS = 12  # "Thanks." is no fact: left inside the prompt's vector
# A statement ends at '.', '!', '?' or ';' (a semicolon joins two statements) before white
# space (a path's or a version's dots do not end one), or at a line break. Linear: one
# character class, no backtracking.
_SENTENCE_END = re.compile(r"[.!?;](?=\s)|\n")
# The label memory.turns.render puts before the prompt: our word, not the user's (it moves a
# sentence's vector a little away from the questions that ask for it: bench/paraphrases.py).
USER_LABEL = "User: "
# The default bound of one store's copy (config's CTXPROXY_VECTOR_CACHE_MB).
VECTOR_BYTES = 256 * 2**20
# What a held chunk costs beside its vector: its memory id, span and slot (an estimate).
SLOT_BYTES = 160
# PostgreSQL hands out sequence numbers before commit: a row may appear below the largest seq
# already read. Its refresh looks this many seqs back again (by seq alone, then reads the rows
# it does not hold). SQLite commits one writer at a time, in seq order: 0.
REREAD = 512


@dataclass(frozen=True, slots=True)
class VectorRow:
    """One chunk's vector as stored: ``start``/``end`` are character offsets in the text."""

    memory_id: str
    chunk: int
    start: int
    end: int
    model: str
    digest: str
    vector: bytes  # little-endian float32, unit length


@dataclass(frozen=True, slots=True)
class Match:
    """A memory found by meaning: its best chunk and that chunk's cosine similarity."""

    memory_id: str
    similarity: float
    start: int
    end: int


def content_digest(model: str, text: str) -> str:
    return hashlib.sha256(f"{model}\0{text}".encode("utf-8", "replace")).hexdigest()[:32]


def pack(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def unpack(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<f4")


def _first_entry(text: str, size: int) -> int:
    """Where the text's first entry ends: its first line and the indented lines after it
    (an episode's "User: ..." prompt, see memory.turns.render), within ``size``; 0 when
    nothing follows it."""
    at = text.find("\n")
    while 0 <= at < len(text) - 1 and text.startswith(INDENT, at + 1):
        at = text.find("\n", at + 1)
    return 0 if at < 0 or at + 1 >= len(text) else min(at + 1, size)


def chunks(text: str, size: int = CHUNK_CHARS) -> list[tuple[int, int]]:
    """(start, end) character spans of ``text``: its first entry (a turn's prompt: what the
    turn is about, not diluted by its outputs) when more follows, each sentence of that entry
    when it has several, then whole lines up to ``size`` characters each (a longer line is
    cut), at most MAX_CHUNKS."""
    if not text.strip():
        return []
    spans: list[tuple[int, int]] = []
    start = at = _first_entry(text, size)
    if start:
        spans.append((0, start))
    spans += _sentences(text, start or min(len(text), size))
    while at < len(text) and len(spans) < MAX_CHUNKS:
        end = text.find("\n", at)
        end = len(text) if end < 0 else end + 1
        if end - start > size:
            if at > start:  # close the chunk before this line
                spans.append((start, at))
                start = at
            else:  # one line longer than a chunk: cut it
                spans.append((start, start + size))
                start = at = start + size
            continue
        at = end
    if start < len(text) and len(spans) < MAX_CHUNKS:
        spans.append((start, len(text)))
    return [(a, b) for a, b in spans if text[a:b].strip()]


def _sentences(text: str, end: int) -> list[tuple[int, int]]:
    """The spans of the statements in ``text[:end]`` without its USER_LABEL (at most
    MAX_SENTENCES, none shorter than SENTENCE_MIN_CHARS), when it has more than one; the
    prompt's own span covers one."""
    spans: list[tuple[int, int]] = []
    start = len(USER_LABEL) if text.startswith(USER_LABEL) else 0
    for found in _SENTENCE_END.finditer(text, start, end):
        spans.append((start, found.end()))
        start = found.end()
    spans.append((start, end))
    spans = [(a + len(text[a:b]) - len(text[a:b].lstrip()), b) for a, b in spans]
    spans = [(a, b) for a, b in spans if len(text[a:b].strip()) >= SENTENCE_MIN_CHARS]
    return spans[:MAX_SENTENCES] if len(spans) > 1 else []


class _Scoped:
    """One scope's vectors under one model, grown in place."""

    def __init__(self, dim: int, reread: int) -> None:
        self.reread = reread
        self.seen = -1  # the largest seq read
        self.matrix = np.zeros((256, dim), dtype=np.float32)
        self.size = 0
        self.ids: list[str | None] = []
        self.spans: list[tuple[int, int]] = []
        self.slots: dict[str, list[int]] = {}
        self.seqs: set[int] = set()  # recent seqs, for stores whose seqs commit out of order

    def replace(self, memory_id: str, rows: Sequence[tuple[int, VectorRow, np.ndarray]]) -> None:
        """A memory's vectors, as one write stored them all: they replace its old ones."""
        fresh = [r for r in rows if r[0] not in self.seqs]
        if not fresh:
            return  # read again (see REREAD)
        for slot in self.slots.pop(memory_id, []):
            self.ids[slot] = None
            self.matrix[slot] = 0.0
        for seq, row, vector in fresh:
            self.seqs.add(seq)
            self._add(seq, row, vector)
        if len(self.seqs) > 4 * self.reread:
            floor = self.seen - self.reread
            self.seqs = {s for s in self.seqs if s > floor}

    def _add(self, seq: int, row: VectorRow, vector: np.ndarray) -> None:
        if self.size == len(self.matrix):
            grown = np.zeros((2 * len(self.matrix), self.matrix.shape[1]), dtype=np.float32)
            grown[: self.size] = self.matrix
            self.matrix = grown
        self.matrix[self.size] = vector
        self.ids.append(row.memory_id)
        self.spans.append((row.start, row.end))
        self.slots.setdefault(row.memory_id, []).append(self.size)
        self.size += 1
        self.seen = max(self.seen, seq)

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes + SLOT_BYTES * len(self.ids)


class VectorIndex:
    """The exact vector search of one store: per (scope, model), an in-process matrix loaded
    on the scope's first search, that a refresh extends with the rows stored since
    (``since``/``apply``). At most ``max_bytes`` in all: past it the least recently searched
    scopes go (a scope larger than that on its own is still held, alone, or it could never
    be searched). Thread-safe."""

    def __init__(self, *, reread: int = 0, max_bytes: int = VECTOR_BYTES) -> None:
        self._scopes: OrderedDict[tuple[Scope, str], _Scoped] = OrderedDict()
        self._reread = reread
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(held.nbytes for held in self._scopes.values())

    def since(self, scope: Scope, model: str) -> int:
        """Read rows with seq above this (-1: all of them)."""
        with self._lock:
            held = self._scopes.get((scope, model))
            return -1 if held is None else max(-1, held.seen - self._reread)

    def unknown(self, scope: Scope, model: str, seqs: Sequence[int]) -> list[int]:
        """Which of ``seqs`` (read again, see REREAD) are not held yet."""
        with self._lock:
            held = self._scopes.get((scope, model))
            if held is None:
                return list(seqs)
            return [s for s in seqs if s > held.seen or s not in held.seqs]

    def apply(self, scope: Scope, model: str, rows: Sequence[tuple[int, VectorRow]]) -> None:
        # A write stores all of a memory's chunks at once: grouped, they replace its old ones.
        by_memory: dict[str, list[tuple[int, VectorRow, np.ndarray]]] = {}
        for seq, row in rows:
            by_memory.setdefault(row.memory_id, []).append((seq, row, unpack(row.vector)))
        with self._lock:
            key = (scope, model)
            held = self._scopes.get(key)
            for memory_id, group in by_memory.items():
                dim = len(group[0][2])
                if held is None or held.matrix.shape[1] != dim:
                    # New, or the model's size changed under the same name: start over.
                    held = self._scopes[key] = _Scoped(dim, self._reread)
                held.replace(memory_id, [g for g in group if len(g[2]) == dim])
            if held is not None:
                self._scopes.move_to_end(key)
            self._bound()

    def _bound(self) -> None:
        """Drop the least recently searched scopes past ``max_bytes`` (the lock held)."""
        total = sum(held.nbytes for held in self._scopes.values())
        while total > self.max_bytes and len(self._scopes) > 1:
            _, gone = self._scopes.popitem(last=False)
            total -= gone.nbytes

    def top(self, scope: Scope, model: str, query: np.ndarray, k: int) -> list[Match]:
        """The ``k`` memories whose best chunk is nearest ``query``, nearest first."""
        with self._lock:
            held = self._scopes.get((scope, model))
            if held is None or held.size == 0 or k <= 0:
                return []
            if len(query) != held.matrix.shape[1]:
                return []
            scores = held.matrix[: held.size] @ np.asarray(query, dtype=np.float32)
            # A memory has several chunks: take enough slots to fill k memories.
            wanted = min(held.size, 4 * k + 16)
            slots = np.argpartition(-scores, wanted - 1)[:wanted]
            slots = slots[np.argsort(-scores[slots], kind="stable")]
            out: dict[str, Match] = {}
            for slot in slots.tolist():
                memory_id = held.ids[slot]
                if memory_id is None or memory_id in out:
                    continue
                start, end = held.spans[slot]
                out[memory_id] = Match(memory_id, float(scores[slot]), start, end)
                if len(out) == k:
                    break
            return list(out.values())
