"""bench.economics's synthetic sessions: Codex-shaped tool loops whose turns print 1-8 KB
outputs, with facts planted early (by the user or in a tool output) and asked about later,
each fact's value appearing in its planting turn only."""

from __future__ import annotations

import base64
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from bench.harness.pricing import message

__all__ = ["BIRDS", "TASKS", "WORDS", "Fact", "Item", "Session", "Turn", "build_session",
           "reasoning"]

Item = dict[str, Any]

WORDS = (
    "request response window session cache token parser config router handler memory index "
    "client server stream event budget prefix store record queue worker retry timeout limit "
    "metric trace span user agent tool call output input item turn prompt block render schema "
    "field value default error status header body chunk buffer offset cursor batch loader "
    "writer reader policy scope tenant migration snapshot digest encoder decoder registry"
).split()
BIRDS = "heron kestrel plover avocet dunlin osprey merlin curlew godwit shrike".split()
TASKS = (
    "Fix the failing test in tests/test_{a}.py and explain the cause.",
    "Add a --{a} flag to the {b} command and cover it with a test.",
    "Refactor {a}_{b} in src/{c}/{a}.py so that it no longer blocks the event loop.",
    "Why does the {a} {b} time out under load? Check the logs and the code.",
    "Rename {a}_{b} to {b}_{a} everywhere and keep the public API working.",
    "Write a short design note on how the {a} {b} should handle retries.",
    "Look at the {a} module and tell me what would break if we removed {b}.",
    "Update the docs for the {a} {b} and check that the examples still run.",
    "CI is red on main since the {a} change, can you find out why?",
    "ok, now make {a} configurable and default it to off",
    "Profile {a}_{b}: it got slower this week.",
    "Can you split src/{a}.py? It is getting too long to read.",
    "Add type hints to the {a} package and make mypy pass.",
    "The {a} endpoint returns 500 when {b} is empty. Reproduce it and fix it.",
    "Please review my last commit on the {a} branch and point out anything risky.",
    "Move the {a} constants into one place and delete the duplicates.",
    "Write a migration that backfills {a}.{b} for existing rows.",
    "Bump the {a} dependency and fix whatever breaks.",
    "What does {a}_{b} actually return when the {c} is missing?",
    "Make the {a} logs less noisy, only warnings and up by default.",
    "Add a retry with backoff around the {a} client calls.",
    "Delete the dead code in src/{a}/ that nothing imports anymore.",
    "Turn the {a} script into a proper CLI subcommand.",
    "Thanks. Now add a changelog entry for the {a} work.",
)
ASK_TAILS = ("I need it for the next change.", "Put it where it belongs in the config.",
             "Double-check it before you use it.")
# (statement with {v}, question, value maker): each value is unique to its fact.
FACTS: tuple[tuple[str, str, Callable[[random.Random], str]], ...] = (
    ("The staging database host is {v}.", "What is the staging database host again?",
     lambda r: f"pg-stg-{r.randint(100, 999)}.corp.internal"),
    ("Our release branch for this cycle is {v}.", "Which release branch do we cut from?",
     lambda r: f"release/{r.choice(BIRDS)}-{r.randint(1000, 9999)}"),
    ("The new parser is behind the feature flag {v}.", "What is the new parser's feature flag?",
     lambda r: f"FF_PARSER_{r.choice(BIRDS).upper()}_{r.randint(10, 99)}"),
    ("The on-call engineer for payments this week is {v}.", "Who is on call for payments?",
     lambda r: f"{r.choice(['Ines', 'Tomasz', 'Akua', 'Ravi'])} {r.choice(BIRDS).title()}son"),
    ("The partner tier rate limit is {v} requests per minute.",
     "What is the partner tier rate limit?", lambda r: f"{r.randint(2, 9)},{r.randint(100, 999)}"),
    ("Build artifacts go to the bucket {v}.", "Which bucket do build artifacts go to?",
     lambda r: f"s3://acme-artifacts-{r.choice(BIRDS)}-{r.randint(10, 99)}"),
    ("We must keep the legacy endpoint {v} working.", "Which legacy endpoint must keep working?",
     lambda r: f"/v1/legacy/{r.choice(BIRDS)}-sync"),
    ("The CI secret holding the deploy token is {v}.", "What is the CI secret with the token?",
     lambda r: f"DEPLOY_TOKEN_{r.choice(BIRDS).upper()}_{r.randint(100, 999)}"),
    ("Questions about the SDK go to the channel {v}.", "Where do SDK questions go?",
     lambda r: f"#sdk-{r.choice(BIRDS)}-help"),
    ("The gateway's max body size is {v}.", "What max body size did we set on the gateway?",
     lambda r: f"{r.randint(11, 99)} MiB"),
)


