"""Secrets in the turns a cut leaves out reach nothing: every secret shape the redaction rules
know (``injectors/redact.py``, ``injectors/secret_rules.py``), said in a prompt, run in a
command, printed by a tool and repeated in an answer, is absent from what the upstream gets
once the window cut those turns (the ``<earlier_turns>`` digest, memory, embeddings), from
the store and the ledger, from the capture files and from the logs."""

from __future__ import annotations

import json
import logging
import random
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ctxproxy.config.logs import JsonFormatter
from ctxproxy.injectors import redact
from ctxproxy.injectors.secret_rules import rules
from ctxproxy.proxy.ledger_wiring import LEDGER
from ctxproxy.request import History
from ctxproxy.window.digest import digest_message
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend, backend, pg_url
from tests.memory.session import Session, codex_text, runtime, settle

__all__ = ["backend", "pg_url"]

Item = dict[str, Any]
RNG = random.Random(43)
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
LOWER = string.ascii_lowercase
FILLER = "ok\n" * 800  # the cut turns weigh more than their digest, which is then kept
BATCH = 10  # turns cut by each request: within the digest's newest turns


def run(alphabet: str, n: int) -> str:
    return "".join(RNG.choice(alphabet) for _ in range(n))


@dataclass(frozen=True)
class Shape:
    """A secret and the line that carries it verbatim."""

    name: str
    secret: str
    line: str


def shape(name: str, secret: str, template: str) -> Shape:
    return Shape(name, secret, template.replace("{}", secret))


def pem(header: str) -> Shape:
    body = run(ALNUM + "+/", 64)
    return Shape(header, body, f"-----{header}-----\n{body}\n-----END{header[5:]}-----")


# Keys known by their prefix: (what, prefix, characters after it, the line around it).
PREFIXED = (
    ("OpenAI sk-", "sk-proj-", 40, "key {}"),
    ("Stripe sk_live_", "sk_live_", 24, "stripe {}"),
    ("Stripe rk_test_", "rk_test_", 24, "stripe {}"),
    ("GitHub ghp_", "ghp_", 36, "push with {}"),
    ("GitHub PAT", "github_pat_", 40, "push with {}"),
    ("GitLab glpat-", "glpat-", 20, "gitlab {}"),
    ("Hugging Face", "hf_", 30, "HF token {}"),
    ("npm", "npm_", 36, "publish with {}"),
    ("Google", "AIza", 35, "maps {}"),
    ("Artifactory AKC", "AKC", 20, "artifactory {} ok"),
    ("Artifactory AP", "AP6", 20, "artifactory {} ok"),
    ("GitLab GR1348941", "GR1348941", 20, "runner {}"),
    ("GitLab glcbt-", "glcbt-", 24, "CI_JOB_TOKEN is {}"),
    ("GitLab glimt-", "glimt-", 25, "gitlab {}"),
    ("GitLab glptt-", "glptt-", 40, "gitlab {}"),
    ("GitLab glagent-", "glagent-", 50, "gitlab {}"),
    ("GitLab gloas-", "gloas-", 64, "gitlab {}"),
    ("PyPI", "pypi-AgEIcHlwaS5vcmc", 80, "twine upload -p {}"),
    ("TestPyPI", "pypi-AgENdGVzdC5weXBpLm9yZw", 80, "twine -p {}"),
    ("Square", "sq0csp-", 43, "square {}"),
)


