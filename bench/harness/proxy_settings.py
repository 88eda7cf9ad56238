"""Proxy settings the replaying benches share: simulated time, and strategies given as
``key=value`` pairs."""

from __future__ import annotations

from typing import Any

import orjson

from ctxproxy.config import Settings

SIMULATED_TIME = {"distill_interval_s": 0.05, "memory_process": False}


def strategy_settings(name: str, pairs: str) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for pair in filter(None, pairs.split(",")):
        key, _, raw = pair.partition("=")
        key = key.strip().lower().removeprefix("ctxproxy_")
        if key not in Settings.model_fields:  # Settings ignores unknown keys: refuse instead
            raise ValueError(f"strategy {name}: there is no setting {key!r}")
        try:
            settings[key] = orjson.loads(raw)
        except orjson.JSONDecodeError:
            settings[key] = raw
    return settings
