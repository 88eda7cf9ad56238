"""Recall: which memories a user turn gets, scored and cut to ``k`` and a token budget.

score = relevance x type weight x time decay. Two selections per turn:

- *standing* (semantic memories of the scope, working memory of the session): relevance is
  the memory's own standing (a distilled fact's score; 1 for working memory), never the
  question, so the block changes only when the window cuts or the memories change;
- *recalled* (per turn): memory ids the user mentions, ranked full-text search, and a recent
  time window (the session's latest turns before the window), minus whatever is still inside
  the forwarded window or already standing.

Each selection keeps at most ``k`` memories; the standing one gets at most half the token
budget and the recalled one what is left. A recalled memory is shown as the snippet of its
lines the question asks about (``memory.snippets.snippet``), and costs what the snippet costs;
one found well below the best (under TAIL_BAR of its relevance) in fewer tokens.

With ``min_score`` (``CTXPROXY_RECALL_MIN_SCORE``) a recalled memory needs one line that,
with the command that printed it, holds at least that share of the question's words (a
memory id the user names always passes): a turn whose question matches nothing well gets no
recall block at all. One line, not the whole memory: a turn with pages of tool output holds
a few of any question's words somewhere, which says nothing.

A question that names a speaker of a dialogue a memory holds (memory.speakers) asks what that
speaker said: when no line of theirs holds SAID_MIN_SCORE of the question's other words, or
the lines that speak of another's things (another's "I", the named one's "you") hold
OWN_MARGIN more of them than those that speak of the named one's, or the best of the first
OWNED_TOP dialogues holds its words best only in lines about another's things, the dialogues
are left out (the question names the wrong speaker, or something nobody said), and with them
the lone lines of their speakers. What the named speaker asks ("how did the kids take it?")
is not theirs to have said. A dialogue kept whose speaker the question names needs no more
of its words to be recalled lexically from another session (``elsewhere_min_score``): the
name is the match a chance overlap is not.

A memory that an earlier turn's recall message, still in the window, shows already comes back
only with a line not in view that holds more of the question's words than every line in view
(and ``min_score`` of them); a memory the user names by id, with any line not in view.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ctxproxy.memory.aio import done, joined
from ctxproxy.memory.cpu import Offload, fits, sized
from ctxproxy.memory.embed import Embedder, EmbedError
from ctxproxy.memory.model import MEMORY_TYPES, Hit, Memory, MemoryType, Scope, Store, StoreError
from ctxproxy.memory.scoring import Candidate, Weights, decay, fuse, score, select
from ctxproxy.memory.snippets import (
    GAP,
    SNIPPET_TOKENS,
    best_match,
    line_matches,
    lines_of,
    questions,
    said_match,
    snippet,
    voices,
    whole_match,
)
from ctxproxy.memory.speakers import Said

__all__ = [
    "Candidate", "Found", "Mode", "Recaller", "Standing", "Weights", "decay", "fuse",
    "mentioned_ids", "score", "select", "standing_of",
]

MENTIONED = 2.0  # above any search relevance: the user asked for it by id
RECENT = 0.3  # a recent turn that shares no word with the question
RECENT_WINDOW_S = 6 * 3600.0
RECENT_LIMIT = 2  # the session's latest turns before the window: what was just going on
SEARCH_LIMIT = 20
PICK_WEIGHT = 4  # a pick's characters, as counted against memory.cpu.SMALL
STANDING_LIMIT = 200
MAX_MENTIONED = 5
# The share of a question's other words that a line said by the speaker it names must hold
# (bench/RESULTS.md, LoCoMo: chosen on conversations 0-4).
SAID_MIN_SCORE = 0.3
# How much more of them the lines speaking of another's things may hold (same).
OWN_MARGIN = 0.1
# A searched memory under TAIL_BAR of the best one's relevance (1: both searches scale so) is
# shown as its best lines within TAIL_SNIPPET_TOKENS: it less often holds the answer, and the
# few lines the question's words pick are what it has to add (same).
TAIL_BAR = 0.85
TAIL_SNIPPET_TOKENS = 120
# How many of the best dialogues found say whose story the question's words belong to (same).
OWNED_TOP = 3
VECTOR_TYPES: tuple[MemoryType, ...] = ("episodic", "semantic")

Mode = Literal["lexical", "hybrid", "lexical-degraded"]

_MEMORY_ID = re.compile(r"\bmem_[0-9a-hjkmnp-tv-z]{26}\b")


@dataclass(frozen=True, slots=True)
class Found:
    """What the store holds for one turn's question (``Recaller.gather``)."""

    query: str
    now: float
    session: str
    searched: list[list[Hit]] = field(default_factory=list)  # the prompt's, each question's
    recent: list[Memory] = field(default_factory=list)  # the session's latest turns
    near: list[list[Hit]] = field(default_factory=list)  # each question's, by meaning
    mode: Mode = "lexical"
    mentioned: list[Memory] = field(default_factory=list)  # the memory ids the user named