def own_shapes() -> Iterator[Shape]:
    """The shapes of ``injectors/redact.py``, and those issue 43 found in the digest."""
    yield pem("BEGIN RSA PRIVATE KEY")
    yield shape("URL password", run(ALNUM, 14), "postgres://admin:{}@db.internal:5432/app")
    yield shape("Bearer", run(ALNUM, 32), "token_type Bearer {}")
    yield shape("Authorization", run(ALNUM, 32), "Authorization: Token {}")
    yield shape("JSON client_secret", run(ALNUM, 20), '{"client_secret": "{}"}')
    yield shape("YAML api_key", run(ALNUM, 20), "api_key: {}")
    yield shape("single quotes", run(ALNUM, 16), "secret = '{}'")
    yield shape("DB_PASSWORD", "Zq_" + run(ALNUM, 14), "DB_PASSWORD={}")
    yield shape("said", "Hx." + run(ALNUM, 12), "the password is {} for staging")
    for ending in redact._SECRET_ENDINGS:
        yield shape(f"assignment db{ending}", run(ALNUM, 8) + "_" + run(ALNUM, 8),
                    f"db{ending}={{}}")
    for word in ("pass", "pw"):
        yield shape(f"assignment {word}", run(ALNUM, 16), f"{word}: {{}}")
    for flag in ("--token", "--password", "-secret", "--client-secret", "--api-key"):
        yield shape(f"flag {flag}", run(ALNUM, 16), f"deploy {flag} {{}} --host db")
    yield shape("curl -u", run(ALNUM, 14), "curl -u deploy:{} https://ci.internal/api")
    yield shape("capability", f"cap1.{run(ALNUM, 40)}.{run(ALNUM, 22)}",
                "curl -H 'x-ctxproxy-capability: {}' http://127.0.0.1:8787/v3/tools/call")
    yield shape("mysql -p", run(ALNUM, 14), "mysql -u root -p{} shop")
    yield shape("Slack xoxb-", "xoxb-" + run(string.digits, 12) + "-" + run(LOWER, 24),
                "slack {}")
    yield shape("AWS key id", "AKIA" + run(string.ascii_uppercase + string.digits, 16), "id {}")
    yield shape("JWT", f"eyJ{run(ALNUM, 20)}.eyJ{run(ALNUM, 30)}.{run(ALNUM, 30)}", "jwt {}")
    yield shape("bare AWS secret", run(string.ascii_uppercase, 10) + run(LOWER, 10)
                + run(string.digits + "/+", 4) + run(ALNUM, 16), "aws secret {}")


def maintained_shapes() -> Iterator[Shape]:
    """The keys known by their prefix (of either rule set), and a line for each other rule
    of detect-secrets' in use (``injectors.secret_rules``)."""
    for name, prefix, n, template in PREFIXED:
        yield shape(name, prefix + run(ALNUM, n), template)
    for header in ("BEGIN DSA PRIVATE KEY", "BEGIN EC PRIVATE KEY", "BEGIN OPENSSH PRIVATE KEY",
                   "BEGIN PGP PRIVATE KEY BLOCK", "BEGIN PRIVATE KEY"):
        yield pem(header)
    yield shape("SSH2 (RFC 4716)", run(ALNUM + "+/", 64),
                '---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: "deploy"\n{}\n'
                "---- END SSH2 ENCRYPTED PRIVATE KEY ----")
    yield shape("PuTTY", run(ALNUM + "+/", 64),
                "PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\nComment: deploy\n"
                f"Public-Lines: 1\n{run(ALNUM, 40)}\nPrivate-Lines: 1\n{{}}\n"
                f"Private-MAC: {run(HEX, 40)}")
    yield shape("AWS A3T", "A3TX" + run(string.ascii_uppercase, 16), "id {}")
    yield shape("AWS quoted", run(ALNUM + "/+", 40), "aws_secret_key = '{}'")
    yield shape("Azure AccountKey", run(ALNUM, 86) + "==",
                "DefaultEndpointsProtocol=https;AccountName=shop;AccountKey={};")
    yield shape("Cloudant hex", run(HEX, 64), 'cloudant_password = "{}"')
    yield shape("Cloudant lower", run(LOWER, 24), 'cloudant_password = "{}"')
    yield shape("Cloudant URL hex", run(HEX, 64), "https://shop:{}@shop.cloudant.com")
    yield shape("Cloudant URL lower", run(LOWER, 24), "https://shop:{}@shop.cloudant.com")
    yield shape("Discord", f"M{run(ALNUM, 23)}.{run(ALNUM, 6)}.{run(ALNUM, 27)}", "bot {}")
    yield shape("IBM Cloud IAM", run(ALNUM, 44), 'ibm_cloud_iam_api_key = "{}"')
    yield shape("Mailchimp", run(HEX, 32) + "-us12", "mailchimp {}")
    yield shape("npmrc", run(HEX, 8) + "-" + run(HEX, 4) + "-" + run(HEX, 4) + "-"
                + run(HEX, 4) + "-" + run(HEX, 12), "//registry.npmjs.org/:_authToken={}")
    yield shape("OpenAI legacy", f"sk-{run(ALNUM, 20)}T3BlbkFJ{run(ALNUM, 20)}", "key {}")
    yield shape("SendGrid", f"SG.{run(ALNUM, 22)}.{run(ALNUM, 43)}", "mail key {}")
    yield shape("Slack webhook", run(ALNUM, 24),
                "https://hooks.slack.com/services/T0123ABCD/B0123ABCD/{}")
    yield shape("Softlayer", run(LOWER + string.digits, 64), 'softlayer_api_key = "{}"')
    yield shape("Softlayer URL", run(LOWER + string.digits, 64),
                "https://api.softlayer.com/soap/v3/{}")
    yield shape("Telegram", f"{run(string.digits, 9)}:{run(ALNUM, 35)}", "bot {}")
    yield shape("Twilio AC", "AC" + run(HEX, 32), "twilio {}")
    yield shape("Twilio SK", "SK" + run(HEX, 32), "twilio {}")


