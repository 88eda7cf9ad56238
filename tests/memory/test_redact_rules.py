"""The maintained rule set (detect-secrets' plugins through RE2): which rules are in use, and
that what they find is what gets replaced."""

from __future__ import annotations

import random
import string

from ctxproxy.injectors.bounds import RECORD_CHARS
from ctxproxy.injectors.redact import MARK, redact
from ctxproxy.injectors.secret_rules import rules, spans


def test_detect_secrets_plugins_compile_under_re2_all_but_one() -> None:
    r = rules()
    assert len(r.compiled) >= 40
    # The one whose lookarounds sit mid-pattern; public IPs are left out on purpose.
    assert set(r.skipped) <= {"IbmCosHmacDetector"}
    assert "IPPublicDetector" not in r.names
    assert {"SendGridDetector", "TwilioKeyDetector", "SlackDetector", "PypiTokenDetector",
            "ArtifactoryDetector", "DiscordBotTokenDetector"} <= set(r.names)


def test_only_the_secret_of_a_named_value_is_replaced() -> None:
    text = 'ibm_cloud_iam_key = "' + "k" * 22 + "Q" * 22 + '" then more'
    assert redact(text) == f'ibm_cloud_iam_key = "{MARK}" then more'


def test_a_prefix_group_does_not_shrink_the_secret() -> None:
    token = "glcbt-ab_" + "x" * 24
    ((start, end),) = spans(f"token {token} end")
    assert f"token {token} end"[start:end] == token


def test_plain_text_ips_and_digests_are_kept() -> None:
    text = ("deploy 3f786850e387550fdab836ed7e6dc881de23001b to 203.0.113.7 with make; "
            "the build took 42 s")
    assert spans(text) == [] and redact(text) == text


def test_redacting_twice_changes_nothing_more() -> None:
    text = "key SG." + "a" * 22 + "." + "b" * 43 + " and twilio SK" + "0" * 32
    once = redact(text)
    assert once.count(MARK) == 2 and redact(once) == once


def test_the_rule_set_finds_a_secret_at_the_end_of_a_whole_record() -> None:
    # One pass of the rules' RE2 set decides which rules run: a record of varied text (the
    # set's DFA meets many states) must not exhaust it and report nothing.
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits + string.punctuation + " \n"
    noise = "".join(rng.choice(alphabet) for _ in range(RECORD_CHARS - 100))
    secret = "SG." + "a" * 22 + "." + "b" * 43
    assert spans(f"{noise} {secret}") != []
    assert secret not in redact(f"{noise} {secret}")
