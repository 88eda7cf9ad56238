"""What the window tells the model about the turns it cut: the names they used."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from cachetools import LRUCache

from ctxproxy.injectors import cut_digest
from ctxproxy.injectors.bounds import whole_words
from ctxproxy.injectors.redact import redact_all
from ctxproxy.request import History, Identity, Item

__all__ = ["Digests", "digest_message"]

# The argument keys that say what a command was (Codex's exec_command, shell, apply_patch).
COMMAND_KEYS = ("cmd", "command", "input", "patch")
SCAN_CHARS = 4000  # of each command or summary, what is read for names
MAX_NAMES = 200  # per turn, the newest
MAX_TURNS = 12  # the newest cut turns a digest may show
CACHED = 1024

# Paths (a/b, a/b.c) and compound identifiers (a_b, a.b, CamelCase): what later commands
# reuse.
# Each starts only where a token starts and quantifiers are possessive: linear-time on any
# input, a megabyte-long word included.
_NAME = re.compile(
    r"(?<![\w./-])(?:[\w.-]*+/[\w./-]++|[A-Za-z_]\w*+(?:\.\w++)++|[A-Za-z]\w*_\w++"
    r"|[A-Z][a-z0-9]++(?:[A-Z][a-z0-9]*+)++)"
)


def _what(item: Item) -> str:
    args: Any = item.get("arguments", item.get("input", ""))
    if isinstance(args, str):
        try:
            parsed = orjson.loads(args)
        except orjson.JSONDecodeError:
            return args
        args = parsed
    if isinstance(args, dict):
        for key in COMMAND_KEYS:
            value = args.get(key)
            if isinstance(value, list):
                value = " ".join(str(v) for v in value)
            if isinstance(value, str):
                return value
    if item.get("type") == "local_shell_call":
        action = item.get("action")
        if isinstance(action, dict) and isinstance(action.get("command"), list):
            return " ".join(str(v) for v in action["command"])
    return args if isinstance(args, str) else orjson.dumps(args).decode()


def _names(text: str, seen: dict[str, None]) -> None:
    """Add the names in ``text`` (its first SCAN_CHARS) to ``seen``, moved to its end."""
    for found in _NAME.findall(text[:SCAN_CHARS]):
        name = found.strip("./-")
        if len(name) >= 4:
            seen.pop(name, None)
            seen[name] = None


def _read(history: History, n: int) -> list[str]:
    """Turn ``n``'s texts as the digest reads them: what the model itself wrote (its commands,
    its reasoning summaries), then its prompt. Not the tool outputs: later tasks reuse the
    names the model wrote, and an output's other names cost more than they bring back
    (bench/RESULTS.md, Real agent runs)."""
    texts: list[str] = []
    for item in history.turn_items(n)[1:]:
        kind = item.get("type", "message")
        if kind == "reasoning":
            summary = item.get("summary")
            if isinstance(summary, list):
                texts.extend(part["text"] for part in summary[:8]
                             if isinstance(part, dict) and isinstance(part.get("text"), str))
        elif isinstance(kind, str) and kind.endswith("_call"):
            texts.append(_what(item))
    # Cut before redaction, so whole words only: the cut would hide half a key.
    texts = [whole_words(text, SCAN_CHARS) for text in texts]
    texts.append(whole_words(history.prompt_text(n), cut_digest.PROMPT_CHARS * 4))
    return texts


def _cut_turn(
    history: History, n: int, clean: Callable[[Sequence[str]], list[str]]
) -> cut_digest.CutTurn:
    # Every text is redacted before anything is taken from it: a name pulled out of
    # "DB_PASSWORD=..." leaves the value where no rule knows it for one. Redacted together:
    # one ask of the secret rules for the whole turn (see redact_all).
    *texts, prompt = clean(_read(history, n))
    # Each name once, newest last, with how many of the turn's texts used it.
    uses: dict[str, int] = {}
    for text in texts:
        here: dict[str, None] = {}
        _names(text, here)
        for name in here:
            uses[name] = uses.pop(name, 0) + 1  # put back last: its newest use
    names = list(uses)[-MAX_NAMES:]
    return cut_digest.CutTurn(n + 1, prompt, tuple(names), tuple(uses[x] for x in names))


def digest_message(
    history: History, first: int, max_chars: int,
    clean: Callable[[Sequence[str]], list[str]] = redact_all,
    cut_turn: Callable[[int], cut_digest.CutTurn] | None = None,
) -> Item | None:
    """A developer message with the map of the turns before ``first`` (the newest MAX_TURNS
    of them, their names as many as fit in ``max_chars``), secrets redacted; None when no name
    fits. ``cut_turn(n)``, when given, says what turn ``n`` is (a memo of ``_cut_turn``)."""
    turn = cut_turn or (lambda n: _cut_turn(history, n, clean))
    newest_first = (turn(n) for n in range(first - 1, max(first - MAX_TURNS, 0) - 1, -1))
    text = cut_digest.render(newest_first, max_chars)
    if text is None:
        return None
    return {"type": "message", "role": "developer",
            "content": [{"type": "input_text", "text": text}]}


class Digests:
    """Digest messages, made once per cut: every request until the next cut reuses the bytes.

    Keyed by whose session it is and by what identifies the turns a digest may show (their
    prompts' keys and where they start), never shared across sessions: within one, turns
    before the cut only grow by appends after it, so the key reads no more than the prompts.
    """

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._made: LRUCache[tuple[object, ...], Item | None] = LRUCache(CACHED)
        # Each cut turn as the digest tells it, by the same kind of key: the next cut's digest
        # reads only the turn it newly cut. Filled from worker threads, hence the lock.
        self._turns: LRUCache[tuple[object, ...], cut_digest.CutTurn] = LRUCache(
            CACHED * MAX_TURNS
        )
        self._lock = threading.Lock()

    async def message(self, history: History, first: int, who: Identity) -> Item | None:
        lo = max(first - MAX_TURNS, 0)
        session = who.session_id or ""
        key = (who.team_id, who.agent_id, who.owner, session, first,
               tuple(history.prompt_keys(session)[lo:first]), tuple(history.starts[lo:first + 1]))
        try:
            return self._made[key]
        except KeyError:
            pass
        # Made once per cut, from as much of the history as was cut: off the event loop.
        made = await asyncio.to_thread(self._make, history, first, lo, key[:4], session)
        self._made[key] = made
        return made

    def _make(
        self, history: History, first: int, lo: int, whose: tuple[object, ...], session: str
    ) -> Item | None:
        keys = history.prompt_keys(session)

        def cut_turn(n: int) -> cut_digest.CutTurn:
            key = (*whose, keys[n], history.starts[n], history.starts[n + 1])
            with self._lock:
                known = self._turns.get(key)
            if known is None:
                known = _cut_turn(history, n, redact_all)
                with self._lock:
                    self._turns[key] = known
            return known

        made = digest_message(history, first, self.max_chars, cut_turn=cut_turn)
        if made is not None:
            cut = history.items[history.starts[lo] : history.starts[first]]
            if len(made["content"][0]["text"]) * 2 > len(orjson.dumps(cut)):
                made = None  # turns this short are cheaper to lose than to describe
        return made
