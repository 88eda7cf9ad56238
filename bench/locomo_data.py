"""LoCoMo's data as bench.locomo reads it, and the BM25 anchor it measures the store against.

- ``load``: the picked conversations of ``locomo10.json``: each one's dated sessions of
  dialogue turns (in their dates' order) and its questions with their evidence turns' ids;
  ``parse_picks``: which conversations, from ``--conversations``;
- ``BM25``: Okapi BM25 over documents, with the words the memory search uses.
"""

from __future__ import annotations

import datetime
import math
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ctxproxy.memory.words import STOPWORDS, WORD

# --- the data ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str  # one line: what the evidence check looks for
    caption: str = ""


@dataclass(frozen=True)
class Session:
    number: int
    date: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: tuple[str, ...]


@dataclass
class Conversation:
    index: int
    sample_id: str
    sessions: list[Session]
    questions: list[Question]

    def turns(self) -> dict[str, Turn]:
        return {t.dia_id: t for s in self.sessions for t in s.turns}


def one_line(value: Any) -> str:
    return " ".join(str(value).split())


def _session_date(raw: str) -> str:
    """"1:00 pm on 3 March, 2023" -> "3 March, 2023"."""
    return raw.split(" on ", 1)[-1].strip()


def _when(raw: str) -> datetime.datetime:
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.datetime.strptime(raw.strip(), fmt)
        except ValueError:
            continue
    return datetime.datetime.max


def evidence_ids(raw: Sequence[Any]) -> tuple[str, ...]:
    """The dialogue ids of a question's evidence (a few are written "D8:6; D9:17")."""
    return tuple(m.group() for item in raw for m in re.finditer(r"D\d+:\d+", str(item)))


def conversation(index: int, sample: dict[str, Any]) -> Conversation:
    conv = sample["conversation"]
    sessions = []
    for key, turns in conv.items():
        found = re.fullmatch(r"session_(\d+)", key)
        if not found or not turns:
            continue
        raw_date = str(conv.get(f"{key}_date_time", ""))
        sessions.append((_when(raw_date), int(found.group(1)), Session(
            int(found.group(1)), _session_date(raw_date),
            tuple(Turn(str(t["dia_id"]), str(t["speaker"]), one_line(t["text"]),
                       one_line(t.get("blip_caption") or "")) for t in turns))))
    sessions.sort(key=lambda s: (s[0], s[1]))
    questions = [Question(one_line(q["question"]), int(q["category"]),
                          evidence_ids(q.get("evidence") or ())) for q in sample.get("qa", ())]
    return Conversation(index, str(sample.get("sample_id", index)), [s[2] for s in sessions],
                        questions)


def load(path: Path, picks: Sequence[int]) -> list[Conversation]:
    """The picked conversations only: the others' questions are not read."""
    samples = orjson.loads(path.read_bytes())
    return [conversation(n, samples[n]) for n in picks]


def parse_picks(value: str) -> list[int]:
    """"0-4" or "0,2,3" -> [0, 1, 2, 3, 4] or [0, 2, 3]."""
    picks: list[int] = []
    for part in filter(None, (p.strip() for p in value.split(","))):
        first, _, last = part.partition("-")
        picks += range(int(first), int(last or first) + 1)
    return sorted(set(picks))


# --- BM25 ----------------------------------------------------------------------------------


class BM25:
    """Okapi BM25 (k1 1.2, b 0.75) over documents, with the memory search's words."""

    def __init__(self, docs: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.tf = [Counter(_words(d)) for d in docs]
        self.lengths = [sum(c.values()) for c in self.tf]
        self.avg = statistics.mean(self.lengths) if self.lengths else 0.0
        df = Counter(w for c in self.tf for w in c)
        n = len(docs)
        self.idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in df.items()}
        self.k1, self.b = k1, b

    def top(self, query: str, k: int) -> list[int]:
        words = [w for w in set(_words(query)) if w in self.idf]
        scores = []
        for n, tf in enumerate(self.tf):
            norm = self.k1 * (1 - self.b + self.b * self.lengths[n] / (self.avg or 1))
            s = sum(self.idf[w] * tf[w] * (self.k1 + 1) / (tf[w] + norm) for w in words if w in tf)
            if s > 0:
                scores.append((s, n))
        scores.sort(key=lambda x: (-x[0], x[1]))
        return [n for _, n in scores[:k]]


def _words(text: str) -> list[str]:
    return [w for w in WORD.findall(text.lower()) if w not in STOPWORDS]
