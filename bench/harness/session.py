"""A realistic Codex request for benchmarks: a long session in the shapes of Codex CLI 0.169.0.

The shapes follow ``../shared/fixtures/codex`` (a developer system prompt of about 18 KB, more
developer messages, AGENTS.md and environment context as user-role messages, then turns with
reasoning, ``exec_command`` calls, ``apply_patch`` custom calls and their outputs); the text is
written here and filled in from a seeded generator, so every run sends the same bytes.

    body = request(turns=30)            # about 150 KB as compact JSON
    raw = encode(body); hdrs = headers()
"""

from __future__ import annotations

import base64
import random
from typing import Any

import orjson

Item = dict[str, Any]

CWD = "/home/dev/ledger-service"
SESSION_ID = "019a7c3e-5d41-7b20-9f3a-2c8e51d0a6b4"

_SYSTEM_SECTIONS = [
    "You are a coding agent working in a terminal next to a developer. You read the code "
    "before you change it, you run the project's own checks, and you say plainly what you "
    "did and what you did not do. Keep answers short; put detail in the code, not the chat.",
    "## Working in the repository\n- Search with `rg` before opening files; open the smallest "
    "range that answers the question.\n- Never revert changes you did not make. If the tree "
    "is dirty, work around what is there and mention it.\n- Prefer the project's scripts "
    "(`make test`, `npm run lint`) over hand-written commands.",
    "## Editing files\nUse the `apply_patch` tool for every edit. Keep each patch focused: one "
    "concern per hunk, the surrounding lines as context, no unrelated reformatting. Don't add "
    "license headers or comments that restate the code. When a change needs a test, add it "
    "next to the existing tests of the same module.",
    "## Running commands\nCommands run in a PTY with the workspace as the working directory. "
    "Long-running processes must be started in the background and polled with `write_stdin`. "
    "Quote paths that contain spaces. If a command needs the network and the sandbox forbids "
    "it, ask for escalation with a one-line justification instead of working around it.",
    "## Plans\nFor work that takes more than a few steps, keep a short plan with `update_plan`: "
    "at most one step in progress, mark steps done as soon as they are, and don't pad the plan "
    "with obvious steps like \u201cread the code\u201d.",
    "## Validation\nIf the project has tests, run the narrowest set that covers your change "
    "first, then the wider suite when it is cheap. Don't fix unrelated failing tests; mention "
    "them. Formatters and linters are worth running when the project configures them.",
    "## Final message\nLead with the outcome. Reference files as `path/to/file.py:42`. Use "
    "short bullet lists for several changes, plain prose for one. No headings for a two-line "
    "answer, no filler, no \u201cLet me know if\u2026\u201d closings.",
    "## Tone\nBe direct and friendly. State assumptions when you make them and say what would "
    "change your mind. When the user is wrong about something in the code, show the line.",
]

WORDS = (
    "ledger entry account balance posting journal currency amount rounding cursor batch "
    "invoice refund settle reconcile ledger_id tenant offset snapshot migration schema index "
    "retry backoff timeout queue worker handler request response status payload config "
    "fixture parser token window cache hit miss stale flush commit rollback"
).split()
_MODULES = ["ledger/posting.py", "ledger/balance.py", "api/routes.py", "api/schemas.py",
            "workers/settle.py", "db/migrations/0042_cursor.sql", "tests/test_posting.py",
            "tests/test_settle.py", "cli/main.py", "ledger/currency.py"]
PROMPTS = [
    "The settle worker double-posts refunds when a retry lands after a timeout. Find out why.",
    "Run the ledger tests and fix whatever fails, but don't touch the migrations.",
    "Add a `--since` option to `ledger export` that takes an ISO date.",
    "Why does `Balance.at()` return a stale value right after a posting?",
    "Rename `ledger_id` to `book_id` in the API schemas only; keep the DB column.",
    "Make rounding use banker's rounding for JPY and KWD, with tests.",
    "The CI job times out on test_settle.py. Can you make it faster without skipping tests?",
    "Explain how cursor pagination works in api/routes.py, briefly.",
    "Write a migration that adds an index on (tenant_id, posted_at).",
    "Check whether the export handles the \u20ac sign and non-ASCII payee names correctly.",
]


