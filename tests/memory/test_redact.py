"""Secrets never reach the memory store."""

from __future__ import annotations

import re
from unittest import mock

import hypothesis
import pytest
from hypothesis import strategies as st

from ctxproxy.injectors import redact as redact_module
from ctxproxy.injectors.redact import MARK, redact, redact_all


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("key sk-proj-Abcdefghijklmnop1234567890 here", "sk-proj-Abcdefghijklmnop1234567890"),
        ("sk-ant-api03-abcdefghijklmnopqrstuv", "sk-ant-api03-abcdefghijklmnopqrstuv"),
        ("curl -H 'Authorization: Bearer eyJhbGciOi.abc-def_ghi'", "eyJhbGciOi.abc-def_ghi"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
        ("DATABASE_URL=postgres://admin:hunter2@db:5432/app", "hunter2"),
        ("https://bob:p%40ss@example.com/x", "p%40ss"),
        ("password=hunter2 next", "hunter2"),
        ("DB_PASSWORD: 'correct horse'", "correct horse"),
        ('{"api_key": "abc123xyz"}', "abc123xyz"),
        ("GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123", "ghp_abcdefghijklmnopqrstuvwxyz0123"),
        ("see ghp_abcdefghijklmnopqrstuvwxyz0123 here", "ghp_abcdefghijklmnopqrstuvwxyz0123"),
        ("token = 'tok_live_42'", "tok_live_42"),
        ("the admin password is Tr0ub4dor&3 ok", "Tr0ub4dor&3"),
        ("aws AKIAIOSFODNN7EXAMPLE key", "AKIAIOSFODNN7EXAMPLE"),
        ("slack xoxb-123456789012-abcdefghij", "xoxb-123456789012-abcdefghij"),
        ("client_secret: s3cr3tValue", "s3cr3tValue"),
        # The formats issue 12 found stored verbatim.
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("mysql -u root -pS3cretPW mydb", "S3cretPW"),
        ("curl -u admin:Pa55word https://api.example.com", "Pa55word"),
        ("curl --user 'bob:hunter2' https://x", "hunter2"),
        ("tool --password hunter2 --verbose", "hunter2"),
        ("Authorization: Token 9944b09199c62bcf9418ad846dd0", "9944b09199c62bcf9418ad846dd0"),
        ("key sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
        ("hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"),
        ("npm_abcdefghijklmnopqrstuvwxyz0123456789", "npm_abcdefghijklmnopqrstuvwxyz0123456789"),
        ("DB_PASS=hunter2", "hunter2"),
        ("AccountName=acct;AccountKey=abc+def/ghi==;EndpointSuffix=x", "abc+def/ghi=="),
        ("the pw is Tr0ub4dor", "Tr0ub4dor"),
        # In a JSON string, as memory stores a tool call's arguments (issue 43).
        ('{"cmd": "export DB_PASSWORD=\\"hunter2\\" && psql"}', "hunter2"),
        ('{"cmd": "echo {\\"client_secret\\": \\"s3cr3t\\\\Value\\"}"}', "s3cr3t"),
        # A capability token (knowledge.capability) in a <knowledge_tools> curl line.
        ("-H 'x-ctxproxy-capability: cap1.WyJzdmMiLCJ0ZWFtLTEiLCJjb2RlciIsIiIsImNtLTEiLDFd"
         ".sRObe0J9i8KHw65YdMvnWQ' -d", "WyJzdmMiLCJ0ZWFtLTEiLCJjb2RlciIsIiIsImNtLTEiLDFd"),
    ],
)
def test_secret_is_replaced_by_the_mark(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out
    assert MARK in out


def test_private_key_block_is_removed_whole() -> None:
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\nAAAB\n" \
          "-----END OPENSSH PRIVATE KEY-----"
    out = redact(f"here it is:\n{key}\nthanks")
    assert "b3BlbnNzaC1rZXktdjEAAAA" not in out
    assert out.startswith("here it is:") and out.endswith("thanks")


@pytest.mark.parametrize("key", [
    "PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\nPrivate-Lines: 1\nAAAAgQCpW3Xq9T0sY2lEq8\n"
    "Private-MAC: 3a9f",
    "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: \"k\"\nAAAAgQCpW3Xq9T0sY2lEq8\n"
    "---- END SSH2 ENCRYPTED PRIVATE KEY ----",
])
def test_key_files_whose_first_line_alone_is_a_rules_shape_are_removed_whole(key: str) -> None:
    out = redact(f"here it is:\n{key}\nthanks")
    assert out == f"here it is:\n{redact_module.KEY_MARK}\nthanks"
    cut = key[: key.rindex("\n")]  # without its last line
    assert "AAAAgQCpW3Xq9T0sY2lEq8" in cut and "AAAAgQCpW3Xq9T0sY2lEq8" not in redact(cut)


def test_truncated_private_key_is_removed_to_the_end() -> None:
    out = redact("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA")
    assert "MIIEowIBAAKCAQEA" not in out


@pytest.mark.parametrize(
    "text",
    [
        "set max_tokens=100 in the request",
        "the bearer of bad news",
        "Basic authentication is used",
        "use Python, not Node",
        "our database is PostgreSQL 15 on port 5433",
        "tokens: 42",
        "git checkout 3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39",
        "mkdir -p build && docker run -p 8080:80 img",
        "git push -u origin main",
        "bypass=true",
        "the first pass is slow",
        "ssh -p 2222 host",
        "mysql -u root -p",
        "--token-file path",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) == text


# Pieces of every rule's shapes, and of the near misses around them, for the property below.
_PIECES = [
    "password", "PassWord", "passwd", "pass", "pw", "pwd", "secret", "token", "Tokens", "key",
    "api_key", "ApiKey", "credentials", "Bearer", "authorization", "Basic", "mysql", "mariadb",
    "-p", "-u", "--user", "--password", "--token", "sk-", "sk_live_", "ghp_", "xoxb-", "hf_",
    "AKIA", "eyJ", "AIza", "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----",
    "PuTTY-User-Key-File-2:", "Private-MAC:", "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----",
    "---- END SSH2 ENCRYPTED PRIVATE KEY ----",
    "https://", "://", "@", ":", "=", " = ", '"', "'", '\\"', "\\", " ", "\t", "\n", "\x0b",
    "\x1c", ".", "_",
    "-", ";", ",", "is", " is ", "was", "are", "/", "+", "abcdefghijklmnop", "ABCDEFGHIJKLMNOP",
    "0123456789", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "\u212a", "é",
    # Non-ASCII text is asked in a stand-in: its spaces, others and look-alikes of letters.
    "\u00a0", "\u2003", "\u3000", "\u2028", "\x85", "\u200b", "\u017f", "\u0130", "\u0131",
    "中", "pa\u017f\u017fword", "\u212aey",
]


@hypothesis.settings(max_examples=3000, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join))
def test_skipping_the_rules_that_cannot_match_changes_nothing(text: str) -> None:
    everything = set(range(len(redact_module._RULES)))
    with mock.patch.object(redact_module, "_may_match", lambda _: everything):
        expected = redact(text)
    assert redact(text) == expected


def test_the_letters_that_make_a_text_run_every_rule_are_all_that_re_takes_for_ascii() -> None:
    letter = re.compile("[a-z]", re.IGNORECASE)
    seen = "".join(chr(c) for c in range(0x80, 0x110000)
                   if not 0xD800 <= c < 0xE000 and letter.fullmatch(chr(c)))
    assert redact_module._AS_ASCII_LETTER.findall(seen) == list(seen) and len(seen) == 4


def test_non_ascii_text_skips_the_rules_that_cannot_match_it() -> None:
    text = "Hi friends,\u200b the config\u00a0loader fails on Stra\u00dfe " * 50
    assert redact_module._may_match(text) == frozenset()
    assert redact_module._may_match(text + "password\u3000= hunter2") != frozenset()
    assert redact(text + "password\u3000= hunter2").endswith(f"password\u3000= {MARK}")
    assert redact_module._may_match("\u212a" + text) == redact_module._EVERY


@hypothesis.settings(max_examples=2000, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(st.lists(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join),
                           max_size=8))
def test_texts_redacted_together_come_out_as_one_by_one(texts: list[str]) -> None:
    assert redact_all(texts) == [redact(t) for t in texts]


def test_texts_redacted_together_ask_the_sets_once_when_nothing_is_there() -> None:
    sentences = [f"Always run the linter before step {n}." for n in range(30)]
    asked: list[str] = []
    real = redact_module._may_match
    with mock.patch.object(redact_module, "_may_match", lambda t: asked.append(t) or real(t)):
        assert redact_all(sentences) == sentences
        assert len(asked) == 1
        leaked = [*sentences, "Never share it: password=hunter22 is the staging one."]
        assert redact_all(leaked)[-1] == "Never share it: password=[REDACTED] is the staging one."
        assert redact_all(leaked)[:-1] == sentences
