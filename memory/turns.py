"""A request's history as turns: what each turn said and did, and stable keys for them.

Pure functions. Codex resends the whole history on every request, so a turn's key comes from
the session and the turn's own content (item ids where the client gives them): the same turn
in the next request gets the same key, and storing it again updates one record.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import orjson

from ctxproxy.request import (
    History,
    Item,
    call_pairs,
    digest,
    is_message,
    message_text,
    output_text,
)

__all__ = ["INDENT", "Turn", "answered", "is_final", "last", "render", "session_key", "split"]

# Bounds of one stored turn (characters): enough to recall what happened, never a whole log.
# Tool outputs are kept nearly whole: a fact in the middle of a file listing is what the
# window (and masking) lose first, and recall shows only the lines a question asks about.
USER_CHARS = 2000
ASSISTANT_CHARS = 2000
ARGS_CHARS = 300
OUTPUT_CHARS = 16_000
TURN_CHARS = 64_000
TAIL_SNAP_CHARS = 4000  # how far the kept tail of a long turn may move to start at an entry
# Continuation lines of a rendered entry start with this, so that every line that does not is
# an entry's head ("User:", "Tool call NAME:", ...): a snippet can find a line's call.
INDENT = "  "
# Each entry's head: its label, for a tool's entries then the tool's name ("Tool call NAME").
USER, ASSISTANT, CALL, OUTPUT = "User", "Assistant", "Tool call", "Tool output"
UNNAMED = "tool"  # the name an output whose call is not in the turn goes by


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn: its prompt and everything up to the next prompt (context excluded)."""

    index: int  # position among the history's turns, from 0
    prompt_key: str  # the prompt alone: what working memory and window checks refer to
    key: str  # the whole turn: the episodic record's key
    user: str
    items: tuple[Item, ...]
    complete: bool  # another turn follows and this one got an answer
    in_window: bool  # still inside the forwarded history


def _fingerprint(item: Item) -> object:
    """What identifies an item cheaply: its id, else its call id, else its content."""
    ident = item.get("id") or item.get("call_id")
    if isinstance(ident, str):
        return [item.get("type"), ident]
    if is_message(item):
        return [item.get("role"), message_text(item)]
    return orjson.dumps(item, option=orjson.OPT_SORT_KEYS).decode()


def session_key(session_id: str | None, history: History) -> str | None:
    """The session id, or for a client without one, a stand-in derived from its first prompt."""
    if session_id:
        return session_id
    if not history.turns:
        return None
    return "anon-" + digest(history.prompt_text(0))[:16]


def split(session: str, history: History, first_turn: int = 0) -> list[Turn]:
    """The turns of ``history``; those before ``first_turn`` are not forwarded."""
    keys = history.prompt_keys(session)
    turns = []
    for n in range(history.turns):
        items = history.turn_items(n)
        turns.append(
            Turn(
                index=n,
                prompt_key=keys[n],
                key=_turn_key(session, items),
                user=history.prompt_text(n),
                items=items,
                complete=n + 1 < history.turns and len(items) > 1,
                in_window=n >= first_turn,
            )
        )
    return turns


# Calls the client runs and answers in its next request: a response with one goes on.
CLIENT_CALLS = frozenset({
    "function_call", "custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call",
    "computer_call",
})


def _turn_key(session: str, items: tuple[Item, ...]) -> str:
    return "turn:" + digest(session, [_fingerprint(item) for item in items])


def is_final(output: list[Item]) -> bool:
    """Whether a response's output items end the user turn: an answer, no call to run."""
    return bool(output) and not any(item.get("type") in CLIENT_CALLS for item in output)


def last(session: str, history: History, first_turn: int = 0) -> Turn | None:
    """The history's last turn as it stands, before its answer: what ``answered`` completes.
    Its ``key`` is left empty (the answer is part of the key)."""
    if not history.turns:
        return None
    n = history.turns - 1
    return Turn(
        index=n,
        prompt_key=history.prompt_keys(session)[n],
        key="",
        user=history.prompt_text(n),
        items=history.turn_items(n),
        complete=False,
        in_window=n >= first_turn,
    )