def _ident(rng: random.Random) -> str:
    return "_".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))


def sentence(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return text[0].upper() + text[1:] + "."


def _code(rng: random.Random, lines: int) -> str:
    out = []
    for n in range(lines):
        kind = rng.random()
        if kind < 0.15:
            out.append(f"def {_ident(rng)}(self, {_ident(rng)}: int, *, {_ident(rng)}=None):")
        elif kind < 0.3:
            out.append(f'    """{sentence(rng, rng.randint(4, 10))}"""')
        elif kind < 0.45:
            out.append(f"    if {_ident(rng)} is None or {_ident(rng)} < {n}:")
        elif kind < 0.6:
            out.append(f'        raise ValueError(f"bad {_ident(rng)}: {{{_ident(rng)}!r}}")')
        else:
            out.append(f"        {_ident(rng)} = self.{_ident(rng)}({_ident(rng)}, {n})")
    return "\n".join(out)


def _test_output(rng: random.Random, lines: int) -> str:
    out = ["============================= test session starts =============================="]
    for _ in range(lines):
        status = "PASSED" if rng.random() < 0.85 else "FAILED"
        out.append(f"tests/{rng.choice(_MODULES[6:8])}::test_{_ident(rng)} {status}")
    out.append(f"=== {lines - 2} passed, 2 failed in {rng.uniform(0.5, 9):.2f}s ===")
    return "\n".join(out)


def _grep_output(rng: random.Random, lines: int) -> str:
    return "\n".join(
        f"{rng.choice(_MODULES)}:{rng.randint(1, 400)}:    {_ident(rng)} = {_ident(rng)}()"
        for _ in range(lines)
    )


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _uuid7(rng: random.Random) -> str:
    h = _hex(rng, 32)
    return f"019a7c3e-{h[:4]}-7{h[4:7]}-{h[7:11]}-{h[11:23]}"


def _message(rng: random.Random, role: str, text: str) -> Item:
    if role == "assistant":
        return {"type": "message", "status": "completed", "id": f"msg_{_hex(rng, 16)}",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return {"type": "message", "id": f"msg_{_uuid7(rng)}", "role": role,
            "content": [{"type": "input_text", "text": text}]}


def _reasoning(rng: random.Random) -> Item:
    # Real encrypted_content is opaque base64 of a few KB; its size is what matters here.
    blob = base64.b64encode(rng.randbytes(rng.randint(300, 900))).decode()
    rid = _hex(rng, 16)
    return {"type": "reasoning", "id": f"rs_{rid}",
            "summary": [{"type": "summary_text",
                         "text": f"**Checking {_ident(rng)}**\n\n{sentence(rng, 14)}"}],
            "content": None, "encrypted_content": "gAAAAAB" + blob}


def _exec_call(rng: random.Random) -> tuple[Item, Item]:
    call_id = f"call_{_hex(rng, 24)}"
    kind = rng.random()
    if kind < 0.35:
        cmd, output = f"pytest -q {rng.choice(_MODULES[6:8])}", _test_output(rng, 12)
    elif kind < 0.7:
        cmd = f"rg -n '{_ident(rng)}' ledger api workers"
        output = _grep_output(rng, 10)
    else:
        path = rng.choice(_MODULES)
        cmd, output = f"sed -n '1,60p' {path}", _code(rng, 24)
    arguments = orjson.dumps({"cmd": cmd, "workdir": CWD, "yield_time_ms": 10000}).decode()
    call = {"type": "function_call", "status": "completed", "id": f"fc_{_hex(rng, 16)}",
            "name": "exec_command", "arguments": arguments, "call_id": call_id}
    result = {"type": "function_call_output", "id": f"fco_{_uuid7(rng)}", "call_id": call_id,
              "output": f"Chunk ID: {_hex(rng, 6)}\nWall time: {rng.uniform(0.05, 4):.4f} "
              f"seconds\nProcess exited with code 0\nOriginal token count: "
              f"{len(output) // 4}\nOutput:\n{output}\n"}
    return call, result


def _patch_call(rng: random.Random) -> tuple[Item, Item]:
    call_id = f"call_{_hex(rng, 24)}"
    path = rng.choice(_MODULES)
    old = _code(rng, 4).replace("\n", "\n-")
    new = _code(rng, 6).replace("\n", "\n+")
    patch = (f"*** Begin Patch\n*** Update File: {path}\n@@ def {_ident(rng)}\n-{old}\n+{new}\n"
             "*** End Patch\n")
    call = {"type": "custom_tool_call", "status": "completed", "id": f"ctc_{_hex(rng, 16)}",
            "call_id": call_id, "name": "apply_patch", "input": patch}
    result = {"type": "custom_tool_call_output", "call_id": call_id,
              "output": f"Success. Updated the following files:\nM {path}\n"}
    return call, result


def turn(rng: random.Random, n: int) -> list[Item]:
    prompt = f"{rng.choice(PROMPTS)} (step {n})"
    items = [_message(rng, "user", prompt)]
    if rng.random() < 0.3:  # a plain question: think, answer
        items += [_reasoning(rng), _message(rng, "assistant", " ".join(
            sentence(rng, rng.randint(8, 16)) for _ in range(8)))]
        return items
    for _ in range(rng.randint(1, 2)):  # tool rounds: think, preamble, calls, outputs
        items.append(_reasoning(rng))
        items.append(_message(rng, "assistant", sentence(rng, 10)))
        calls = [_exec_call(rng) if rng.random() < 0.7 else _patch_call(rng)
                 for _ in range(rng.randint(1, 2))]
        items += [call for call, _ in calls] + [result for _, result in calls]
    items.append(_message(rng, "assistant", " ".join(
        sentence(rng, rng.randint(8, 16)) for _ in range(5))))
    return items


def context_items(rng: random.Random) -> list[Item]:
    """The items before the first turn: system prompt, developer notes, AGENTS.md, env."""
    system = "\n\n".join(
        f"{section}\n(Section {i + 1}.{j + 1})"
        for i in range(6) for j, section in enumerate(_SYSTEM_SECTIONS)
    )
    skills = "<skills_instructions>\n## Skills\n" + "\n".join(
        f"- {_ident(rng)}: {sentence(rng, 24)} (file: r0/{_ident(rng)}/SKILL.md)"
        for _ in range(14)
    ) + "\n</skills_instructions>"
    agents = (f"# AGENTS.md instructions for {CWD}\n\n<INSTRUCTIONS>\n# Ledger service\n\n"
              "- Money is integer minor units; never floats.\n- Run `make test` before you "
              "finish.\n- Migrations are append-only.\n</INSTRUCTIONS>")
    env = (f"<environment_context>\n  <cwd>{CWD}</cwd>\n  <shell>bash</shell>\n"
           "  <current_date>2026-11-29</current_date>\n  <timezone>Etc/UTC</timezone>\n"
           "</environment_context>")
    return [
        _message(rng, "developer", system),
        _message(rng, "developer", "<permissions instructions>\nFilesystem sandboxing: "
                 "workspace-write. Network: restricted. Approvals: on-request.\n"
                 "</permissions instructions>"),
        _message(rng, "developer", skills),
        {"type": "message", "id": f"msg_{_uuid7(rng)}", "role": "user",
         "content": [{"type": "input_text", "text": agents},
                     {"type": "input_text", "text": env}]},
    ]


def tools() -> list[dict[str, Any]]:
    """A Codex-like tools array (function tools with JSON schemas, one freeform tool)."""
    def function(name: str, description: str, props: dict[str, str]) -> dict[str, Any]:
        return {"type": "function", "name": name, "description": description, "strict": False,
                "parameters": {"type": "object", "additionalProperties": False,
                               "required": [next(iter(props))],
                               "properties": {k: {"type": "string", "description": v}
                                              for k, v in props.items()}}}

    return [
        function("exec_command", "Runs a command in a PTY and returns its output, or a "
                 "session id to poll when it is still running.",
                 {"cmd": "Shell command to run.", "workdir": "Directory to run it in; "
                  "defaults to the turn's cwd.", "yield_time_ms": "How long to wait for "
                  "output before returning (250-30000).", "justification": "Why the command "
                  "needs to leave the sandbox; only with escalation.", "shell": "Shell "
                  "binary; defaults to the user's shell.", "tty": "Allocate a PTY."}),
        function("write_stdin", "Writes to a running exec session and returns new output.",
                 {"session_id": "The session to write to.", "chars": "Bytes to write; empty "
                  "polls for output.", "yield_time_ms": "How long to wait for output."}),
        function("update_plan", "Updates the task plan shown to the user.",
                 {"explanation": "Why the plan changed.", "plan": "The steps, each with a "
                  "status of pending, in_progress or completed; at most one in progress."}),
        function("view_image", "Shows a local image file to the model.",
                 {"path": "Local path of the image."}),
        function("request_user_input", "Asks the user up to three short questions and waits "
                 "for the answers. Only in plan mode.",
                 {"questions": "The questions, each with an id, a header and options."}),
        {"type": "custom", "name": "apply_patch", "description": "Edits files. This is a "
         "FREEFORM tool: send the patch itself, not JSON.",
         "format": {"type": "grammar", "syntax": "lark", "definition":
                    "start: begin_patch hunk+ end_patch\nbegin_patch: \"*** Begin Patch\" "
                    "LF\nend_patch: \"*** End Patch\" LF?\nhunk: add_hunk | delete_hunk | "
                    "update_hunk\nadd_hunk: \"*** Add File: \" filename LF add_line+\n"
                    "delete_hunk: \"*** Delete File: \" filename LF\nupdate_hunk: \"*** "
                    "Update File: \" filename LF change?\nfilename: /(.+)/\nadd_line: \"+\" "
                    "/(.*)/ LF -> line\nchange: (change_context | change_line)+\n"
                    "change_context: (\"@@\" | \"@@ \" /(.+)/) LF\nchange_line: (\"+\" | "
                    "\"-\" | \" \") /(.*)/ LF\n%import common.LF\n"}},
        {"type": "web_search", "external_web_access": False},
    ]


def history(turns: int = 30, seed: int = 7) -> list[Item]:
    """Context, ``turns - 1`` finished turns, and the live prompt of the last turn."""
    rng = random.Random(seed)
    items = context_items(rng)
    for n in range(1, turns):
        items += turn(rng, n)
    items.append(_message(rng, "user", f"{rng.choice(PROMPTS)} (step {turns})"))
    return items


def request(turns: int = 30, seed: int = 7) -> dict[str, Any]:
    """A streaming Responses request body as Codex sends it."""
    turn_meta = orjson.dumps({"session_id": SESSION_ID, "turn_id": _turn_id(turns),
                              "request_kind": "turn", "window_id": f"{SESSION_ID}:0"}).decode()
    return {
        "model": "gpt-5.5", "stream": True, "input": history(turns, seed), "tools": tools(),
        "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
        "store": False, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": SESSION_ID,
        "client_metadata": {"x-codex-turn-metadata": turn_meta, "session_id": SESSION_ID},
    }


def encode(body: dict[str, Any]) -> bytes:
    """Compact JSON, as Codex (serde_json) writes it."""
    return orjson.dumps(body)


def headers(turns: int = 30) -> dict[str, str]:
    """The headers Codex sends with the request (the key is a placeholder)."""
    meta = orjson.dumps({"session_id": SESSION_ID, "turn_id": _turn_id(turns),
                         "request_kind": "turn", "window_id": f"{SESSION_ID}:0"}).decode()
    return {
        "x-codex-beta-features": "remote_compaction_v2",
        "x-codex-window-id": f"{SESSION_ID}:0",
        "x-codex-turn-metadata": meta,
        "x-client-request-id": SESSION_ID,
        "session-id": SESSION_ID,
        "thread-id": SESSION_ID,
        "Accept": "text/event-stream",
        "Content-Type": "application/json",
        "Authorization": "Bearer sk-bench-placeholder",
        "originator": "codex_exec",
        "User-Agent": "codex_exec/0.169.0 (Debian 12.0.0; x86_64) xterm",
    }


def _turn_id(turns: int) -> str:
    return f"019a7c3f-{turns:04d}-7000-8000-000000000000"
