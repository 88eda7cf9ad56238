"""Forgetting for good: what ``ctxproxy memory forget`` removes, and what it rewrites.

A forgotten record goes with every record distilled only from forgotten ones, and each
leaves a tombstone in the store (``Store.forget``), so neither a resent turn, distillation,
a restart nor another replica writes it back. ``purge`` also rewrites the records of the
same scope that quote a forgotten one (an episode that pasted the same secret, the turn a
fact was distilled from): each quoted line becomes ``[FORGOTTEN]``, and the record is marked
``purged`` so that ingest never writes the quote back over it (the stores keep a purged
record's text on a later write of its key).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ctxproxy.memory.model import MEMORY_TYPES, Memory, Scope, Store
from ctxproxy.memory.turns import ASSISTANT, CALL, INDENT, OUTPUT, USER

__all__ = ["FORGOTTEN", "Forgotten", "distilled_only_from", "forget", "quotes"]

FORGOTTEN = "[FORGOTTEN]"
MIN_QUOTE = 8  # shorter lines ("ok", "done") are quoted everywhere and say nothing
_SCAN = 10_000_000
_HEAD = re.compile(rf"^(?:{USER}|{ASSISTANT}|(?:{CALL}|{OUTPUT}) [^:\n]{{1,80}}): ")


@dataclass(frozen=True, slots=True)
class Forgotten:
    ids: list[str]  # deleted, with a tombstone each
    rewritten: list[str]  # records of the same scopes with quoted lines replaced


def distilled_only_from(records: Sequence[Memory], chosen: Iterable[str]) -> list[str]:
    """``chosen`` and every record distilled only from forgotten records, to a fixpoint: a
    fact merged from a forgotten fact goes too; one with a surviving source stays. A source
    that no longer exists was forgotten before and counts as forgotten."""
    exists = {m.memory_id for m in records}
    derived = [m for m in records if m.sources]
    gone = dict.fromkeys(chosen)
    changed = True
    while changed:
        changed = False
        for m in derived:
            if m.memory_id in gone or not any(s in gone for s in m.sources):
                continue
            if all(s in gone or s not in exists for s in m.sources):
                gone[m.memory_id] = None
                changed = True
    return list(gone)


def quotes(text: str) -> list[str]:
    """The lines of a record's text another record could quote, without their entry heads
    ("User: ", "Tool output NAME: ") and indentation; longest first."""
    found = set()
    for line in text.splitlines():
        line = _HEAD.sub("", line.removeprefix(INDENT)).strip()
        if len(line) >= MIN_QUOTE and line != FORGOTTEN:
            found.add(line)
    return sorted(found, key=lambda q: (-len(q), q))


def _scrub(text: str, quoted: Sequence[str]) -> str:
    for quote in quoted:
        text = text.replace(quote, FORGOTTEN)
    return text


def purged(memory: Memory, quoted: Sequence[str]) -> Memory | None:
    """``memory`` with every quoted line replaced; None when it quotes none."""
    text = _scrub(memory.text, quoted)
    user = memory.attrs.get("user")
    scrubbed_user = _scrub(user, quoted) if isinstance(user, str) else user
    if text == memory.text and scrubbed_user == user:
        return None
    attrs = {**memory.attrs, "purged": True}
    if isinstance(user, str):
        attrs["user"] = scrubbed_user
    return replace(memory, text=text, attrs=attrs)


async def forget(
    store: Store, memory_ids: Sequence[str], *, purge: bool = False, now: float | None = None,
    scope: Scope | None = None,
) -> Forgotten:
    """Forget these records (and what was distilled only from them); see the module doc.
    The one way to forget (the CLI, the dashboard). With ``scope``, the records are all of
    that scope, and only it is read: distillation never crosses scopes."""
    records = await store.list(scope, limit=_SCAN)
    by_id = {m.memory_id: m for m in records}
    # Grows with the records read: off the loop (the dashboard forgets in the server's).
    gone = await asyncio.to_thread(distilled_only_from, records, memory_ids)
    forgotten = [by_id[i] for i in gone if i in by_id]
    await store.forget(gone, now=now)
    rewritten: list[str] = []
    if purge:
        quoted: dict[Scope, set[str]] = {}
        for m in forgotten:
            quoted.setdefault(m.scope, set()).update(quotes(m.text))
        for scope, lines in quoted.items():
            order = sorted(lines, key=lambda q: (-len(q), q))
            for m in await store.list(scope, types=MEMORY_TYPES, limit=_SCAN):
                new = purged(m, order)
                if new is None:
                    continue
                # Deleted, then written whole: the purged text replaces the record even
                # though the stores keep a purged record's text on a plain write.
                await store.delete([m.memory_id])
                await store.upsert([new])
                rewritten.append(m.memory_id)
    return Forgotten(gone, rewritten)