SHAPES = [*own_shapes(), *maintained_shapes()]


def key_alternatives() -> list[re.Pattern[str]]:
    """``redact._KEYS``, one pattern per alternative (a line of its verbose pattern)."""
    lines = (line.split("#")[0].strip().removeprefix("|") for line in
             redact._KEYS.pattern.splitlines())
    return [re.compile(line, re.VERBOSE | re.ASCII) for line in lines if line.strip()]


def rules_without_a_shape() -> list[str]:
    """Every rule redaction runs that no shape's line matches."""
    lines = [s.line for s in SHAPES]
    missing = [p.pattern for p, _ in redact._RULES if not any(p.search(x) for x in lines)]
    missing += [p.pattern for p in key_alternatives() if not any(p.search(x) for x in lines)]
    every = rules()
    missing += [f"{name}: {rule.pattern}" for name, rule in zip(every.names, every.compiled,
                                                               strict=True)
                if not any(rule.search(x) for x in lines)]
    return missing


def cut_turn(k: int, s: Shape) -> list[Item]:
    """A finished turn that holds ``s`` in its prompt, reasoning, command, output and answer."""
    call = f"call_shape_{k}"
    return [
        codex.text("user", f"shape {k}: set it up with {s.line}"),
        {"type": "reasoning", "id": f"rs_shape_{k}", "encrypted_content": "gAAAA_test",
         "summary": [{"type": "summary_text", "text": f"Configure it with {s.line}"}]},
        {"type": "function_call", "name": "exec_command", "call_id": call,
         "arguments": json.dumps({"cmd": f"touch conf/shape_{k}.yaml && {s.line}"})},
        {"type": "function_call_output", "call_id": call,
         "output": f"{s.line}\nwrote conf/shape_{k}.yaml\n{FILLER}"},
        codex.text("assistant", f"Done shape {k}: {s.line}"),
    ]


def leaked(text: str) -> list[str]:
    return [s.name for s in SHAPES if s.secret in text]


def digests(body: dict[str, Any]) -> list[str]:
    return [text for item in body["input"] if item.get("role") == "developer"
            and (text := codex_text(item)).startswith("<earlier_turns")]


def pg_rows(url: str) -> str:
    """Every row of every table in the schema ``url`` is confined to, as text."""
    with psycopg.connect(url) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema()")]
        return "\n".join(str(row[0]) for table in tables
                         for row in conn.execute(f'SELECT t::text FROM "{table}" t'))


