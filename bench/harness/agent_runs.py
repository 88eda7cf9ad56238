"""The shared folder's agent runs (mini-swe-agent trajectories) as tasks, sessions of tasks,
and the Codex items a task becomes; the names in a text, for sufficiency. Read by
bench/trajectories.py, bench/load.py and bench/redact_real.py."""

from __future__ import annotations

import base64
import hashlib
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.harness.codex import Shapes, user_message
from bench.harness.pricing import message

Item = dict[str, Any]

TRAJECTORIES = Path(__file__).resolve().parents[3] / "shared" / "trajectories"
WORKDIR = "/testbed"

# --- the runs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    thought: str
    command: str
    output: str  # as Codex's exec_command reports it
    encrypted: str


@dataclass(frozen=True)
class Task:
    name: str
    system: str
    prompt: str
    steps: tuple[Step, ...]

    @property
    def submitted(self) -> str:
        return self.steps[-1].output if self.steps else ""


_BASH = re.compile(r"```bash\s*\n(.*?)\n?```", re.S)
_RC = re.compile(r"\s*<returncode>(-?\d+)</returncode>\s*(.*)", re.S)
# Reasoning items of runs that kept no encrypted reasoning get a blob of the median size of
# those that did (1,004 characters over the 60 runs), so every step carries one.
ENCRYPTED_CHARS = 1004


def load_task(path: Path) -> Task:
    """One mini-swe-agent trajectory file as a task of Codex steps."""
    data = orjson.loads(path.read_bytes())
    messages = data["messages"]
    name = str(data.get("instance_id") or path.name.split(".")[0])
    system = next(m["content"] for m in messages if m["role"] == "system")
    users = [m for m in messages if m["role"] == "user"]
    steps = []
    replies = iter(users[1:])
    r = random.Random(name)
    for m in messages:
        if m["role"] != "assistant":
            continue
        reply = next(replies, None)
        if reply is None:  # the run stopped after a call without an answer: nothing to replay
            break
        blocks = _BASH.findall(m["content"])
        thought = _BASH.sub("", m["content"]).strip()
        steps.append(Step(thought, blocks[0] if blocks else "", exec_output(reply["content"], r),
                          _encrypted(m, r)))
    return Task(name, system, users[0]["content"], tuple(steps))


def load_tasks(folder: Path = TRAJECTORIES) -> list[Task]:
    """Every run in ``folder``, by name; exits when there is none (no shared folder here)."""
    paths = sorted(folder.glob("*.traj.json"))
    if not paths:
        sys.exit(f"no trajectories at {folder} (the shared folder is not here)")
    return [load_task(p) for p in paths]


def exec_output(text: str, r: random.Random) -> str:
    match = _RC.match(text)
    code, body = (int(match[1]), match[2]) if match else (0, text)
    body = body.removeprefix("<output>").removesuffix("\n").removesuffix("</output>")
    return (f"Chunk ID: {r.randbytes(3).hex()}\nWall time: {r.uniform(0.05, 4):.4f} seconds\n"
            f"Process exited with code {code}\nOriginal token count: {len(body) // 4}\n"
            f"Output:\n{body}")


