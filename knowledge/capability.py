"""Capabilities: short-lived, scope-bound tokens that let the model's shell call an asset.

The ``<knowledge_tools>`` block's curl lines are run by the model, which holds no client key
and must never see the core token. Each line carries a capability instead: an HMAC-SHA256
(128 bits) over what it grants (service, team, agent, user, asset) and the period it was
minted in. A token is the same for a whole period (the block stays byte-stable, so the
prompt cache keeps it) and is accepted in its period and the next, then never again.

One function mints (``mint``), one checks (``check``); anything that hands the model a
command to call the proxy back with can use them.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
from dataclasses import dataclass

import orjson

from ctxproxy.injectors.knowledge_block import CAPABILITY_HEADER as HEADER

__all__ = ["HEADER", "CapabilityKey", "Grant", "check", "mint"]

_PREFIX = "cap1"
_DOMAIN = b"ctxproxy-capability-v1\0"
_MAC_BYTES = 16
_MAX_TOKEN = 2048


@dataclass(frozen=True, slots=True)
class Grant:
    """What a token lets its bearer do: use ``knowledge_id`` as this scope may."""

    service_id: str
    team_id: str
    agent_id: str
    user: str  # the user key's digest ('' without one), as bindings refer to users
    knowledge_id: str


@dataclass(frozen=True, slots=True)
class CapabilityKey:
    """The secret tokens are keyed by, and how long a token's period lasts."""

    secret: bytes
    period_s: float

    def __repr__(self) -> str:
        return f"CapabilityKey(<secret>, period_s={self.period_s})"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: CapabilityKey, payload: bytes) -> bytes:
    return hmac.new(key.secret, _DOMAIN + payload, hashlib.sha256).digest()[:_MAC_BYTES]


def _period(key: CapabilityKey, now: float) -> int:
    return int(now // key.period_s) if key.period_s > 0 else 0


def mint(key: CapabilityKey, grant: Grant, *, now: float) -> str:
    """The token for ``grant`` in the period ``now`` falls in (the same all period long)."""
    return _minted(key, grant, _period(key, now))


# Every request of a session lists the same grants in the same period: minted once.
@functools.lru_cache(maxsize=4096)
def _minted(key: CapabilityKey, grant: Grant, period: int) -> str:
    payload = orjson.dumps([grant.service_id, grant.team_id, grant.agent_id, grant.user,
                            grant.knowledge_id, period])
    return f"{_PREFIX}.{_b64(payload)}.{_b64(_mac(key, payload))}"


def check(key: CapabilityKey, token: str | None, *, now: float) -> Grant | None:
    """What ``token`` grants, if ``key`` minted it in this period or the last; else None."""
    if not token or len(token) > _MAX_TOKEN:
        return None
    prefix, _, rest = token.partition(".")
    encoded, _, mac = rest.partition(".")
    if prefix != _PREFIX:
        return None
    try:
        payload, presented = _unb64(encoded), _unb64(mac)
    except (binascii.Error, ValueError):
        return None
    if not hmac.compare_digest(presented, _mac(key, payload)):
        return None
    try:
        service, team, agent, user, knowledge_id, period = orjson.loads(payload)
    except (orjson.JSONDecodeError, ValueError, TypeError):
        return None
    if not isinstance(period, int) or _period(key, now) - period not in (0, 1):
        return None
    fields = (service, team, agent, user, knowledge_id)
    if not all(isinstance(f, str) for f in fields):
        return None
    return Grant(*fields)
