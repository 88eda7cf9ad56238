"""What a user's statement must never become: standing advice that runs a command, fetches a
URL, overrules the agent's instructions or carries a credential.

A semantic memory is replayed in every later session of its scope, so a statement holding one
of these is either an injection or a one-off that must not outlive its turn. The decision reads
the statement rather than matching spellings: ``shlex`` cuts it into shell tokens (operators
such as ``|``, ``<(`` and ``&&`` become tokens of their own) and a command is a program used
as one, with an argument, after a pipe or behind ``sudo``; an order about instructions is a
verb that drops something next to a noun that names the agent's instructions, in any order.

Quotes and backticks are plain tokens here, not quoting: nothing quoted is hidden from the
reading and an unbalanced quote cannot fail it. The programs are those that fetch, run code,
destroy, change permissions or open a connection; project tools (git, make, pytest, npm) are
not among them, so "always run make lint" stays a rule that can be distilled.

Every step is one pass over the statement's tokens or words. The statement is at most
``MAX_CHARS`` long: ``shlex`` copies a token as it grows it, which that bound keeps small.
"""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Sequence
from typing import Literal

__all__ = ["MAX_CHARS", "Hazard", "hazard"]

Hazard = Literal["long", "credential", "url", "command", "instruction"]

MAX_CHARS = 300  # a longer statement is not read at all (memory.statements drops it)

_SHELLS = frozenset({
    "sh", "bash", "zsh", "dash", "ksh", "mksh", "fish", "csh", "tcsh", "ash", "busybox",
    "pwsh", "powershell", "cmd",
})
# Used with an argument, these run, fetch, destroy or connect.
_PROGRAMS = _SHELLS | frozenset({
    "curl", "wget", "aria2c", "iwr", "irm", "invoke-webrequest", "invoke-restmethod",
    "certutil", "bitsadmin", "mshta", "rundll32", "regsvr32", "wscript", "cscript", "osascript",
    "rm", "rmdir", "shred", "unlink", "dd", "mkfs", "fdisk", "sfdisk", "parted", "wipefs",
    "truncate", "chmod", "chown", "chgrp", "chattr", "setfacl", "kill", "killall", "pkill",
    "shutdown", "reboot", "halt", "poweroff", "systemctl", "crontab", "iptables", "userdel",
    "usermod", "visudo", "nc", "ncat", "netcat", "socat", "telnet", "ssh", "scp", "sftp", "ftp",
    "tftp", "nmap", "source", "xargs", "env", "nohup", "base64", "xxd", "launchctl", "schtasks",
})
# Followed by almost anything, these hand what follows to a shell or to root.
_RUNNERS = frozenset({
    "sudo", "doas", "pkexec", "runas", "eval", "exec", "iex", "invoke-expression",
    "start-process",
})
# Interpreters run code only when given it: with their flag for it, or fed by a pipe.
_INTERPRETERS = frozenset({
    "python", "py", "perl", "ruby", "node", "nodejs", "deno", "bun", "php", "lua", "tclsh",
})
_CODE_FLAGS = frozenset({"-c", "-e", "-r", "-", "-E", "--eval", "--command", "eval"})
# Words after a program name that show it is being talked about, not run.
_PLAIN = frozenset({
    "is", "are", "was", "were", "be", "been", "am", "has", "have", "had", "does", "did",
    "and", "or", "but", "nor", "for", "in", "on", "at", "to", "with", "without", "over",
    "instead", "rather", "than", "not", "of", "as", "by", "from", "into", "about", "the", "a",
    "an", "this", "that", "it", "its", "if", "when", "so", "too", "also", "only", "here",
    "there", "please", "should", "must", "can", "could", "would", "will", "may", "might",
    "anywhere", "everywhere", "again", "s", "t",
})
# Programs that run the program after them (after a pipe: "| sudo -E bash").
_WRAPPERS = frozenset({
    "sudo", "doas", "env", "nohup", "xargs", "exec", "command", "builtin", "nice", "timeout",
    "time", "stdbuf", "setsid", "chroot", "runuser", "strace",
})
_RUN_VERBS = frozenset({"run", "execute", "exec", "launch", "invoke", "start", "call"})
_QUOTES = frozenset({"'", '"', "`"})
_TRAILING = ".,:;!?*"

_CREDENTIALS = frozenset({
    "password", "passwords", "passwd", "passphrase", "credential", "credentials", "token",
    "apikey", "secretkey", "accesskey", "privatekey",
})
_KEY_KINDS = frozenset({"api", "secret", "access", "private"})
# Files that hold credentials: a statement naming one (to send, print or upload it) is no
# preference to keep.
_SECRET_FILES = frozenset({
    ".env", ".netrc", ".pgpass", ".npmrc", ".pypirc", ".git-credentials", ".htpasswd",
    "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "kubeconfig", "shadow",
})
_SECRET_DIRS = frozenset({".ssh", ".aws", ".gnupg", ".kube", ".docker"})

