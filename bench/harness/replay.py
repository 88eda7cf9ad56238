"""A session of agent runs played as a client plays it, and the fake model that answers it:
one loop for every client shape. A shape is what one client sends and what the model answers
it with: Codex's Responses requests (``CodexShape``, bench/harness/codex.py) or Claude Code's
Messages requests (bench/harness/claude.py). Read by bench/trajectories.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson

from bench.harness.agent_runs import (
    Session,
    Task,
    call_output,
    context,
    names,
    step_answer,
)
from bench.harness.codex import (
    AutoCompact,
    Shapes,
    chat_memory_call,
    compaction_input,
    read_answer,
    run_curl,
    search_command,
    user_message,
)
from bench.harness.pricing import TOKENIZER, SimClock, message

Item = dict[str, Any]


class Compact(Protocol):
    """A client's own compaction: when it is due, and the history after it."""

    count: int

    def seen(self, input_tokens: int) -> None: ...

    @property
    def due(self) -> bool: ...

    def compacted(self, history: list[Item], n_context: int, summary: str,
                  count_tokens: Callable[[str], int], item_id: str) -> list[Item]: ...


class Shape(Protocol):
    """One client's requests, and the fake model's answers in its protocol."""

    @property
    def path(self) -> str:
        """Where the requests go, under the base URL."""
        ...

    @property
    def writes(self) -> bool:
        """The provider reports cache writes (the usage the client sees has ``written``)."""
        ...

    def context(self, system: str) -> list[Item]: ...

    def add_prompt(self, history: list[Item], text: str, j: int) -> None: ...

    def request(self, history: list[Item], thread: str, turn_id: str, kind: str
                ) -> tuple[bytes, dict[str, str]]: ...

    def read_answer(self, raw: bytes) -> tuple[list[Item], dict[str, int]]: ...

    def call_output(self, j: int, k: int, output: str) -> Item: ...

    def compaction_input(self, history: list[Item]) -> list[Item]: ...

    def summary_of(self, answer: list[Item]) -> str: ...

    def auto_compact(self, limit: int) -> Compact: ...

    # The fake model's side: what a forwarded body holds, and the answers.
    def view(self, body: dict[str, Any]) -> tuple[object, object, list[Any], str]:
        """The session key, the head before the history (compared for cuts), the history
        (compared for cuts) and the text where the knowledge block stands."""
        ...

    def step(self, task: Task, j: int, k: int) -> list[Item]: ...

    def text(self, text: str, item_id: str | None) -> list[Item]: ...


@dataclass(frozen=True)
class CodexShape:
    """Codex's Responses requests (``Shapes``: a recorded request's shapes)."""

    shapes: Shapes
    path: str = "/v1/responses"
    writes: bool = False

    def context(self, system: str) -> list[Item]:
        return context(self.shapes, system)

    def add_prompt(self, history: list[Item], text: str, j: int) -> None:
        history.append(user_message(text, f"msg_task_{j:03d}"))

    def request(self, history: list[Item], thread: str, turn_id: str, kind: str
                ) -> tuple[bytes, dict[str, str]]:
        return self.shapes.request(history, thread, turn_id, kind=kind)

    def read_answer(self, raw: bytes) -> tuple[list[Item], dict[str, int]]:
        return read_answer(raw)

    def call_output(self, j: int, k: int, output: str) -> Item:
        return call_output(j, k, output)

    def compaction_input(self, history: list[Item]) -> list[Item]:
        return compaction_input(history)

    def summary_of(self, answer: list[Item]) -> str:
        return str(next(i for i in answer if i.get("type") == "message")["content"][0]["text"])

    def auto_compact(self, limit: int) -> Compact:
        return AutoCompact(limit=limit)

    def view(self, body: dict[str, Any]) -> tuple[object, object, list[Any], str]:
        items = body.get("input") or []
        instructions = body.get("instructions")
        return body.get("prompt_cache_key"), instructions, items, instructions or ""

    def step(self, task: Task, j: int, k: int) -> list[Item]:
        return step_answer(task, j, k)

    def text(self, text: str, item_id: str | None) -> list[Item]:
        return [message(text, item_id)]


# --- the model --------------------------------------------------------------------------------


@dataclass
class Expect:
    """What the client's next request is for; the fake model answers from it."""

    kind: str  # "turn" or "compaction"
    task: int
    step: int
    extends: bool  # the client's request extends its previous one
    names: frozenset[str] = frozenset()  # of the next command: seen earlier in the session
    older: frozenset[str] = frozenset()  # of those, the ones seen only in earlier tasks
    ask: str | None = None
    summary: str = ""


@dataclass
class Record:
    kind: str
    task: int
    input_tokens: int = 0
    cached_tokens: int = 0
    cut: bool = False
    memory: bool = False  # the forwarded request carried a memory block


