"""What a cut leaves behind: the <earlier_turns> message, stable between cuts and bounded."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

from lxml import etree
from multidict import CIMultiDict, CIMultiDictProxy

from ctxproxy.config import load_settings
from ctxproxy.injectors.cut_digest import CutTurn, render
from ctxproxy.request import Exchange, History, Identity, is_turn_start
from ctxproxy.window import digest as digest_module
from ctxproxy.window.digest import Digests, digest_message
from ctxproxy.window.step import WindowStep
from tests.fakes import codex

Item = dict[str, Any]


def task(n: int, calls: int = 3, output: str = "ok") -> list[Item]:
    items = [codex.text("user", f"task {n}: fix src/mod_{n}/core.py")]
    for c in range(calls):
        call = f"call_{n}_{c}"
        items += [
            {"type": "reasoning", "id": f"rs_{n}_{c}", "summary": [], "encrypted_content": "e"},
            {"type": "function_call", "name": "exec_command", "call_id": call,
             "arguments": json.dumps({"cmd": f"grep -n helper_{n}_{c} src/shared.py"})},
            {"type": "function_call_output", "call_id": call,
             "output": f"src/found_{n}_{c}.py:12: ParserState used here\n{output}"},
        ]
    return [*items, codex.text("assistant", f"Fixed task {n}.")]


def exchange(items: list[Item]) -> Exchange:
    raw = json.dumps(codex.request(items)).encode()
    return Exchange.parse(raw, CIMultiDictProxy(CIMultiDict(codex.headers())),
                          load_settings(env={}))


async def forward(step: WindowStep, items: list[Item]) -> list[Item]:
    ex = exchange(items)
    await step(ex)
    return list(ex.body["input"])


def digest_of(items: list[Item]) -> etree._Element | None:
    for item in items:
        text = item.get("content", [{}])[0].get("text", "") if item.get("role") == "developer" \
            else ""
        if text.startswith("<earlier_turns"):
            return etree.fromstring(text.encode())
    return None


def seen_names(digest: etree._Element) -> list[str]:
    return (digest.findtext("seen") or "").split()


async def test_a_cut_leaves_a_map_of_the_names_the_cut_turns_used() -> None:
    step = WindowStep(2, policy=None, digest_chars=8000)  # the fixed window: cut to 2 turns
    items = [*codex.context_items(), *task(1), *task(2), *task(3),
             codex.text("user", "task 4: go on")]
    sent = await forward(step, items)

    digest = digest_of(sent)
    assert digest is not None
    assert digest.find("seen") is not None and digest.find("seen").get("turns") == "1-2"
    # A map, not a transcript: the names the commands used, no commands, nothing of what
    # only their outputs showed, no prompts.
    names = seen_names(digest)
    assert {f"helper_{n}_{c}" for n in (1, 2) for c in range(3)} <= set(names)
    assert not {"src/found_1_0.py", "ParserState"} & set(names)
    # Of the prompts, only the newest cut turn's start: what the session was on.
    assert [(t.get("n"), t.text) for t in digest.findall("turn")] == [
        ("2", "task 2: fix src/mod_2/core.py")]
    assert "task 1" not in etree.tostring(digest, encoding="unicode")
    # A name both turns used is told once, and first: later turns go back to it.
    assert names.count("src/shared.py") == 1 and names[0] == "src/shared.py"
    # It stands right before the first kept turn's prompt, after the pinned context.
    at = next(i for i, item in enumerate(sent) if is_turn_start(item))
    assert digest_of([sent[at - 1]]) is not None
    assert sent[: at - 1] == codex.context_items()


async def test_the_digest_is_the_same_bytes_until_the_next_cut() -> None:
    step = WindowStep(2, slack=2, policy=None, digest_chars=8000)
    history = codex.context_items()
    sent = []
    for n in range(1, 9):
        history = [*history, *task(n)]
        sent.append(await forward(step, [*history, codex.text("user", f"task {n + 1}")]))
    digests = [etree.tostring(d) if (d := digest_of(s)) is not None else None for s in sent]
    # slack 2: the cut moves every third turn (at 5 and 8 turns), the digest with it, never
    # in between
    assert digests[:3] == [None, None, None]
    assert len(set(digests[3:6])) == 1 and len(set(digests[6:8])) == 1
    assert None not in digests[3:] and digests[3] != digests[6]


def test_the_digest_names_what_the_model_wrote_beyond_the_shown_command() -> None:
    # A script written by a heredoc: its command is shown shortened, but the names in it
    # (and in the model's reasoning summary) are what its later commands reuse.
    script = ("cat <<'EOF' > repro_check.py\n" + "x = 1\n" * 60
              + "settings.configure(INSTALLED_APPS=[])\nEOF")
    turn = [codex.text("user", "task 1: reproduce it"),
            {"type": "reasoning", "id": "rs_1", "encrypted_content": "e",
             "summary": [{"type": "summary_text", "text": "Check the QuerySetIterator first"}]},
            {"type": "function_call", "name": "exec_command", "call_id": "c1",
             "arguments": json.dumps({"cmd": script})},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
            codex.text("assistant", "Reproduced.")]
    items = [*codex.context_items(), *turn, *task(2), codex.text("user", "task 3")]
    made = digest_message(History(items), 1, 8000)
    assert made is not None
    seen = seen_names(etree.fromstring(made["content"][0]["text"].encode()))
    assert {"INSTALLED_APPS", "settings.configure", "QuerySetIterator"} <= set(seen)


def test_the_digest_keeps_to_its_budget_most_used_names_first() -> None:
    # Turn n used name_n_c in c + 1 of its texts, and "common" in every turn.
    turns = [CutTurn(n, f"prompt {n}", (*(f"name_{n}_{c}" for c in range(40)), "common"),
                     (*(c + 1 for c in range(40)), 1)) for n in range(1, 30)]
    text = render(reversed(turns), 600)
    assert text is not None and len(text) <= 600
    told = seen_names(etree.fromstring(text.encode()))
    assert told[0] == "common"  # every turn used it
    # then by how many texts used each, the newest turn first among equals
    assert told[1:4] == ["name_29_39", "name_28_39", "name_27_39"]
    # A name inside a longer one told is not told again: the longer says it.
    inside = render([CutTurn(1, "p", ("core.py", "src/core.py"), (5, 1))], 600)
    assert inside is not None and seen_names(etree.fromstring(inside.encode())) == ["src/core.py"]
    assert render(reversed(turns), 250) is None  # not even the block's own tags fit


def test_hostile_outputs_cost_bounded_work() -> None:
    # Only the head of each output is read: a megabyte-long word or run of separators gives
    # the same digest as ten kilobytes of it, so the work does not grow with the output.
    def digest(size: int) -> Item | None:
        items = [*codex.context_items(), *task(1, output="a" * size),
                 *task(2, output="/" * size), codex.text("user", "next")]
        return digest_message(History(items), 2, 8000)

    small, huge = digest(10_000), digest(1_000_000)
    assert small is not None and small == huge
    assert len(small["content"][0]["text"]) <= 8000


async def test_each_cut_turn_is_read_once_and_every_digest_is_as_if_made_afresh() -> None:
    digests = Digests(8000)
    who = Identity(team_id="t", agent_id="a", user_key=None, session_id="s1")
    items = [*codex.context_items()]
    reads: list[int] = []
    original = digest_module._cut_turn

    def counting(history: History, n: int, clean: Any) -> CutTurn:
        reads.append(n)
        return original(history, n, clean)

    for n in range(1, 7):  # each request cuts one more turn
        items += task(n, output="log line\n" * 100)
        history = History([*items, codex.text("user", f"task {n + 1}")])
        with mock.patch.object(digest_module, "_cut_turn", counting):
            made = await digests.message(history, n, who)
        assert made is not None and made == digest_message(History(history.items), n, 8000)
    assert sorted(reads) == list(range(6))