_DROPS = frozenset({
    "ignore", "ignores", "ignored", "ignoring", "disregard", "disregards", "disregarded",
    "disregarding", "forget", "forgets", "forgot", "forgotten", "forgetting", "override",
    "overrides", "overrode", "overridden", "overriding", "overrule", "overrules", "overruled",
    "bypass", "bypasses", "bypassed", "bypassing", "skip", "skips", "skipped", "skipping",
    "drop", "drops", "dropped", "dropping", "abandon", "abandons", "abandoned", "discard",
    "discards", "discarded", "dismiss", "dismissed", "neglect", "neglected", "circumvent",
    "circumvented", "evade", "ditch", "ditched", "scrap", "scrapped", "cancel", "cancelled",
    "canceled", "void", "voided", "nullify", "nullified", "null", "revoke", "revoked",
    "suspend", "suspended", "disable", "disabled", "remove", "removed", "lift", "lifted",
    "erase", "erased", "delete", "deleted", "clear", "cleared", "reset", "wipe", "wiped",
    "replace", "replaced", "supersede", "superseded", "obsolete", "outdated", "invalid",
    "unbound", "unrestricted", "unfiltered", "uncensored",
})
_NEGATIONS = frozenset({"not", "never", "no", "stop", "quit", "cease", "dont", "t"})
_FOLLOWS = frozenset({
    "follow", "following", "follows", "obey", "obeying", "adhere", "comply", "heed", "respect",
    "apply", "applies", "abide", "bound", "matter", "matters", "valid", "count", "listen",
    "attention", "mind", "regard",
})
# "no rules", "without restrictions": the agent's instructions said to be gone ("no earlier
# than 9" is a time, not an order).
_NONE = frozenset({"no", "without", "zero", "free"})
_PLACES = frozenset({"above", "previous", "prior", "earlier", "preceding", "told"})
_INSTRUCTIONS = frozenset({
    "instruction", "instructions", "rule", "rules", "guideline", "guidelines", "guidance",
    "prompt", "prompts", "directive", "directives", "guardrail", "guardrails", "policy",
    "policies", "restriction", "restrictions", "constraint", "constraints", "safety",
    "filter", "filters", "programming", "orders", "commands", "above", "previous", "prior",
    "earlier", "preceding", "told",
})
# "new instructions: ..." brings instructions of its own.
_NEW = frozenset({
    "new", "updated", "real", "actual", "true", "secret", "hidden", "revised", "different",
    "additional", "overriding",
})
_ORDERS = frozenset({"instruction", "instructions", "prompt", "directive", "directives", "orders"})
_MARKERS = frozenset({
    ("system", "override"), ("system", "message"), ("developer", "mode"), ("god", "mode"),
})


def hazard(sentence: str) -> Hazard | None:
    """Why ``sentence`` must never be distilled, or None when it may be."""
    if len(sentence) > MAX_CHARS:
        return "long"
    words = _words(sentence)
    tokens = _tokens(sentence)
    if _credential(sentence, words) or any(_secret_file(t) for t in tokens):
        return "credential"
    if any(_is_url(t) for t in tokens):
        return "url"
    if _command(tokens):
        return "command"
    if _instruction(words):
        return "instruction"
    return None


# --- reading ---------------------------------------------------------------------------------


def _tokens(sentence: str) -> list[str]:
    lexer = shlex.shlex(sentence, posix=True, punctuation_chars=True)
    lexer.quotes = ""  # a quote is a token: what it quotes stays in view
    lexer.escape = ""
    lexer.commenters = ""
    lexer.wordchars += ":+@%"  # URLs, modes (u+x), user@host stay one token
    return list(lexer)


def _words(sentence: str) -> list[str]:
    """The sentence's words, lower case, with invisible characters dropped and spelled-out
    words ("i g n o r e") joined."""
    text = "".join(
        (c if c.isalnum() else " ") for c in sentence.casefold()
        if unicodedata.category(c) != "Cf"
    )
    out: list[str] = []
    letters: list[str] = []
    for word in text.split():
        if len(word) == 1 and word.isalpha():
            letters.append(word)
            continue
        if letters:
            out.append("".join(letters))
            letters = []
        out.append(word)
    if letters:
        out.append("".join(letters))
    return out


def _credential(sentence: str, words: Sequence[str]) -> bool:
    if "[redacted" in sentence.casefold():
        return True  # redaction found a secret here
    return any(
        w in _CREDENTIALS or (w == "key" and n and words[n - 1] in _KEY_KINDS)
        for n, w in enumerate(words)
    )


def _secret_file(token: str) -> bool:
    parts = token.rstrip(_TRAILING).casefold().split("/")
    return parts[-1] in _SECRET_FILES or any(p in _SECRET_DIRS for p in parts)


def _is_url(token: str) -> bool:
    scheme, sep, _ = token.partition("://")
    if sep and scheme[-1:].isalpha():
        return True
    lowered = token.casefold()
    if lowered.startswith("www."):
        return True
    host, slash, _ = lowered.partition("/")
    label = host.rpartition(".")[2]
    # "evil.example/x.sh": a host, then a path
    return bool(slash) and "." in host and label.isalpha() and 2 <= len(label) <= 24


# --- commands --------------------------------------------------------------------------------