@dataclass
class ReplayModel:
    """The fake model: answers what the client expects, and looks at what reached it."""

    session: Session
    shape: Shape
    expect: Expect | None = None
    records: list[Record] = field(default_factory=list)
    names_seen: int = 0
    names_visible: int = 0
    older_seen: int = 0
    older_visible: int = 0
    asks: dict[int, bool] = field(default_factory=dict)  # task -> its fact reached the model
    # The names of the last request that were not in view, and the chat-memory search line
    # its knowledge block offered (None: no block): the replay runs the search for each.
    missed: tuple[list[str], str | None] = ([], None)
    _last: tuple[Any, list[Any]] | None = None

    def __call__(self, body: dict[str, Any], raw: bytes) -> list[Item]:
        e, self.expect = self.expect, None
        key, head, items, head_text = self.shape.view(body)
        if e is None or key != self.session.thread:
            self.records.append(Record("side", -1))  # a call of the proxy's own: billed, echoed
            return self.shape.text("ok", None)
        last, self._last = self._last, (head, items)
        cut = (e.extends and last is not None
               and (last[0] != head or items[: len(last[1])] != last[1]))
        text = raw.decode("utf-8", "replace")
        self.records.append(Record(e.kind, e.task, cut=cut, memory="_memory>" in text))
        self.names_seen += len(e.names)
        self.names_visible += sum(n in text for n in e.names)
        self.missed = ([n for n in sorted(e.names) if n not in text], chat_memory_call(head_text))
        self.older_seen += len(e.older)
        self.older_visible += sum(n in text for n in e.older)
        if e.ask is not None:
            self.asks[e.task] = e.ask in text
        if e.kind == "compaction":
            return self.shape.text(e.summary, f"msg_summary_{len(self.records)}")
        return self.shape.step(self.session.tasks[e.task], e.task, e.step)


def summarise(session: Session, upto: int, step: int, commands: list[str]) -> str:
    """What the fake summariser writes: the tasks so far, the names the commands used (newest
    first, at most 80), the last command. It reads the whole history, as a real one would."""
    used: list[str] = []
    for cmd in reversed(commands):
        used += [n for n in sorted(names(cmd)) if n not in used]
    tasks = "\n".join(
        f"- {t.name}: " + ("done, patch submitted" if j < upto else f"in progress, {step} steps")
        for j, t in enumerate(session.tasks[: upto + 1]))
    last = commands[-1] if commands else ""
    return (f"SUMMARY:\nTasks:\n{tasks}\nFiles and names worked with: {', '.join(used[:80])}\n"
            f"Last command: {last[:400]}\nNext: continue the current task.")


@dataclass
class Searches:
    """The names a command reused that were not in view, and those a search of the chat memory
    for the name (the model's first move, were it to miss one) would have brought back."""

    missed: int = 0
    offered: int = 0  # missed while the knowledge block offered the chat-memory search
    found: int = 0

    async def run(self, http: aiohttp.ClientSession, names_: list[str], line: str | None) -> None:
        self.missed += len(names_)
        if line is None:
            return
        for name in names_:
            self.offered += 1
            self.found += name in await run_curl(http, search_command(line, name))


# --- the client -------------------------------------------------------------------------------


async def replay(http: aiohttp.ClientSession, url: str, session: Session, shape: Shape,
                 model: ReplayModel, clock: SimClock, compact: Compact,
                 searches: Searches | None = None) -> list[dict[str, int]]:
    """Play the session as the client would; returns the usage the client saw per request.
    Over 60 lines because it is the client's whole session (its turns, its compactions)."""
    r = random.Random(session.thread)
    history = shape.context(session.tasks[0].system)
    n_context = len(history)
    static = names("".join(orjson.dumps(i).decode() for i in history))
    known: set[str] = set()  # names seen so far in the session, outside the context
    commands: list[str] = []
    seen: list[dict[str, int]] = []
    extends = False

    async def send(expect: Expect, items: list[Item], turn_id: str) -> list[Item]:
        model.expect = expect
        body, headers = shape.request(items, session.thread, turn_id, expect.kind)
        async with http.post(url + shape.path, data=body, headers=headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
            output, usage = shape.read_answer(await resp.read())
        seen.append(usage)
        compact.seen(usage["input"])
        missed, model.missed = model.missed, ([], None)
        if searches is not None and missed[0]:
            await searches.run(http, *missed)
        clock.now += r.uniform(2, 20)  # the model thinks
        return output

    async def compaction(j: int, k: int, turn_id: str) -> None:
        nonlocal history, extends
        # Not counted as extending: Codex's has no tools, so its prompt differs from the start.
        e = Expect("compaction", j, k, False, summary=summarise(session, j, k, commands))
        output = await send(e, shape.compaction_input(history), turn_id)
        history = compact.compacted(history, n_context, shape.summary_of(output),
                                    TOKENIZER.count, f"msg_summary_{compact.count}_{j}_{k}")
        extends = False

    for j, task in enumerate(session.tasks):
        clock.now += r.uniform(20, 240)  # the user reads the last answer, types the next task
        turn_id = f"{session.thread[:-4]}{j:04d}"
        if compact.due:
            await compaction(j, 0, turn_id)
        prompt = session.prompt(j)
        shape.add_prompt(history, prompt, j)
        prompt_names = names(prompt)
        in_task: set[str] = set()  # names seen in this task's own steps
        ask = next((a.value for a in session.asks if a.task == j), None)
        for k in range(len(task.steps) + 1):
            if k and compact.due:
                await compaction(j, k, turn_id)
            command = names(task.steps[k].command) if k < len(task.steps) else set()
            wanted = frozenset(n for n in command & known if n not in static | prompt_names)
            e = Expect("turn", j, k, extends, wanted, wanted - in_task,
                       ask if k == 0 else None)
            history.extend(await send(e, history, turn_id))
            extends = True
            if k < len(task.steps):
                step = task.steps[k]
                clock.now += r.uniform(0.1, 5)  # the command runs
                history.append(shape.call_output(j, k, step.output))
                commands.append(step.command)
                learnt = names(step.command) | names(step.output) | names(step.thought)
                known |= learnt
                in_task |= learnt
        known |= prompt_names
    return seen