@dataclass(frozen=True)
class Fact:
    value: str
    planted: int  # user turn, 1-based
    asked: int
    source: str  # "user": said in a prompt; "tool": in the middle of a tool's output


@dataclass(frozen=True)
class Turn:
    index: int  # 1-based
    prompt: str
    responses: tuple[list[Item], ...]  # the model's answer to each request of this turn
    outputs: dict[str, str]  # call_id -> what the tool printed
    ask: Fact | None
    think_s: float  # the user's pause before this turn


@dataclass(frozen=True)
class Session:
    thread: str
    seed: int
    turns: list[Turn]
    facts: list[Fact]


def _ident(r: random.Random) -> str:
    return f"{r.choice(WORDS)}_{r.choice(WORDS)}"


def _line(r: random.Random, kind: str) -> str:
    w, n = r.choice(WORDS), r.randint(1, 400)
    if kind == "code":
        return r.choice((
            f"    def {_ident(r)}(self, {w}: {w.title()}) -> {r.choice(WORDS).title()}:",
            f"        {w} = self.{_ident(r)}({r.choice(WORDS)}, {n})",
            f"        if {w} is None or {w}.{r.choice(WORDS)} > {n}:",
            f"        # {' '.join(r.choices(WORDS, k=r.randint(4, 10)))}",
            f"class {w.title()}{r.choice(WORDS).title()}:",
            f"        return {_ident(r)}({w}, {r.choice(WORDS)}={n})",
        ))
    if kind == "grep":
        return f"src/{w}/{_ident(r)}.py:{n}:        {_ident(r)}({r.choice(WORDS)}, {n})"
    if kind == "test":
        return f"tests/test_{w}.py::test_{_ident(r)} {r.choice(('PASSED', 'PASSED', 'FAILED'))}"
    if kind == "diff":
        sign = r.choice("+- ")
        return f"{sign}        {_ident(r)} = {r.choice(WORDS)}.{_ident(r)}({n})"
    return f"-rw-r--r-- 1 dev dev {n * 37} Nov 29 12:{n % 60:02d} {_ident(r)}.py"


COMMANDS = {
    "code": "sed -n '1,240p' src/{w}/{f}.py", "grep": "rg -n '{f}' src tests",
    "test": "pytest -q tests/test_{w}.py", "diff": "git diff -- src/{w}",
    "ls": "ls -la src/{w}",
}


