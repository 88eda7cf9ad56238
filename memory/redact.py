"""Secrets out before anything is stored: API keys, bearer tokens, private keys, passwords.

Applied to every text a memory record is made of. It errs towards redacting: a lost word in a
remembered turn costs little, a stored key costs a lot.
"""

from __future__ import annotations

import re

__all__ = ["MARK", "redact"]

MARK = "[REDACTED]"

_PRIVATE_KEY = re.compile(
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----.*?"
    r"(?:-----END[A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|\Z)",
    re.DOTALL,
)
# Keys with a recognisable shape, wherever they stand.
_KEYS = re.compile(
    r"""
      \bsk-[A-Za-z0-9_-]{16,}                           # OpenAI, Anthropic (sk-ant-), ...
    | \b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}         # GitHub tokens
    | \bgithub_pat_[A-Za-z0-9_]{20,}
    | \bglpat-[A-Za-z0-9_-]{20,}                        # GitLab
    | \bxox[abposr]-[A-Za-z0-9-]{10,}                   # Slack
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b                     # AWS access key ids
    | \bAIza[0-9A-Za-z_-]{35}                           # Google API keys
    | \beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}   # JWTs
    """,
    re.VERBOSE,
)
_BEARER = re.compile(
    r"\b(Bearer|Authorization:\s*Basic)(\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE
)
# scheme://user:password@host
_URL_PASSWORD = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@]*):([^\s/@]+)@")
# password=..., "api_key": "...", DB_PASSWORD: ..., token=... (not max_tokens=...: the name
# must end with the word).
_ASSIGNMENT = re.compile(
    r"""
    (?P<name>["']?[\w.-]*?
        (?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|apikey|access[_-]?key
          |private[_-]?key|credentials?)
    ["']?)
    (?P<sep>\s*[:=]\s*)
    (?:
        "(?P<dq>[^"\n]*)"
      | '(?P<sq>[^'\n]*)'
      | (?P<bare>[^\s"',;&}\]]+)
    )
    """,
    re.IGNORECASE | re.VERBOSE,
)

# "the password is hunter2", "my api key is ..."
_SAID = re.compile(
    r"\b((?:password|passwd|passphrase|secret|token|api[ _-]?key|access[ _-]?key)s?"
    r"\s+(?:is|was|are)\s+)([^\s,;]+)",
    re.IGNORECASE,
)


def _assignment(match: re.Match[str]) -> str:
    name, sep = match.group("name"), match.group("sep")
    if match.group("dq") is not None:
        return f'{name}{sep}"{MARK}"'
    if match.group("sq") is not None:
        return f"{name}{sep}'{MARK}'"
    return f"{name}{sep}{MARK}"


def redact(text: str) -> str:
    """``text`` with every secret this module recognises replaced by ``[REDACTED]``."""
    text = _PRIVATE_KEY.sub("[REDACTED PRIVATE KEY]", text)
    text = _URL_PASSWORD.sub(rf"\1:{MARK}@", text)
    text = _BEARER.sub(rf"\1\2{MARK}", text)
    text = _ASSIGNMENT.sub(_assignment, text)
    text = _SAID.sub(rf"\1{MARK}", text)
    return _KEYS.sub(MARK, text)