def mentioned_ids(text: str) -> list[str]:
    """The memory ids in ``text``, first mention first, at most five."""
    return list(dict.fromkeys(_MEMORY_ID.findall(text)))[:MAX_MENTIONED]


def _read_query(query: str) -> tuple[list[str], list[str]]:
    """A prompt's questions and the memory ids it names (one trip off the loop)."""
    return questions(query), mentioned_ids(query)


def _alive(memory: Memory, now: float) -> bool:
    return memory.expires_at is None or memory.expires_at > now


def _outside(memory: Memory, window: Collection[str]) -> bool:
    """Not from a turn the model can still see in the forwarded history."""
    return memory.attrs.get("prompt") not in window


def _spoken(candidates: Sequence[Candidate], query: str
            ) -> tuple[Sequence[Candidate], frozenset[str]]:
    """``candidates`` less the dialogues (memory.speakers) when the question names their
    speakers and asks what they said that none of them did (it names the wrong one): no line
    those speakers said holds SAID_MIN_SCORE of its other words, or the lines that speak of
    another's things (another's "I", the named one's "you") hold OWN_MARGIN more of them than
    any line that speaks of the named one's. The lines that hold its words would then mislead
    more than inform. And the ids of the dialogues kept whose speaker the question names:
    the name vouches for them as another session's turn's words cannot (``_shown_as``)."""
    said = [(c, said_match(c.memory.text, query)) for c in candidates]
    held = [m for _, m in said if m is not None]
    if not held:
        return candidates, frozenset()
    if (max(m.said for m in held) >= SAID_MIN_SCORE
            and max(m.own for m in held) >= max(m.others_own for m in held) - OWN_MARGIN
            and not _others_story(said)):
        return candidates, frozenset(c.memory.memory_id for c, m in said if m is not None)
    # A lone line of the same conversation ("User: [date] Ada: ..." of one speaker: no
    # dialogue) goes with them: it is what is left of the conversation to mislead.
    speakers = frozenset().union(*(voices(c.memory.text)[0] for c, m in said if m is not None))
    return [c for c, m in said if c.relevance >= MENTIONED
            or (m is None and not voices(c.memory.text)[1] & speakers)], frozenset()


def _others_story(said: Sequence[tuple[Candidate, Said | None]]) -> bool:
    """Whether, of the first OWNED_TOP dialogues found (by relevance), the one whose line
    holds most of the question's words (the first on a tie) holds them only in lines about
    another's things (``Said.best_others``): an answerable question's words are most at home
    in the named speaker's own story, a question that names the wrong speaker's in the
    other's (bench/RESULTS.md, LoCoMo: chosen on conversations 0-4)."""
    first: dict[str, tuple[float, Said]] = {}
    for c, m in said:
        if m is not None and c.relevance > first.get(c.memory.memory_id, (-1.0, m))[0]:
            first[c.memory.memory_id] = (c.relevance, m)
    top = sorted(first.values(), key=lambda at: -at[0])[:OWNED_TOP]
    best = max(top, key=lambda at: at[1].best, default=None)  # max keeps the first of ties
    return best is not None and best[1].best_others


@dataclass(frozen=True, slots=True)
class Standing:
    """What the standing selection chooses from: the session's working memory and the
    scope's semantic memory (``Recaller.read_standing``)."""

    working: list[Memory]
    semantic: list[Memory]


def standing_of(read: Standing, window: Collection[str]) -> list[Candidate]:
    """The standing candidates: working memory from turns outside the ``window``, and
    semantic memory, each with its query-independent relevance."""
    out = [Candidate(m, 1.0) for m in read.working if _outside(m, window)]
    for m in read.semantic:
        standing = m.attrs.get("score", 1.0)
        relevance = float(standing) if isinstance(standing, int | float) else 1.0
        out.append(Candidate(m, min(max(relevance, 0.01), 1.0)))
    return out