def _command(tokens: Sequence[str]) -> bool:
    tokens = [t for t in tokens if t not in _QUOTES]  # quoting hides nothing here
    piped = _piped(tokens)
    return any(
        _substitution(tokens, n) or _between_words(tokens, n) or _run_at(tokens, n, n in piped)
        for n in range(len(tokens))
    )


def _operator(token: str) -> bool:
    return all(c in "();<>|&" for c in token)


def _piped(tokens: Sequence[str]) -> set[int]:
    """Where a pipe feeds a program: the token after it, and past the ``sudo -E`` or
    ``env X=1`` that hand it on."""
    fed: set[int] = set()
    after_pipe = False
    for n, token in enumerate(tokens):
        if _operator(token):
            after_pipe = "|" in token and token != "||"
            continue
        if after_pipe:
            fed.add(n)
            after_pipe = token[0] in "-+" or "=" in token or _program(token) in _WRAPPERS
    return fed


def _substitution(tokens: Sequence[str], n: int) -> bool:
    """``$(...)``, ``<(...)`` or ``>(...)``: a command's output used in place."""
    token = tokens[n]
    if "<(" in token or ">(" in token:
        return True
    return token == "$" and n + 1 < len(tokens) and tokens[n + 1].startswith("(")


def _between_words(tokens: Sequence[str], n: int) -> bool:
    """A pipe between two words, or a redirection to a file ("> /etc/x", "2>&1"); "a > b"
    and "p99 < 200" compare."""
    token = tokens[n]
    if not _operator(token) or token in ("||", "&&") or n == 0 or n + 1 >= len(tokens):
        return False
    before, after = tokens[n - 1], tokens[n + 1]
    if _operator(before) or _operator(after):
        return False
    if "|" in token:
        return True
    redirect = ">" in token or "<" in token
    return redirect and ("&" in token or (_argument(after) and not after.isdigit()))


def _run_at(tokens: Sequence[str], n: int, piped: bool) -> bool:
    """Whether the token at ``n`` is a program run as a command."""
    name = _program(tokens[n])
    nxt = tokens[n + 1] if n + 1 < len(tokens) else ""
    if piped:
        return name in _PROGRAMS or name in _RUNNERS or name in _INTERPRETERS or _path(tokens[n])
    if name in _RUNNERS:
        return bool(nxt) and _program(nxt) not in _PLAIN
    if name in _PROGRAMS:
        return _argument(nxt)
    if name in _INTERPRETERS:
        return nxt in _CODE_FLAGS
    if not _path(tokens[n]):
        return False
    # A path run as a program: "run ./x", "/tmp/x -q", "./install.sh" first.
    before = tokens[n - 1] if n else ""
    if before.casefold() in _RUN_VERBS or nxt[:1] in ("-", "|"):
        return True
    return (not before or _operator(before)) and (not nxt or _argument(nxt))


def _program(token: str) -> str:
    name = token.casefold().rstrip(_TRAILING)
    name = name.rsplit("/", 1)[-1].removesuffix(".exe")  # /bin/sh is sh
    if name.startswith("mkfs."):
        return "mkfs"
    stem = name.rstrip("0123456789.")  # python3.12 is python
    return stem if stem in _INTERPRETERS else name


def _argument(token: str) -> bool:
    """Whether ``token`` reads as a shell argument: a flag, a path, an operator, a file."""
    if not token:
        return False
    if _operator(token) or token[0] in "$~{":
        return True
    if token[0] in "-+" and len(token) > 1:
        return True  # -rf, --force, +x
    bare = token.rstrip(_TRAILING)
    if "/" in bare or "=" in bare or (bare.isdigit() and len(bare) >= 3):
        return True  # a path, if=/dev/zero, a mode or a port
    stem, dot, ext = bare.rpartition(".")
    return bool(dot and stem and ext.isalpha())  # install.sh, evil.example


def _path(token: str) -> bool:
    return token.startswith(("/", "./", "../", "~/"))


# --- orders about instructions ---------------------------------------------------------------


def _instruction(words: Sequence[str]) -> bool:
    """A verb that drops something and a noun naming the agent's instructions, anywhere in the
    sentence; new instructions announced; a known marker."""
    drops = any(w in _DROPS or _negated_follow(words, n) for n, w in enumerate(words))
    if drops and any(w in _INSTRUCTIONS for w in words):
        return True
    if any(w.startswith("jailbr") for w in words):
        return True
    if any(w in _INSTRUCTIONS and w not in _PLACES and words[n - 1] in _NONE
           for n, w in enumerate(words) if n):
        return True
    return any(
        (words[n - 1], w) in _MARKERS or (words[n - 1] in _NEW and w in _ORDERS)
        or (n >= 2 and words[n - 2] in _NEW and w in _ORDERS)
        for n, w in enumerate(words) if n
    )


def _negated_follow(words: Sequence[str], n: int) -> bool:
    """"no longer follow", "stop obeying", "don't follow": a follow verb up to two words after
    a negation."""
    return words[n] in _FOLLOWS and any(w in _NEGATIONS for w in words[max(0, n - 2) : n])