def _encrypted(m: dict[str, Any], r: random.Random) -> str:
    details = ((m.get("extra") or {}).get("response") or {}).get("choices") or [{}]
    parts = (details[0].get("message") or {}).get("reasoning_details") or []
    real = "".join(p.get("data") or "" for p in parts if p.get("type") == "reasoning.encrypted")
    if real:
        return real
    return base64.b64encode(r.randbytes(r.randint(ENCRYPTED_CHARS // 2, ENCRYPTED_CHARS))).decode()


# --- names, for sufficiency -------------------------------------------------------------------

_NAMES = re.compile(
    r"(?:[\w.-]+/)+[\w.-]+"  # a path with a slash
    r"|\b[\w-]+\.(?:py|txt|cfg|ini|toml|json|html|rst|sh|js|css|ya?ml|sql|po)\b"  # a file
    r"|\b_?[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b"  # snake_case
    r"|\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b"  # CamelCase
    r"|\b[a-z]+(?:[A-Z][a-z0-9]*)+\b"  # camelCase
)


def names(text: str) -> set[str]:
    """The paths and identifiers in a text (not plain words: those say nothing about memory)."""
    return {n.strip("./") for n in _NAMES.findall(text) if len(n.strip("./")) >= 4}


# --- sessions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    task: int  # 0-based task of the session that asks
    source: int  # the earlier task whose output showed the value
    value: str
    question: str


@dataclass(frozen=True)
class Session:
    kind: str  # "1 task", "5 tasks", ...
    thread: str
    tasks: tuple[Task, ...]
    asks: tuple[Ask, ...] = ()

    @property
    def repo(self) -> str:
        return repo_of(self.tasks[0].name)

    def prompt(self, j: int) -> str:
        asks = [a.question for a in self.asks if a.task == j]
        return "".join(f"{q}\n\n" for q in asks) + self.tasks[j].prompt


_INDEX = re.compile(r"^index ([0-9a-f]{7,}\.\.[0-9a-f]{7,})", re.M)
_DIFF = re.compile(r"^diff --git a/(\S+)", re.M)


def build_session(tasks: Sequence[Task]) -> Session:
    """``tasks`` in a row; in the second half, each task asks for the patch of an earlier one."""
    thread = stable_thread([t.name for t in tasks])
    kind = f"{len(tasks)} task" + ("s" if len(tasks) > 1 else "")
    asks: list[Ask] = []
    half = (len(tasks) + 1) // 2
    for j in range(half, len(tasks)):
        source = j - half
        value, path = _INDEX.search(tasks[source].submitted), _DIFF.search(tasks[source].submitted)
        others = "".join(t.prompt + "".join(s.output + s.command for s in t.steps)
                         for i, t in enumerate(tasks) if i != source)
        if value is None or path is None or value[1] in others:
            continue  # no patch, or its hashes are not unique to that task
        asks.append(Ask(j, source, value[1], (
            f"Before you start: in an earlier task you changed `{path[1]}`. Which blob hashes did "
            "the `index` line of its `git diff --cached` show? I need them for the release notes."
        )))
    return Session(kind, thread, tuple(tasks), tuple(asks))


def repo_of(task_name: str) -> str:
    """The repository of a SWE-bench task: ``scikit-learn__scikit-learn-10297`` ->
    ``scikit-learn``."""
    return task_name.split("__", 1)[0]


def stable_thread(names_: Sequence[str]) -> str:
    """A session id of its own for each run of tasks, the same on every replay."""
    # A real digest: a weighted byte sum gave django-11149 and django-15380 one id, so
    # the second replayed into the first's session and memory store.
    digest = int(hashlib.sha256("|".join(names_).encode()).hexdigest(), 16) % 10**12
    return f"019b7a00-{len(names_):04d}-7000-8000-{digest:012d}"


# --- a task as Codex items --------------------------------------------------------------------


def step_answer(task: Task, j: int, k: int) -> list[Item]:
    """What the model answers at step ``k`` of task ``j`` of a session: the step's reasoning
    and command, or after the last step its closing answer."""
    tag = f"{j}_{k}"
    if k == len(task.steps):
        return [reasoning(f"rs_{tag}", "**Done**", ""),
                message(f"Submitted the fix for {task.name}; the patch is the output of the "
                        "last command.", f"msg_{tag}")]
    step = task.steps[k]
    args = orjson.dumps({"cmd": step.command, "workdir": WORKDIR, "yield_time_ms": 10000})
    return [reasoning(f"rs_{tag}", step.thought, step.encrypted),
            {"type": "function_call", "status": "completed", "id": f"fc_{tag}",
             "name": "exec_command", "arguments": args.decode(), "call_id": f"call_{tag}"}]


def call_output(j: int, k: int, output: str) -> Item:
    """The output of step ``k``'s command, as Codex sends it back."""
    return {"type": "function_call_output", "id": f"fco_{j}_{k}", "call_id": f"call_{j}_{k}",
            "output": output}


def task_items(task: Task, j: int) -> list[Item]:
    """Task ``j`` of a session whole, as it ends up in the client's history: its prompt, each
    step's answer and output, the closing answer."""
    items = [user_message(task.prompt, f"msg_task_{j:03d}")]
    for k in range(len(task.steps) + 1):
        items += step_answer(task, j, k)
        if k < len(task.steps):
            items.append(call_output(j, k, task.steps[k].output))
    return items


def reasoning(item_id: str, summary: str, encrypted: str) -> Item:
    return {"type": "reasoning", "id": item_id,
            "summary": [{"type": "summary_text", "text": summary}] if summary else [],
            "content": None, "encrypted_content": encrypted or "gAAAA"}


def context(shapes: Shapes, system: str) -> list[Item]:
    """Codex's context messages, with the run's system message as one more developer message."""
    return [*shapes.context, {"type": "message", "role": "developer",
                              "content": [{"type": "input_text", "text": system}]}]
