"""bench.recall's synthetic data: background memories, facts and the Codex sessions that use them.

- ``Text``: Zipf-distributed words, and background memories (episodes, facts, task notes) of
  them; ``background_scope``: half in the sessions' scope (``SCOPE``), half in others';
- ``Fact``: a statement made early in a session and the question that asks for it late,
  with a value found nowhere else; ``make_session`` and ``session_requests``: the Codex
  sessions that state and ask them, request by request, as Codex sends them;
- ``questions`` and ``prompts``: what the store searches are timed with.

Also used by bench/recall_hybrid.py (its lexical facts, sessions and background).
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from bench.harness import session as bench_session
from ctxproxy.memory.model import Memory, MemoryType, Scope, user_ref

SERVICE, TEAM, AGENT, USER_KEY = "bench", "bench-team", "bench-agent", "bench-user-key"
SCOPE = Scope(SERVICE, TEAM, AGENT, user_ref(USER_KEY))


# --- synthetic text ----------------------------------------------------------------------------

_COMMON = (
    "database port service cluster region deploy staging production branch prefix tool "
    "version python node rate limit tenant request vault secret path config test build "
    "release migration index schema queue worker retry timeout cache log metric alert "
    "page on-call team owner api client server endpoint token header status error fix "
    "bug feature refactor review merge commit pipeline job runner image container host "
    "disk memory cpu latency throughput budget ledger account balance posting invoice"
).split()
_SYLLABLES = "ka lo mi nu pe ra si to vu xe zo ba de fi gu ho ja ke li mo ny po qu re sa".split()


def _pseudo(rng: random.Random) -> str:
    return "".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4)))


def _vocabulary(rng: random.Random, size: int = 4000) -> list[str]:
    """Most frequent first: 30 filler words (the role stopwords play in real text, but not
    dropped by search), then the domain words the questions use, then a long tail."""
    words = [_pseudo(rng) for _ in range(30)]
    domain = sorted(set(_COMMON) | set(bench_session.WORDS))
    rng.shuffle(domain)
    words += domain
    while len(words) < size:
        words.append(_pseudo(rng))
    return words


class Text:
    """Zipf-distributed words: a few very common, a long tail of rare ones, like real notes."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.words = _vocabulary(self.rng)
        weights = [1.0 / (rank + 1) ** 1.05 for rank in range(len(self.words))]
        self.cum = list(itertools.accumulate(weights))

    def sentence(self, n: int) -> str:
        return " ".join(self.rng.choices(self.words, cum_weights=self.cum, k=n))

    def memory(self, scope: Scope, n: int, now: float) -> Memory:
        roll = self.rng.random()
        at = now - self.rng.uniform(3600, 30 * 86400)  # older than any bench session
        kind: MemoryType = "episodic" if roll < 0.85 else "semantic" if roll < 0.97 else "working"
        if kind == "episodic":
            text = (f"user: {self.sentence(self.rng.randint(8, 30))}\nassistant: "
                    f"{self.sentence(self.rng.randint(10, 40))}\ntool exec_command: "
                    f"{self.sentence(self.rng.randint(0, 30))}")
        else:
            text = self.sentence(self.rng.randint(5, 14))
        session = f"bg-{self.rng.randint(0, max(1, n // 20))}"
        return Memory(type=kind, scope=scope, key=f"bg-{n}", text=text, session_id=session,
                      turn_index=self.rng.randint(1, 40), created_at=at, updated_at=at,
                      expires_at=None if kind != "working" else now - 1)


def background_scope(rng: random.Random) -> Scope:
    """Half the background shares the sessions' scope; the rest is other agents' and teams'."""
    if rng.random() < 0.5:
        return SCOPE
    n = rng.randint(1, 9)
    return Scope(SERVICE, f"team-{n % 3}", f"agent-{n}", user_ref(f"user-{n}"))


# --- facts: stated early, asked late -----------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    statement: str
    question: str
    value: str  # appears nowhere else: if it is in the prompt, the memory brought it


def all_facts(rng: random.Random) -> list[Fact]:
    port = str(rng.randint(20000, 29999))
    region = f"eu-{rng.choice(['north', 'west', 'south'])}-{rng.randint(11, 99)}"
    prefix = "ft" + "".join(rng.choices("qxzvwk", k=4))
    limit = str(rng.randint(1100, 9900))
    pyver = f"3.{rng.randint(11, 13)}.{rng.randint(1, 9)}"
    vault = f"kv/ledger/{rng.randint(100, 999)}"
    alias = "oncall-" + "".join(rng.choices("bcdfghjkmnp", k=5))
    tool = "deploy" + "".join(rng.choices("rstvx", k=3))
    return [
        Fact(f"Note for later: our main database is PostgreSQL 15 on port {port}.",
             "Quick check before you go on: which port does our main database listen on?",
             port),
        Fact(f"FYI the staging cluster runs in the {region} region.",
             "In which region does the staging cluster run again?", region),
        Fact(f"Remember: feature branches must start with the prefix {prefix}/.",
             "What prefix must feature branches start with?", prefix),
        Fact(f"The API rate limit is {limit} requests per minute per tenant.",
             "What is the API rate limit per tenant?", limit),
        Fact(f"New services use Python {pyver}, pinned in the Dockerfile.",
             "Which Python version do new services use?", pyver),
        Fact(f"Secrets for the ledger live in Vault under the path {vault}.",
             "Under which Vault path do the ledger secrets live?", vault),
        Fact(f"Page the on-call alias {alias} when the settle worker alerts.",
             "Which on-call alias do I page when the settle worker alerts?", alias),
        Fact(f"We release with the {tool} script, never by hand.",
             "Which script do we release with?", tool),
    ]


