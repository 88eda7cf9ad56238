"""Secrets never land: each format, in user text, tool call arguments and tool outputs, is
kept out of both stores and of `ctxproxy memory export`."""

from __future__ import annotations

import asyncio
import json
import random
import string
from pathlib import Path

import pytest

from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.knowledge.wikis import ctxproxy
from tests.memory.conftest import Backend
from tests.memory.session import Session, runtime, settle

RNG = random.Random()


def run(alphabet: str, n: int) -> str:
    return "".join(RNG.choice(alphabet) for _ in range(n))


ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"


def aws_secret() -> str:  # mixed case with digits and slashes, 40 characters, as AWS makes them
    return (run(string.ascii_uppercase, 10) + run(string.ascii_lowercase, 10)
            + run(string.digits + "/+", 4) + run(ALNUM, 16))


# (format, a fresh secret -> the line that carries it). Each line holds the secret verbatim.
FORMATS = {
    "bare AWS secret key": (aws_secret, "aws configure set aws_secret_access_key_x {}".format),
    "mysql -pPW": (lambda: run(ALNUM, 14), "mysql -u root -p{} shop".format),
    "curl -u user:PW": (lambda: run(ALNUM, 14), "curl -u deploy:{} https://ci.internal/api".format),
    "--password PW": (lambda: run(ALNUM, 14), "psql-tool --password {} --host db".format),
    "Authorization: Token": (lambda: run(ALNUM, 32), "Authorization: Token {}".format),
    "Stripe sk_live_": (lambda: "sk_live_" + run(ALNUM, 24), "stripe key {}".format),
    "Hugging Face hf_": (lambda: "hf_" + run(ALNUM, 30), "HF token {}".format),
    "npm npm_": (lambda: "npm_" + run(ALNUM, 36), "publish with {}".format),
    "DB_PASS=": (lambda: run(ALNUM, 14), "export DB_PASS={}".format),
    "Azure AccountKey=": (lambda: run(ALNUM, 86) + "==",
                          "DefaultEndpointsProtocol=https;AccountName=shop;AccountKey={};".format),
    "the pw is X": (lambda: run(ALNUM, 12), "btw the pw is {} for staging".format),
    "SendGrid": (lambda: f"SG.{run(ALNUM, 22)}.{run(ALNUM, 43)}", "mail key {}".format),
    "Twilio": (lambda: "SK" + run(HEX, 32), "twilio {}".format),
    "Slack webhook": (lambda: run(ALNUM, 24),
                      "https://hooks.slack.com/services/T0123ABCD/B0123ABCD/{}".format),
    "GitLab CI job token": (lambda: "glcbt-" + run(ALNUM, 24), "CI_JOB_TOKEN is {}".format),
    "PyPI token": (lambda: "pypi-AgEIcHlwaS5vcmc" + run(ALNUM, 150), "twine upload -p {}".format),
}


@pytest.mark.parametrize("placement", ["split"])
async def test_each_format_is_kept_out_of_the_store_and_the_export(
    placement: str, backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proxy = await start_proxy(**backend.settings, keep_turns=1, trim_slack=0,
                              memory_placement=placement)
    s = Session(proxy, upstream, session_id="secrets", headers={"x-team-id": "team-a"})
    planted: dict[str, list[str]] = {}
    for name, (make, line) in FORMATS.items():
        said, argued, printed = make(), make(), make()
        planted[name] = [said, argued, printed]
        s.turns += 1
        call = {"type": "function_call", "name": "exec_command", "call_id": f"c{s.turns}",
                "arguments": json.dumps({"cmd": line(argued)})}
        output = {"type": "function_call_output", "call_id": f"c{s.turns}",
                  "output": f"ran it\n{line(printed)}\nok"}
        s.items = [*s.items, codex.text("user", f"Set it up: {line(said)}"), call, output,
                   codex.text("assistant", "Done.")]
    await s.say("turn last: what is left to do?")
    await s.say("thanks")
    await settle(proxy)

    stored = await runtime(proxy).store.list(None, limit=100_000, now=0)
    assert len([m for m in stored if m.type == "episodic"]) >= len(FORMATS)
    dump = "\n".join(m.text + json.dumps(m.attrs) for m in stored)
    settings = dict(backend.settings)
    data_dir = Path(settings.pop("data_dir"))
    code, exported, err = await asyncio.to_thread(
        ctxproxy, capsys, data_dir, "memory", "export", **settings)
    assert code == 0, err
    assert "[REDACTED]" in exported
    leaks = {name: where for name, values in planted.items()
             if (where := [channel for channel, v in zip(("user", "arguments", "output"),
                                                          values, strict=True)
                           if v in dump or v in exported])}
    assert leaks == {}, f"stored verbatim (format: channels): {leaks}"