def _answered_already(turn: Turn) -> bool:
    """The request resends an answer as its last item: a replay, not a question. What it is
    answered with does not end the turn the client will resend."""
    last_item = turn.items[-1]
    return len(turn.items) > 1 and is_message(last_item) and last_item.get("role") == "assistant"


def answered(session: str, turn: Turn, output: list[Item]) -> Turn | None:
    """``turn`` (from ``last``) completed by ``output`` (the items of the response's
    ``response.completed`` event), or None when the output does not end the turn.

    The client resends those items in its next request, so the turn gets the key ``split``
    gives it then: the answer is stored once, whichever comes first.
    """
    if not is_final(output) or _answered_already(turn):
        return None
    items = (*turn.items, *output)
    return replace(turn, key=_turn_key(session, items), items=items, complete=True)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _entry(head: str, text: str) -> str:
    """``head: text`` with the text's further lines indented (see INDENT)."""
    return f"{head}: " + text.replace("\n", "\n" + INDENT)


def render(turn: Turn) -> tuple[str, list[str]]:
    """The turn as bounded text (prompt, answers, each tool call with its arguments followed
    by its output), and the names of the tools it called."""
    entries = [_entry(USER, _clip(turn.user.strip(), USER_CHARS))]
    tools: list[str] = []
    # Each call's own output, by place: a call_id may name several calls of one turn.
    answers = call_pairs(turn.items)
    outputs = {
        i: output_text(item).strip() for i, item in enumerate(turn.items)
        if i and str(item.get("type", "")).endswith("_call_output") and "call_id" in item
    }
    for at, item in enumerate(turn.items[1:], start=1):
        kind = str(item.get("type", "message"))
        if is_message(item) and item.get("role") == "assistant":
            text = message_text(item).strip()
            if text:
                entries.append(_entry(ASSISTANT, _clip(text, ASSISTANT_CHARS)))
        elif kind.endswith("_call") and isinstance(item.get("name"), str):
            name = str(item["name"])
            args = item.get("arguments", item.get("input", ""))
            args = args if isinstance(args, str) else orjson.dumps(args).decode()
            entries.append(_entry(f"{CALL} {name}", _clip(args.strip(), ARGS_CHARS)))
            tools.append(name)
            # The output right after its call (Codex sends parallel calls first, then their
            # outputs): a line of it and the command that printed it stay together.
            output = outputs.pop(answers.get(at, -1), None)
            if output is not None:
                entries.append(_entry(f"{OUTPUT} {name}", _clip(output, OUTPUT_CHARS)))
    entries += [_entry(f"{OUTPUT} {UNNAMED}", _clip(out, OUTPUT_CHARS)) for out in outputs.values()]
    return _ends("\n".join(entries)), list(dict.fromkeys(tools))


def _ends(text: str) -> str:
    """``text`` within TURN_CHARS: its head and its tail, each from an entry's start, with a
    line saying what was left out between them. A long task's end (the patch it submitted,
    its answer) is what is asked about later, as much as its start."""
    if len(text) <= TURN_CHARS:
        return text
    half = TURN_CHARS // 2 - 100
    head = text[:half]
    tail = text[-half:]
    # The tail starts at an entry's head when one is near (every output line keeps its
    # call), else at a line's start, else where it is.
    near = tail[:TAIL_SNAP_CHARS]
    at = min((p for p in (near.find("\n" + c) for c in "TUA") if p >= 0), default=-1)
    if at < 0:
        at = near.find("\n")
    tail = tail[at + 1 :]  # at -1: as it is
    left = len(text) - len(head) - len(tail)
    return f"{head}\n[… {left} characters of this turn left out …]\n{tail}"
