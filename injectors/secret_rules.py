"""Secret shapes from a maintained rule set: detect-secrets' plugins, matched by RE2.

``injectors.redact`` names the shapes this project knows by hand; detect-secrets (Yelp's,
maintained upstream) knows many more vendors' (Artifactory, Azure storage, Discord, IBM,
Mailchimp, PyPI, SendGrid, Square, Telegram, Twilio, ...). Their patterns are written for
Python's backtracking ``re``; here each one is compiled by RE2, whose matching is linear in the
text whatever the pattern, after a few mechanical rewrites of what RE2 lacks (lookarounds at a
pattern's edge). A pattern that still does not compile is left out and counted (``skipped``);
``tests/memory/test_redact_rules.py`` pins how many are in use.

What a rule's groups capture is the secret (detect-secrets reports the groups, else the whole
match); only that is replaced, so ``password=`` and the like stay readable.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import re2

__all__ = ["Rules", "rules", "spans"]

# Public IP addresses are not secrets, and a remembered turn needs them.
_LEFT_OUT = frozenset({"IPPublicDetector"})
# RE2 has no lookarounds: these edges become a consumed character or nothing. Only the
# groups are replaced, and a pattern without groups loses nothing by a looser edge.
_REWRITES = (
    ("(?:(?<=\\W)|(?<=^))", "(?:^|\\W)"),
    ("(?!\\w)", ""),
    ("(?![a-zA-Z0-9_\\-])", ""),
    ("{50,1024}", "{50,1000}"),  # RE2 bounds a repetition at 1000
)
_FLAGS = ((re.IGNORECASE, "i"), (re.MULTILINE, "m"), (re.DOTALL, "s"))
# The set's DFA: enough that a record (``injectors.bounds.RECORD_CHARS``) never exhausts it,
# which would make the set report no match (tests/memory/test_redact_rules.py).
SET_MEMORY = 64 << 20


@dataclass(frozen=True, slots=True)
class Rules:
    """The compiled rules, and the names of the patterns RE2 would not take."""

    compiled: tuple[Any, ...]
    names: tuple[str, ...]  # the plugin of each compiled rule
    skipped: tuple[str, ...]
    # All of them in one RE2 set: one pass over a text says which rules match it at all.
    together: Any = None


def _translate(pattern: re.Pattern[str]) -> str | None:
    """The pattern in RE2's syntax, or None when it cannot be said there."""
    text = pattern.pattern
    if pattern.flags & re.VERBOSE:
        if "#" in text or "\\ " in text:
            return None  # comments or escaped spaces: not worth a parser of our own
        text = "".join(text.split())
    for old, new in _REWRITES:
        text = text.replace(old, new)
    flags = "".join(letter for flag, letter in _FLAGS if pattern.flags & flag)
    return f"(?{flags}){text}" if flags else text


def _plugins() -> Iterable[tuple[str, re.Pattern[str]]]:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    classes: Iterable[Any] = get_mapping_from_secret_type_to_class().values()
    for cls in sorted(classes, key=lambda c: c.__name__):
        if issubclass(cls, RegexBasedDetector) and cls.__name__ not in _LEFT_OUT:
            for pattern in cls().denylist:
                yield cls.__name__, pattern


@functools.cache
def rules() -> Rules:
    """detect-secrets' regex plugins compiled by RE2 (once, on first use)."""
    options = re2.Options()
    options.log_errors = False
    compiled, names, skipped = [], [], []
    for name, pattern in _plugins():
        text = _translate(pattern)
        try:
            if text is None:
                raise re2.error("verbose pattern")
            compiled.append(re2.compile(text, options=options))
            names.append(name)
        except re2.error:
            skipped.append(name)
    set_options = re2.Options()
    set_options.log_errors = False
    set_options.max_mem = SET_MEMORY
    together = re2.Set.SearchSet(set_options)
    for rule in compiled:
        together.Add(rule.pattern)
    together.Compile()
    return Rules(tuple(compiled), tuple(names), tuple(skipped), together)


def spans(text: str) -> list[tuple[int, int]]:
    """Where the rules find secrets in ``text``: each match's non-empty groups, else the whole
    match; sorted, overlaps merged."""
    found: list[tuple[int, int]] = []
    every = rules()
    # A text no rule matches (nearly all) costs the set's one pass, not a pass per rule.
    matching = every.together.Match(text) or ()
    for rule in (every.compiled[i] for i in sorted(matching)):
        for match in rule.finditer(text):
            start, end = match.span()
            groups = [match.span(i) for i in range(1, rule.groups + 1)]
            groups = [(a, b) for a, b in groups if 0 <= a < b]
            # The groups are the secret when they end the match ("password: (...)"); a group
            # elsewhere is a prefix (GitLab's "glcbt-(ab_)?...") and the match is the secret.
            trailing = groups and max(b for _, b in groups) >= end - 2
            found += groups if trailing else [(start, end)]
    found.sort()
    merged: list[tuple[int, int]] = []
    for start, end in found:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        elif start < end:
            merged.append((start, end))
    return merged