def files(folder: Path) -> str:
    return "\n".join(p.read_bytes().decode("latin-1") for p in sorted(folder.rglob("*"))
                     if p.is_file())


async def test_no_secret_of_a_cut_turn_reaches_the_upstream_store_ledger_captures_or_logs(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    assert rules_without_a_shape() == []  # a rule added without a shape here fails first
    caplog.set_level(logging.DEBUG)  # every logger, every level
    captures = tmp_path_factory.mktemp("captures")  # outside the data folder
    proxy = await start_proxy(**backend.settings, window_policy="fixed", keep_turns=1,
                              trim_slack=0, cut_digest_chars=200_000, capture_dir=captures)
    s = Session(proxy, upstream, session_id="secrets", headers={"x-team-id": "team-a"})
    shown: list[str] = []
    for at in range(0, len(SHAPES), BATCH):
        # A resumed session: the turns come whole, and each request cuts the turns before its
        # prompt (one kept), so no secret is in a turn the client still sends.
        for k in range(at, min(at + BATCH, len(SHAPES))):
            s.turns += 1
            s.items = [*s.items, *cut_turn(k, SHAPES[k])]
        shown += digests(await s.say(f"go on after shape {k}"))
    await settle(proxy)
    ledger = proxy.app[LEDGER]
    assert ledger.recorder is not None
    await ledger.recorder.join()

    # Each shape's turn was told in a digest, by a name its command used (the digest is a
    # map of names, taken from the texts after redaction).
    told = "\n".join(shown)
    assert [k for k in range(len(SHAPES)) if f"conf/shape_{k}.yaml" not in told] == []
    bodies = [r.body.decode(errors="replace") for r in upstream.received]
    assert len(bodies) == len(range(0, len(SHAPES), BATCH))
    assert any("<episodic_memory" in body for body in bodies)  # the cut turns, recalled
    bodies += [r.body.decode(errors="replace") for r in upstream.embedding_requests]
    assert {name for body in bodies for name in leaked(body)} == set()

    stored = await runtime(proxy).store.list(None, limit=100_000, now=0)
    assert len([m for m in stored if m.type == "episodic"]) >= len(SHAPES)
    # Stored and counted: the store's and the ledger's every row (PostgreSQL) and every byte
    # of the data folder (SQLite: both in files there).
    held = files(backend.settings["data_dir"])
    if "store_url" in backend.settings:
        held += pg_rows(backend.settings["store_url"])
    assert "[REDACTED" in held
    assert leaked(held) == []

    capture = files(captures)
    assert capture.count('"input"') == len(upstream.received)
    assert leaked(capture) == []
    formatter = JsonFormatter()
    assert leaked("\n".join(formatter.format(record) for record in caplog.records)) == []


def test_a_key_split_where_the_digest_stops_reading_is_shown_in_no_part() -> None:
    # Where the digest stops reading a command or a reasoning summary (for names), a key the
    # limit runs through shows in no part: half a key is still a secret, and no rule knows
    # it for one.
    key = "ghp_" + run(ALNUM, 36)
    for where in ("command", "summary"):
        text = "deploy_site" + " " * 3979 + key
        command, summary = (text, "ok") if where == "command" else ("ls", text)
        turn = [codex.text("user", "deploy it"),
                {"type": "reasoning", "id": "rs_1", "encrypted_content": "e",
                 "summary": [{"type": "summary_text", "text": summary}]},
                {"type": "function_call", "name": "exec_command", "call_id": "c1",
                 "arguments": json.dumps({"cmd": command})},
                {"type": "function_call_output", "call_id": "c1", "output": "done"}]
        items = [*codex.context_items(), *turn, *codex.text_turn("next"),
                 codex.text("user", "go on")]
        made = digest_message(History(items), 2, 8000)
        assert made is not None
        shown = made["content"][0]["text"]
        assert "deploy_site" in shown
        pieces = [key[i : i + 6] for i in range(4, len(key) - 5)]
        assert [piece for piece in pieces if piece in shown] == [], where