class _Seen:
    """How well each memory matches one query, and its snippet for it, each made at most once
    in a pick: the match is asked of every candidate, the snippet only of one that may be
    shown (most are passed over)."""

    def __init__(self, recaller: Recaller, query: str) -> None:
        self.query = query
        self._recaller = recaller
        self._matches: dict[str, float] = {}
        self._views: dict[tuple[str, int], Memory] = {}

    def match(self, memory: Memory) -> float:
        if memory.memory_id not in self._matches:
            self._matches[memory.memory_id] = best_match(memory.text, self.query)
        return self._matches[memory.memory_id]

    def view(self, memory: Memory, max_tokens: int) -> Memory:
        key = (memory.memory_id, max_tokens)  # a tail's view is shorter than a head's
        if key not in self._views:
            self._views[key] = self._recaller.view(memory, self.query, max_tokens)[0]
        return self._views[key]


class Recaller:
    """Gathers candidates from the store (raises StoreError) and selects from them."""

    def __init__(
        self,
        store: Store,
        *,
        weights: Weights,
        k: int,
        budget: int,
        cost: Callable[[Memory], int],
        overhead: Callable[[MemoryType], int],
        snippet_tokens: int = SNIPPET_TOKENS,
        offload: Offload = asyncio.to_thread,
        embedder: Embedder | None = None,
        query_timeout_s: float = 0.3,
        min_similarity: float = 0.2,
        elsewhere_min_score: float = 0.0,
        on_degraded: Callable[[Exception], None] = lambda exc: None,
    ) -> None:
        self._store = store
        # What a turn of another session must match, of the whole question's words, to be
        # recalled: most of what a new task's prompt shares with an unrelated task's turn is
        # chance.
        self.elsewhere_min_score = elsewhere_min_score
        self._embedder = embedder
        self._query_timeout_s = query_timeout_s
        self.min_similarity = min_similarity
        self._on_degraded = on_degraded
        self._offload = offload
        self.weights = weights
        self.k = k
        self.budget = budget
        self._cost = cost
        self._overhead = overhead
        self.snippet_tokens = snippet_tokens

    def choose(self, candidates: Iterable[Candidate], budget: int, now: float) -> list[Memory]:
        return select(
            candidates, weights=self.weights, now=now, k=self.k, budget=budget,
            cost=self._cost, overhead=self._overhead,
        )

    def cost(self, memories: Sequence[Memory]) -> int:
        """Tokens the blocks of ``memories`` take."""
        kinds = {m.type for m in memories}
        return sum(self._cost(m) for m in memories) + sum(self._overhead(t) for t in kinds)

    async def standing_candidates(
        self, scope: Scope, session: str, window: Collection[str], now: float
    ) -> list[Candidate]:
        """The session's working memory from turns outside the window, and the scope's
        semantic memory, each with its query-independent relevance."""
        return standing_of(await self.read_standing(scope, session, now), window)

    def read_standing(self, scope: Scope, session: str, now: float) -> asyncio.Future[Standing]:
        """What the standing selection chooses from, whatever the window (``standing_of``):
        the reads can go out before the history is split, and go out now."""
        # No session (''): no working memory to read. A user's scope also shows what an
        # operator shared with every user of its team and agent (``memory add --shared``),
        # never what was distilled in the scope without a user.
        team = replace(scope, user="")

        def standing(reads: list[Any]) -> Standing:
            working, semantic, shared = reads
            return Standing(working, [*semantic,
                                      *(m for m in shared if m.attrs.get("shared") is True)])

        return joined([
            self._store.list(scope, types=["working"], session_id=session, now=now,
                             limit=STANDING_LIMIT if session else 0),
            self._store.list(scope, types=["semantic"], now=now, limit=STANDING_LIMIT),
            self._store.list(team, types=["semantic"], now=now,
                             limit=STANDING_LIMIT if scope.user else 0),
        ], standing)

    def standing(self, candidates: Sequence[Candidate], now: float) -> list[Memory]:
        """The standing selection, in a fixed order (type, then age) so that its bytes do not
        move when scores drift."""
        chosen = self.choose(candidates, self.budget // 2, now)
        order = {t: n for n, t in enumerate(MEMORY_TYPES)}
        return sorted(chosen, key=lambda m: (
            order[m.type], m.attrs.get("kind") != "task", m.created_at, m.memory_id,
        ))

    async def recall(
        self,
        scope: Scope,
        session: str,
        query: str,
        *,
        window: Collection[str],
        exclude: Collection[str],
        budget: int,
        now: float,
        min_score: float = 0.0,
        shown: Mapping[str, Collection[str]] | None = None,
    ) -> list[Memory]:
        """This turn's recall, best first, each memory shown as its snippet for ``query``;
        [] when nothing matches ``min_score`` of the question's words. ``shown``: the lines of
        memories the window still shows (earlier recall messages); such a memory comes back
        only with lines the question's words pick over those (see the module docstring)."""
        memories, _ = await self.recall_mode(
            scope, session, query, window=window, exclude=exclude, budget=budget, now=now,
            min_score=min_score, shown=shown,
        )
        return memories

    async def recall_mode(
        self,
        scope: Scope,
        session: str,
        query: str,
        *,
        window: Collection[str],
        exclude: Collection[str],
        budget: int,
        now: float,
        min_score: float = 0.0,
        shown: Mapping[str, Collection[str]] | None = None,
    ) -> tuple[list[Memory], Mode]:
        """``recall``, and how it searched: ``hybrid`` (full text and meaning, fused),
        ``lexical`` (no embeddings configured) or ``lexical-degraded`` (the embeddings
        endpoint or the vector search failed this turn)."""
        found = await self.gather(scope, session, query, now)
        picked = await self.pick(found, window=window, exclude=exclude, budget=budget,
                                 min_score=min_score, shown=shown)
        return picked, found.mode

    def begin(self, scope: Scope, session: str, query: str, now: float) -> asyncio.Future[Found]:
        """``gather``, its reads handed to the store now (a short prompt's: a long one is read
        in a worker first)."""
        if self.k <= 0 or not fits(len(query)):
            return asyncio.ensure_future(self.gather(scope, session, query, now))
        return self._reads(scope, session, query, *_read_query(query), now)

    async def gather(self, scope: Scope, session: str, query: str, now: float) -> Found:
        """What the store holds for ``query``: every read of a turn's recall, at once. What
        is shown of it is decided by ``pick``, which needs the standing selection: a turn
        reads both concurrently."""
        if self.k <= 0:
            return Found(query, now, session)
        # A long prompt is searched as a whole and by each of its questions: the words of
        # the question are what the memory shares, the rest says what the task is about.
        asked, ids = await sized(self._offload, len(query), _read_query, query)
        return await self._reads(scope, session, query, asked, ids, now)

    def _reads(self, scope: Scope, session: str, query: str, asked: list[str],
               ids: list[str], now: float) -> asyncio.Future[Found]:
        queries = [query, *asked]
        n = len(queries)

        def found(reads: list[Any]) -> Found:
            searched, recent, (near, mode), named = (
                reads[:n], reads[n], reads[n + 1], reads[n + 2:])
            # get() looks across every scope: never let another scope's memory through.
            mentioned = [m for m in named
                         if m is not None and m.scope == scope and _alive(m, now)]
            return Found(query, now, session, searched, recent, near, mode, mentioned)

        # One join of every read, not gathers inside gathers: each level is a turn of the
        # event loop between a read's end and the turn's recall going on.
        return joined([
            *(self._store.search(scope, q, types=["episodic", "semantic"],
                                 limit=SEARCH_LIMIT, now=now)
              for q in queries),
            self._store.list(scope, types=["episodic"], session_id=session,
                             since=now - RECENT_WINDOW_S, limit=SEARCH_LIMIT if session else 0,
                             now=now),
            self._nearest(scope, asked or [query], now),
            *(self._store.get(i) for i in ids),
        ], found)

    async def pick(
        self,
        found: Found,
        *,
        window: Collection[str],
        exclude: Collection[str],
        budget: int,
        min_score: float = 0.0,
        shown: Mapping[str, Collection[str]] | None = None,
    ) -> list[Memory]:
        """The recall among what ``gather`` found: outside the forwarded ``window``, not in
        ``exclude`` (the standing selection), within ``budget`` tokens."""
        if self.k <= 0 or budget <= 0:
            return []
        candidates = [Candidate(m, MENTIONED) for m in found.mentioned]
        rankings: list[list[Hit]] = []
        if found.mode == "hybrid":
            # Each search is a ranking of its own: the whole prompt's, each question's, and
            # each question's vector search; fused in _pick, after the gate.
            rankings = [[h for h in ranking if _outside(h.memory, window)]
                        for ranking in [*found.searched, *found.near]]
        else:
            hits = [h for part in found.searched for h in part]
            top = max((h.relevance for h in hits), default=0.0)
            for hit in hits:
                if _outside(hit.memory, window):
                    candidates.append(Candidate(hit.memory, hit.relevance / top))
        latest = sorted((m for m in found.recent if _outside(m, window)),
                        key=lambda m: -(m.turn_index or 0))[:RECENT_LIMIT]
        candidates += [Candidate(m, RECENT) for m in latest]
        # Snippets and token counts scan the memories' text: a long one in a worker, not on
        # the loop. A character costs them about four times what it costs the other calls
        # ``sized`` runs in place (a pick over 32 K characters took up to 7 ms of CPU).
        size = len(found.query) + sum(len(c.memory.text) for c in candidates) + sum(
            len(h.memory.text) for ranking in rankings for h in ranking)
        return await sized(
            self._offload, size * PICK_WEIGHT,
            self._pick, candidates, found.query, session=found.session, exclude=exclude,
            shown=shown or {}, min_score=min_score, budget=budget, now=found.now,
            rankings=rankings,
        )

    def _nearest(
        self, scope: Scope, asked: Sequence[str], now: float
    ) -> Awaitable[tuple[list[list[Hit]], Mode]]:
        """For each question, the memories nearest its meaning; none, and why, when that
        fails. A long prompt is asked as its questions, each embedded on its own (in one
        call): one vector of two questions is near neither's answer, and of a whole prompt
        mostly its task (a model reads only its first few hundred tokens anyway). With
        nothing to embed, a future that has the answer already (no task to run)."""
        asked = [q for q in asked if q.strip()]
        if self._embedder is None or not asked:
            return done(([], "lexical"))
        return self._embedded(self._embedder, scope, asked, now)

    async def _embedded(
        self, embedder: Embedder, scope: Scope, asked: list[str], now: float
    ) -> tuple[list[list[Hit]], Mode]:
        model = embedder.model
        try:
            vectors = await embedder.embed(asked, timeout_s=self._query_timeout_s)
            near = await asyncio.gather(*(
                self._store.vector_search(scope, vector, model, types=VECTOR_TYPES,
                                          limit=SEARCH_LIMIT, now=now)
                for vector in vectors
            ))
        except (EmbedError, StoreError) as exc:
            self._on_degraded(exc)
            return [], "lexical-degraded"
        return list(near), "hybrid"

    def _pick(
        self,
        candidates: Sequence[Candidate],
        query: str,
        *,
        session: str,
        exclude: Collection[str],
        shown: Mapping[str, Collection[str]],
        min_score: float,
        budget: int,
        now: float,
        rankings: Sequence[Sequence[Hit]] = (),
    ) -> list[Memory]:
        """The recall among ``candidates`` and the fused ``rankings``, each as its snippet
        for ``query`` (pure)."""
        seen = _Seen(self, query)
        if rankings:
            # The gate before the fusion: a ranking keeps what its own evidence vouches for
            # (a line holding min_score of the question's words; a chunk at min_similarity),
            # so that a weak match (a stem, one common word) ranked first by one search does
            # not outrank, with the votes of two, a memory that only meaning found.
            candidates = [*candidates, *fuse([
                [h for h in ranking
                 if (h.similarity >= self.min_similarity if h.similarity is not None
                     else seen.match(h.memory) >= min_score)]
                for ranking in rankings])]

        kept, vouched = _spoken(candidates, query)
        if rankings:
            # Fused, the bar is what keeps a named dialogue that shares few of the question's
            # words from displacing one found by meaning (bench/RESULTS.md, LoCoMo, fourth
            # pass: it lost evidence there).
            vouched = frozenset()

        def shown_as(c: Candidate) -> Candidate | None:
            return self._shown_as(c, seen, session=session, exclude=exclude, shown=shown,
                                  min_score=min_score, vouched=vouched)

        return select(
            kept, weights=self.weights, now=now, k=self.k,
            budget=budget, cost=self._cost, overhead=self._overhead, view=shown_as,
        )

    def _shown_as(self, c: Candidate, seen: _Seen, *, session: str, exclude: Collection[str],
                  shown: Mapping[str, Collection[str]], min_score: float,
                  vouched: Collection[str] = frozenset()) -> Candidate | None:
        """The candidate as it would be shown, or None where it must stay out. ``vouched``:
        dialogues whose speaker the question names (``_spoken``), which another session's
        turn's bar (``elsewhere_min_score``) does not hold back: the name is a match no chance
        overlap of a new task's words makes."""
        memory, query = c.memory, seen.query
        if memory.memory_id in exclude:
            return None
        if memory.type == "working" and memory.session_id != session:
            return None  # working memory belongs to its session
        match = seen.match(memory)
        near = c.similarity is not None and c.similarity >= self.min_similarity
        if c.relevance < MENTIONED and match < min_score and not near:
            return None
        if (c.relevance < MENTIONED and memory.session_id and memory.session_id != session
                and memory.memory_id not in vouched
                and whole_match(memory.text, query) < self.elsewhere_min_score):
            return None
        if near and match < min_score and c.span is not None:
            # Found by meaning, not by the question's words: show the chunk that matched.
            view = self.chunk_view(memory, c.span)
        else:
            view = seen.view(memory, self.snippet_tokens if c.relevance >= TAIL_BAR
                             else min(self.snippet_tokens, TAIL_SNIPPET_TOKENS))
        before = shown.get(memory.memory_id)
        if before is not None:  # an earlier recall message in the window shows it
            if lines_of(view.text) <= set(before):
                return None  # and all of this
            if c.relevance < MENTIONED and not self._brings_better(
                    memory, view, before, query, min_score):
                return None
        return Candidate(view, c.relevance)

    def _brings_better(
        self, memory: Memory, view: Memory, before: Collection[str], query: str,
        min_score: float,
    ) -> bool:
        """Whether ``view`` of a memory that a recall message in the window shows already (as
        the lines ``before``) is worth showing again: one of its lines not in view holds
        ``min_score`` of the question's words, and more of them than any line in view does.
        Meaning alone does not bring it back: a long memory has a chunk near most questions
        (all-MiniLM-L6-v2 put a turn's unrelated chunks at 0.35-0.49), and the model has its
        prompt in view already."""
        new = [m for line, m in zip(view.text.split("\n"), line_matches(view.text, query),
                                    strict=True) if line not in before and line != GAP]
        fresh = max(new, default=0.0)
        if fresh < min_score:
            return False
        held = max((m for line, m in zip(memory.text.split("\n"),
                                         line_matches(memory.text, query), strict=True)
                    if line in before), default=0.0)
        return fresh > held

    def chunk_view(self, memory: Memory, span: tuple[int, int]) -> Memory:
        """``memory`` shown as its first line (the turn's prompt) and the lines of the chunk
        at ``span``, within the snippet budget."""
        text = memory.text
        head = text.split("\n", 1)[0]
        start, end = span
        # A chunk may be one sentence of a line (memory.vectors.chunks): shown as its line.
        found = text.find("\n", end - 1) if end > 0 else 0
        end = len(text) if found < 0 else max(end, found)
        if start <= len(head):
            part = text[:end]
        else:
            part = head + "\n" + GAP + "\n" + text[start:end].strip("\n")
        if end < len(text):
            part += "\n" + GAP
        # No question words to go by: snippet() keeps the first lines that fit.
        cut = snippet(part, "", self.snippet_tokens)
        return memory if cut.text == text else replace(memory, text=cut.text)

    def view(self, memory: Memory, query: str,
             max_tokens: int | None = None) -> tuple[Memory, float]:
        """``memory`` as a recall block shows it for ``query`` (its snippet, within
        ``max_tokens``, by default the recaller's ``snippet_tokens``; not stored), and the
        share of the question's words its best line holds."""
        cut = snippet(memory.text, query,
                      self.snippet_tokens if max_tokens is None else max_tokens)
        shown = memory if cut.text == memory.text else replace(memory, text=cut.text)
        return shown, cut.match
