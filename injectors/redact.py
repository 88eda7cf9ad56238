"""Secrets out before anything is stored: API keys, bearer tokens, private keys, passwords.

Applied to every text a memory record is made of. It errs towards redacting: a lost word in a
remembered turn costs little, a stored key costs a lot. The shapes below are this project's;
after them, the maintained rule set of detect-secrets' plugins runs through RE2
(``injectors.secret_rules``).

Every pattern here runs in time linear in its input under Python's backtracking ``re``, because
the input is whatever a request carries (a 1 MB base64 blob, a minified bundle, a line of
``a=a=a=...``). The rules that keep them so:

- a pattern that may scan a long run starts only where that run starts (a negative lookbehind
  on the run's own characters), never at every position inside it;
- a run that must be followed by a character outside it is matched possessively (``++``), so a
  failure gives the run up at once instead of trying every shorter length;
- anything that may repeat before the part that decides is bounded (``{0,16}``).

``tests/memory/test_linear_time.py`` times each pattern on 1 MB inputs of its worst shapes.
The input is also cut to ``injectors.bounds.RECORD_CHARS`` first.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import re2

from ctxproxy.injectors.bounds import RECORD_CHARS, WHITESPACE, cut_mark, ends, whole_words
from ctxproxy.injectors.secret_rules import rules, spans

__all__ = ["MARK", "redact", "redact_all", "redact_whole"]

MARK = "[REDACTED]"
KEY_MARK = "[REDACTED PRIVATE KEY]"

_PRIVATE_KEY = re.compile(
    r"-----BEGIN[A-Z0-9 ]*+(?:(?<=PRIVATE KEY)|(?<=PRIVATE KEY BLOCK))-----.*?"
    r"(?:-----END[A-Z0-9 ]*+(?:(?<=PRIVATE KEY)|(?<=PRIVATE KEY BLOCK))-----|\Z)",
    re.DOTALL,
)
_KEY_END = re.compile(r"-----END[A-Z0-9 ]*+(?:(?<=PRIVATE KEY)|(?<=PRIVATE KEY BLOCK))-----")
# PuTTY's key files and SSH2's (RFC 4716): the maintained rules know their first line, but
# the key is in the lines after it, up to the MAC or the END line (or the end, when cut).
_KEY_FILE = re.compile(
    r"PuTTY-User-Key-File-\d++:.*?(?:Private-MAC:[^\n]*+|\Z)"
    r"|---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----.*?"
    r"(?:---- END SSH2 ENCRYPTED PRIVATE KEY ----|\Z)",
    re.DOTALL,
)

# Keys with a recognisable shape, wherever they stand. Each long run is either bounded or
# succeeds however long it is, except the JWT's, which starts only where its run starts.
_KEYS = re.compile(
    r"""
      \bsk-[A-Za-z0-9_-]{16,}                           # OpenAI, Anthropic (sk-ant-), ...
    | \b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}            # Stripe secret and restricted keys
    | \b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}         # GitHub tokens
    | \bgithub_pat_[A-Za-z0-9_]{20,}
    | \bglpat-[A-Za-z0-9_-]{20,}                        # GitLab
    | \bxox[abposr]-[A-Za-z0-9-]{10,}                   # Slack
    | \bhf_[A-Za-z0-9]{20,}                             # Hugging Face
    | \bnpm_[A-Za-z0-9]{20,}                            # npm
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b                     # AWS access key ids
    | \bAIza[0-9A-Za-z_-]{35}                           # Google API keys
    | (?<![\w-])eyJ[\w-]{8,}+\.eyJ[\w-]{8,}+\.[\w-]{8,}  # JWTs
    | (?<![\w.-])cap1\.[\w-]{8,}+\.[\w-]{16,}          # our capabilities (knowledge.capability)
    """,
    re.VERBOSE | re.ASCII,
)
# A bare 40-character run of the base64 alphabet that mixes cases and digits: an AWS secret
# access key (a hex digest, a git commit id, is one case and stays).
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_BEARER = re.compile(r"\b(Bearer)(\s++)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
# "Authorization: Basic ...", "Authorization: Token ...", "authorization: <token>"
_AUTHORIZATION = re.compile(
    r"\b(Authorization[\"']?[ \t]*+[:=][ \t]*+[\"']?(?:[A-Za-z-]{1,20}[ \t]++)?)"
    r"[A-Za-z0-9._~+/=:-]{8,}",
    re.IGNORECASE,
)
# scheme://user:password@host
_URL_PASSWORD = re.compile(
    r"(?<![a-zA-Z0-9+.-])([a-zA-Z][a-zA-Z0-9+.-]*+://[^\s/:@]*+):([^\s/@]++)@"
)
# Names whose value is a secret. The name must end with the word (not max_tokens=...);
# "pass" and "pw" only as a word of their own (DB_PASS, not bypass). A lookbehind is of one
# width in ``re``, hence one per ending.
_SECRET_ENDINGS = (
    "password", "passwd", "passphrase", "pwd", "secret", "token", "credential", "credentials",
    "api_key", "api-key", "apikey", "access_key", "access-key", "accesskey", "private_key",
    "private-key", "privatekey", "account_key", "account-key", "accountkey",
    *(f"{sep}{word}" for word in ("pass", "pw") for sep in "_.-"),
)
_SECRET_NAME = (
    r"(?:(?:pass|pw)(?![\w.-])|[\w.-]++(?:"
    + "|".join(f"(?<={re.escape(e)})" for e in _SECRET_ENDINGS)
    + "))"
)
# password=..., "api_key": "...", DB_PASSWORD: ..., AccountKey=...; and in a JSON string
# (a tool call's arguments, as memory stores them): DB_PASSWORD=\"...\", \"api_key\": \"...\"
_ASSIGNMENT = re.compile(
    rf"""
    (?<![\w.-])
    (?P<name>(?:\\?["'])?{_SECRET_NAME}(?:\\?["'])?)
    (?P<sep>\s*+[:=]\s*+)
    (?:
        "(?P<dq>[^"\n]*+)"
      | '(?P<sq>[^'\n]*+)'
      | \\"(?P<edq>(?:[^"\\\n]|\\[^"\n])*+)\\"
      | (?P<bare>[^\s"',;&}}\]]++)
    )
    """,
    re.IGNORECASE | re.VERBOSE,
)
# --password PW, -password=PW, --token "..." (the = form is an assignment already)
_FLAG = re.compile(
    r"(?<![\w-])(--?(?:password|passwd|pass|pwd|token|secret|api-key|apikey|access-key"
    r"|secret-key|client-secret)[ \t]++)(?:\"[^\"\n]*+\"|'[^'\n]*+'|[^\s\"'-]\S*+)",
    re.IGNORECASE,
)
# curl -u user:PW, --user user:PW (the user stays)
_USER_FLAG = re.compile(
    r"(?<!\S)((?:-u|--user)(?:[ \t]*+=?[ \t]*+)[\"']?[^\s:\"']*+:)[^\s\"']++"
)
# mysql -pPW (and its kin): the password glued to -p, a few words after the command.
_MYSQL = re.compile(
    r"\b((?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlsh|mariadb|mariadb-dump)\b"
    r"(?:[ \t]++(?!-p)[^\s]++){0,16}?[ \t]++-p)[^\s]++"
)
# "the password is hunter2", "my api key is ...", "the pw is ..."
_SAID = re.compile(
    r"\b((?:password|passwd|passphrase|passcode|secret|token|api[ _-]?key|access[ _-]?key"
    r"|pw|pwd)s?\s++(?:is|was|are)\s++)([^\s,;]++)",
    re.IGNORECASE,
)


def _assignment(match: re.Match[str]) -> str:
    name, sep = match.group("name"), match.group("sep")
    if match.group("dq") is not None:
        return f'{name}{sep}"{MARK}"'
    if match.group("sq") is not None:
        return f"{name}{sep}'{MARK}'"
    if match.group("edq") is not None:
        return f'{name}{sep}\\"{MARK}\\"'
    return f"{name}{sep}{MARK}"


def _aws_secret(match: re.Match[str]) -> str:
    run = match.group()
    mixed = (
        any(c.isupper() for c in run) and any(c.islower() for c in run)
        and any(c.isdigit() or c in "/+" for c in run)
    )
    return MARK if mixed else run


# In order: whole blocks first, then the shapes that name their secret, then bare shapes.
_RULES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (_PRIVATE_KEY, KEY_MARK),
    (_KEY_FILE, KEY_MARK),
    (_URL_PASSWORD, rf"\1:{MARK}@"),
    (_BEARER, rf"\1\2{MARK}"),
    (_AUTHORIZATION, rf"\1{MARK}"),
    (_ASSIGNMENT, _assignment),
    (_FLAG, rf"\1{MARK}"),
    (_USER_FLAG, rf"\1{MARK}"),
    (_MYSQL, rf"\1{MARK}"),
    (_SAID, rf"\1{MARK}"),
    (_KEYS, MARK),
    (_AWS_SECRET, _aws_secret),
)

# A looser RE2 pattern per rule, matching wherever the rule could: one pass of an RE2 set over
# a text says which rules may match it, and a text with no secret (nearly all) skips the
# rules' own scans, each of which costs ``re`` a step at every position. On ASCII text the two
# engines agree on case and on what ``\s`` is (spelled out below, as ``re`` counts \v and
# \x1c-\x1f too); other text is asked in an ASCII stand-in (``_stand_in``). Every rule needs
# one (tests/memory/test_redact.py checks that skipping changes nothing).
_WS = r"[\t\n\v\f\r \x1c-\x1f]"
_LOOSER: dict[re.Pattern[str], str] = {
    _PRIVATE_KEY: r"-----BEGIN",
    _KEY_FILE: r"PuTTY-User-Key-File-|---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----",
    _URL_PASSWORD: r"://[^/@]*@",
    _BEARER: rf"(?i)bearer{_WS}+[A-Za-z0-9._~+/=-]{{8}}",
    _AUTHORIZATION: r"(?i)authorization",
    _ASSIGNMENT: rf"(?i)(?:password|passwd|passphrase|pwd|secret|token|credentials?|key|pass|pw)"
                 rf"(?:\\?[\"'])?{_WS}*[:=]",
    _FLAG: r"(?i)-(?:password|passwd|pass|pwd|token|secret|api-key|apikey|access-key"
           r"|secret-key|client-secret)[ \t]",
    _USER_FLAG: r"-u",
    _MYSQL: r"(?:mysql|mariadb)[^\n]*[ \t]-p",
    _SAID: rf"(?i)(?:password|passwd|passphrase|passcode|secret|token|api[ _-]?key"
           rf"|access[ _-]?key|pw|pwd)s?{_WS}+(?:is|was|are){_WS}",
    _KEYS: r"sk-|[rs]k_(?:live|test)_|gh[pousr]_|github_pat_|glpat-|xox[abposr]-|hf_|npm_"
           r"|AKIA|ASIA|AIza|eyJ|cap1\.",
    # The rule's lookarounds, as characters or an end: a run of exactly 40.
    _AWS_SECRET: r"(?:^|[^A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?:[^A-Za-z0-9/+=]|$)",
}
_EVERY = frozenset(range(len(_RULES)))


@functools.cache
def _looser() -> Any:
    """The RE2 set of the looser patterns, in the order of ``_RULES``."""
    options = re2.Options()
    options.log_errors = False
    together = re2.Set.SearchSet(options)
    for pattern, _ in _RULES:
        together.Add(_LOOSER[pattern])
    together.Compile()
    return together


# The non-ASCII characters ``re`` takes for an ASCII letter when it ignores case (U+017F, the
# long s, is s; U+212A, the Kelvin sign, is k): a rule that ignores case may match them where
# the looser pattern needs the letter, and one that does not sees no letter there. A text
# holding one runs every rule.
# (tests/memory/test_redact.py finds them all.)
_AS_ASCII_LETTER = re.compile("[\u0130\u0131\u017f\u212a]")
_NON_ASCII_SPACE = re.compile(r"(?![\x00-\x7f])\s")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _stand_in(text: str) -> str:
    """``text`` in ASCII, for the looser patterns: each non-ASCII space (what ``re`` counts
    as whitespace) a space, any other non-ASCII character a NUL. Where a rule matches
    ``text``, its looser pattern matches the stand-in: a rule's words and ASCII classes hold
    neither a non-ASCII character nor a NUL, and a NUL stands in every negated class a
    non-ASCII character stands in."""
    return _NON_ASCII.sub("\x00", _NON_ASCII_SPACE.sub(" ", text))


def _may_match(text: str) -> frozenset[int]:
    """The rules (indices in ``_RULES``) that may match ``text``."""
    if not text.isascii():
        if _AS_ASCII_LETTER.search(text):
            return _EVERY
        text = _stand_in(text)
    return frozenset(_looser().Match(text) or ())


def _bounded(text: str) -> str:
    """``text`` cut to ``RECORD_CHARS``; the words the cut splits are dropped whole (half a
    key is still a secret), and so is the rest of a private key whose BEGIN line was cut."""
    mark = cut_mark(len(text))
    head, tail = ends(text, RECORD_CHARS, mark)
    head = whole_words(text, len(head))
    starts = [i for i in (tail.find(c) for c in WHITESPACE) if i >= 0]
    tail = tail[min(starts) :] if starts else ""
    end = _KEY_END.search(tail)
    if end is not None and not 0 <= tail.find("-----BEGIN", 0, end.start()):
        # The END line stays, to close a BEGIN that the head still holds.
        tail = f"{KEY_MARK}\n{tail[end.start() :]}"
    return f"{head}{MARK}{mark}{MARK}{tail}"


def redact(text: str) -> str:
    """``text`` with every secret this module recognises replaced by ``[REDACTED]``; a text
    over ``RECORD_CHARS`` is cut to its head and tail first."""
    if len(text) > RECORD_CHARS:
        text = _bounded(text)
    may = _may_match(text)
    for at, (pattern, replacement) in enumerate(_RULES):
        if at in may:
            done = pattern.sub(replacement, text)
            if done != text:  # a mark is in it now: ask again what may match
                text, may = done, _may_match(done)
    return _maintained(text)


def redact_whole(text: str) -> str:
    """``redact`` of a text of any length, kept whole: redacted in pieces of at most
    ``RECORD_CHARS``, each ending at a line break (a secret is on one line) and never inside
    a private key's block (a masked tool output fetched back must be the output, not its
    head and tail)."""
    pieces, start = [], 0
    while len(text) - start > RECORD_CHARS:
        end = text.rfind("\n", start, start + RECORD_CHARS) + 1
        if end <= start:
            end = start + RECORD_CHARS  # one line longer than a piece: cut it anyway
        begin = text.rfind("-----BEGIN", start, end)
        if begin > start and text.find("-----END", begin, end) < 0:
            end = begin  # the key goes whole into the next piece
        pieces.append(redact(text[start:end]))
        start = end
    pieces.append(redact(text[start:]))
    return "".join(pieces)


def redact_all(texts: Sequence[str]) -> list[str]:
    """``redact`` of each of ``texts``: the RE2 sets asked once of them all, joined by line
    breaks, and each text on its own only when the sets find something there.

    Each ask of a set lets the GIL go, and taking it back costs a worker thread up to the
    switch interval while another thread (the event loop) runs Python: asked one sentence at
    a time, sentences took many times as long beside a busy thread as alone
    (bench/gil_convoy.py; bench/RESULTS.md, The event loop beside worker threads).
    Whatever a set matches in one text it matches in the joined one:
    where a pattern holds a text's start or end, it also takes a line break there (as
    whitespace, a non-word character, or a class that leaves it out); a match across two
    texts only sends them one by one."""
    if len(texts) < 2 or any(len(t) > RECORD_CHARS for t in texts):
        return [redact(t) for t in texts]
    if not _found_together(texts):
        return list(texts)  # nothing to redact in any (nearly always)
    return [redact(t) for t in texts]


def _found_together(texts: Sequence[str]) -> bool:
    """Whether the sets find anything in ``texts`` joined by line breaks (``redact_all``)."""
    together = "\n".join(texts)
    return bool(_may_match(together)) or bool(rules().together.Match(together))


def _maintained(text: str) -> str:
    """``text`` with what detect-secrets' rules find (``injectors.secret_rules``) replaced."""
    found = spans(text)
    if not found:
        return text
    parts, at = [], 0
    for start, end in found:
        if text[start:end] in (MARK, KEY_MARK):
            continue
        parts += [text[at:start], MARK]
        at = end
    parts.append(text[at:])
    return "".join(parts)