def _tool_output(r: random.Random, kind: str, planted: str | None = None) -> str:
    size = int(1000 * 8 ** r.random())  # 1-8 KB, small ones more often (log-uniform)
    lines: list[str] = []
    while sum(len(x) + 1 for x in lines) < size:
        lines.append(_line(r, kind) if not planted else
                     f"- {' '.join(r.choices(WORDS, k=r.randint(5, 12)))}.")
    if planted:
        lines.insert(len(lines) // 2, f"- {planted}")
    text = "\n".join(lines) + "\n"
    return (f"Chunk ID: {r.randbytes(3).hex()}\nWall time: {r.uniform(0.05, 4):.4f} seconds\n"
            f"Process exited with code {r.choice((0, 0, 0, 1))}\nOriginal token count: "
            f"{len(text) // 4}\nOutput:\n{text}")


def reasoning(r: random.Random, item_id: str) -> Item:
    blob = base64.b64encode(r.randbytes(r.randint(150, 600))).decode()
    summary = f"**{r.choice(WORDS).title()}**\n\n" + " ".join(r.choices(WORDS, k=12))
    return {"type": "reasoning", "id": item_id,
            "summary": [{"type": "summary_text", "text": summary}],
            "content": None, "encrypted_content": "gAAAA" + blob}


def build_session(turns: int, seed: int = 7) -> Session:
    """A deterministic session of ``turns`` user turns; the same seed gives the same bytes."""
    r = random.Random(f"{seed}:{turns}")
    n_facts = min(len(FACTS), max(2, turns // 8))
    plant_at = _spread(n_facts, 2, max(3, turns // 3))
    ask_at = _spread(n_facts, turns // 2 + 1, turns)
    facts = [Fact(FACTS[i][2](r), p, a, "user" if i % 2 == 0 else "tool")
             for i, (p, a) in enumerate(zip(plant_at, ask_at, strict=True))]
    plants = {f.planted: (i, f) for i, f in enumerate(facts)}
    asks = {f.asked: (i, f) for i, f in enumerate(facts)}
    thread = f"019a{seed:04d}-{turns:04d}-7000-8000-0000c0de{turns:04d}"
    out: list[Turn] = []
    seen_prompts: set[str] = set()
    for t in range(1, turns + 1):
        prompt = ""
        while not prompt or prompt in seen_prompts:
            prompt = r.choice(TASKS).format(a=r.choice(WORDS), b=r.choice(WORDS), c=r.choice(WORDS))
        seen_prompts.add(prompt)
        planted = None
        if t in plants:
            i, fact = plants[t]
            statement = FACTS[i][0].format(v=fact.value)
            if fact.source == "user":
                prompt = f"Before you start: {statement} {prompt}"
            else:
                planted = statement
        if t in asks:  # a question of its own, as users ask them
            prompt = f"{FACTS[asks[t][0]][1]} {r.choice(ASK_TAILS)}"
        n_calls = r.choices((0, 1, 2, 3, 4), weights=(20, 30, 30, 15, 5))[0]
        if planted and n_calls == 0:
            n_calls = 1
        responses: list[list[Item]] = []
        outputs: dict[str, str] = {}
        for k in range(n_calls):
            kind = "notes" if planted and k == 0 else r.choice(tuple(COMMANDS))
            cmd = ("cat docs/NOTES.md" if kind == "notes" else
                   COMMANDS[kind].format(w=r.choice(WORDS), f=_ident(r)))
            call_id = f"call_t{t:03d}k{k}"
            outputs[call_id] = _tool_output(r, "ls" if kind == "notes" else kind,
                                            planted if kind == "notes" else None)
            args = orjson.dumps({"cmd": cmd, "yield_time_ms": 10000}).decode()
            responses.append([reasoning(r, f"rs_t{t:03d}k{k}"),
                              {"type": "function_call", "status": "completed",
                               "id": f"fc_t{t:03d}k{k}", "name": "exec_command",
                               "arguments": args, "call_id": call_id}])
        answer = " ".join(r.choices(WORDS, k=r.randint(25, 110))).capitalize() + "."
        responses.append([reasoning(r, f"rs_t{t:03d}f"), message(answer, f"msg_t{t:03d}")])
        out.append(Turn(t, prompt, tuple(responses), outputs,
                        asks[t][1] if t in asks else None, r.uniform(20, 240)))
    session = Session(thread, seed, out, facts)
    _check_facts(session)
    return session


def _spread(n: int, lo: int, hi: int) -> list[int]:
    """n distinct turns spread evenly over lo..hi (fewer if the range is short)."""
    if n == 1 or hi <= lo:
        return [lo] * n
    return [round(lo + i * (hi - lo) / (n - 1)) for i in range(n)]


def _check_facts(session: Session) -> None:
    """A fact's value must appear in its planting turn only, or recall would be measured wrong."""
    for fact in session.facts:
        for turn in session.turns:
            text = turn.prompt + "".join(turn.outputs.values()) + orjson.dumps(
                turn.responses).decode()
            if fact.value in text and turn.index != fact.planted:
                raise ValueError(f"fact value {fact.value!r} also appears in turn {turn.index}")