TASKS = [
    "Refactor the settle worker so that retries are idempotent.",
    "Add pagination to the ledger export endpoint.",
    "Make the balance cache invalidate on every posting.",
    "Speed up the slow tests in tests/test_settle.py.",
    "Write a migration that adds an index on (tenant_id, posted_at).",
]
FILLER = [
    "Now run the tests for {m} and tell me what fails.",
    "Open {m} and explain the retry loop briefly.",
    "Rename the helper in {m} to something clearer.",
    "Add a docstring to the main class in {m}.",
    "Check {m} for unused imports and remove them.",
    "Show me the git diff for {m}.",
]


@dataclass
class Session:
    """One Codex thread: its id, and the user prompt of every turn in order."""

    session_id: str
    prompts: list[str]
    asks: dict[int, Fact]  # turn index -> the fact it asks about
    stated: dict[int, Fact]


def make_session(rng: random.Random, turns: int, n_facts: int) -> Session:
    facts = rng.sample(all_facts(rng), n_facts)
    prompts = [rng.choice(TASKS)]
    stated: dict[int, Fact] = {}
    for n, fact in enumerate(facts, start=1):  # facts in turns 1..n (turn 0 is the task)
        prompts.append(f"{fact.statement} {rng.choice(FILLER).format(m=rng.choice(MODULES))}")
        stated[n] = fact
    while len(prompts) < turns - n_facts:
        prompts.append(rng.choice(FILLER).format(m=rng.choice(MODULES)))
    asks: dict[int, Fact] = {}
    for fact in facts:
        asks[len(prompts)] = fact
        prompts.append(fact.question)
    return Session(str(uuid.UUID(int=rng.getrandbits(128))), prompts, asks, stated)


MODULES = ["workers/settle.py", "ledger/posting.py", "api/routes.py", "ledger/balance.py"]


def _message(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    item: dict[str, Any] = {"type": "message", "role": role,
                            "content": [{"type": kind, "text": text}]}
    if role == "assistant":
        item["status"] = "completed"
    return item


def _finished_turn(rng: random.Random, prompt: str, n: int) -> list[dict[str, Any]]:
    """A user prompt, one command and its output, the answer: as Codex resends a turn."""
    call_id = f"call_{n}_{rng.getrandbits(48):012x}"
    output = "\n".join(f"{rng.choice(MODULES)}:{rng.randint(1, 300)}: ok" for _ in range(6))
    return [
        _message("user", prompt),
        {"type": "function_call", "name": "exec_command", "call_id": call_id,
         "arguments": orjson.dumps({"cmd": f"rg -n retry {rng.choice(MODULES)}"}).decode(),
         "status": "completed"},
        {"type": "function_call_output", "call_id": call_id, "output": output},
        _message("assistant", f"Done: {prompt[:60]}"),
    ]


def session_requests(session: Session, seed: int) -> Iterator[tuple[int, dict[str, Any],
                                                                     dict[str, str]]]:
    """(turn, body, headers) of the first request of every turn of ``session``."""
    rng = random.Random(seed)
    context = bench_session.context_items(rng)
    done: list[dict[str, Any]] = []
    for turn, prompt in enumerate(session.prompts):
        turn_id = f"{session.session_id[:8]}-turn-{turn}"
        meta = orjson.dumps({"session_id": session.session_id, "turn_id": turn_id,
                             "request_kind": "turn"}).decode()
        body = {
            "model": "gpt-5.5", "stream": True, "store": False, "tools": bench_session.tools(),
            "input": [*context, *done, _message("user", prompt)],
            "tool_choice": "auto", "parallel_tool_calls": True,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": session.session_id,
            "client_metadata": {"x-codex-turn-metadata": meta},
        }
        headers = {
            "session-id": session.session_id, "x-codex-turn-metadata": meta,
            "x-team-id": TEAM, "x-agent-id": AGENT, "x-tdai-user-key": USER_KEY,
            "Authorization": "Bearer sk-bench", "Content-Type": "application/json",
            "Accept": "text/event-stream",
        }
        yield turn, body, headers
        done += _finished_turn(rng, prompt, turn)


# --- what the store's searches are timed with --------------------------------------------------


def questions(n: int) -> list[str]:
    """What recall searches with: the facts' questions, whatever their values."""
    rng = random.Random(1)
    return [f.question for _ in range(n // 8 + 1) for f in all_facts(rng)][:n]


def prompts(text: Text, n: int) -> list[str]:
    """Long prompts of the background's own words, fillers included: they match most
    records of the scope, the expensive case for a ranked search."""
    return [text.sentence(text.rng.randint(12, 30)) for _ in range(n)]
