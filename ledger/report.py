"""The numbers ``ctxproxy stats`` and the ``/ui`` pages show, from the ledger's sums: one
place, so that the two always agree."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ctxproxy.ledger.model import Totals
from ctxproxy.ledger.prices import Prices

__all__ = [
    "ESTIMATE_NOTE", "Row", "parse_since", "percent", "summarize", "tokens", "total", "usd",
]

ESTIMATE_NOTE = (
    "Costs are input tokens priced per model (output costs the same either way and is left "
    "out). Through the proxy: the upstream's own usage (input, cached and, where it reports "
    "them, cache-write tokens at the model's write price). Direct: an "
    "estimate from the client's own bodies, counted with the proxy's tokenizer and put on the "
    "upstream's scale, with the provider's prefix-cache rule applied to them (the longest "
    "prefix shared with the session's earlier requests, from 1,024 tokens in 128-token "
    "steps, forgotten after 10 minutes unused), its uncached tokens written to the cache at "
    "the model's write price (for breakpoint models CTXPROXY_BREAKPOINT_WRITE_RATIO of the "
    "input price unless CTXPROXY_PRICES gives one). Requests without the upstream's usage are "
    "counted but not priced; models without a price show tokens only."
)


@dataclass(slots=True)
class Row:
    """One group's numbers (a day, a session, a model, or everything)."""

    key: str
    requests: int = 0
    priced: int = 0
    client_tokens: int = 0
    forwarded_tokens: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    direct_input: int = 0
    direct_cached: int = 0
    items_cut: int = 0
    outputs_masked: int = 0
    recalled: int = 0
    degraded: int = 0
    cost_direct: float | None = None  # USD, over the rows of priced models
    cost_proxy: float | None = None
    unpriced_models: list[str] = field(default_factory=list)
    first_at: float = 0.0
    last_at: float = 0.0

    @property
    def saving(self) -> float | None:
        if self.cost_direct is None or self.cost_proxy is None:
            return None
        return self.cost_direct - self.cost_proxy

    @property
    def saving_share(self) -> float | None:
        saving = self.saving
        return saving / self.cost_direct if saving is not None and self.cost_direct else None

    @property
    def cached_share(self) -> float | None:
        return self.cached_tokens / self.input_tokens if self.input_tokens else None

    @property
    def cache_write_share(self) -> float | None:
        """The share of the input the upstream reported written to its cache (None: it
        reported no writes)."""
        return self.cache_write_tokens / self.input_tokens if (
            self.input_tokens and self.cache_write_tokens) else None

    @property
    def direct_cached_share(self) -> float | None:
        return self.direct_cached / self.direct_input if self.direct_input else None

    @property
    def forwarded_share(self) -> float | None:
        return self.forwarded_tokens / self.client_tokens if self.client_tokens else None

    def add(self, t: Totals, prices: Prices) -> None:
        for name in ("requests", "priced", "client_tokens", "forwarded_tokens", "input_tokens",
                     "cached_tokens", "cache_write_tokens", "output_tokens", "direct_input",
                     "direct_cached",
                     "items_cut", "outputs_masked", "recalled", "degraded"):
            setattr(self, name, getattr(self, name) + getattr(t, name))
        self.first_at = min(self.first_at, t.first_at) if self.first_at else t.first_at
        self.last_at = max(self.last_at, t.last_at)
        price = prices(t.model)
        if price is None:
            if t.model not in self.unpriced_models:
                self.unpriced_models.append(t.model)
            return
        self.cost_direct = (self.cost_direct or 0.0) + price.cost(t.direct_input,
                                                                   t.direct_cached)
        # Writes priced apart only where the upstream reported them. Direct, every uncached
        # token is written: at a breakpoint model's write price, as its implicit breakpoint
        # does for an append-only history.
        self.cost_proxy = (self.cost_proxy or 0.0) + price.cost(
            t.input_tokens, t.cached_tokens, t.cache_write_tokens or None)

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key, "requests": self.requests, "priced_requests": self.priced,
            "client_tokens": self.client_tokens, "forwarded_tokens": self.forwarded_tokens,
            "input_tokens": self.input_tokens, "cached_tokens": self.cached_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_write_share": _round(self.cache_write_share),
            "output_tokens": self.output_tokens, "direct_input_tokens": self.direct_input,
            "direct_cached_tokens": self.direct_cached, "cached_share": _round(self.cached_share),
            "cost_direct": _round(self.cost_direct, 6), "cost_proxy": _round(self.cost_proxy, 6),
            "saving": _round(self.saving, 6), "saving_share": _round(self.saving_share),
            "items_cut": self.items_cut, "outputs_masked": self.outputs_masked,
            "recalled": self.recalled, "degraded": self.degraded,
            "unpriced_models": self.unpriced_models,
            "first_at": self.first_at, "last_at": self.last_at,
        }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def summarize(totals: Iterable[Totals], prices: Prices) -> list[Row]:
    """One Row per group key (the models in it summed), in the order the keys came."""
    rows: dict[str, Row] = {}
    for t in totals:
        row = rows.get(t.key)
        if row is None:
            row = rows[t.key] = Row(t.key)
        row.add(t, prices)
    return list(rows.values())


def total(totals: Iterable[Totals], prices: Prices) -> Row:
    """Every group in one Row."""
    row = Row("total")
    for t in totals:
        row.add(t, prices)
    return row


_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(value: str, now: float | None = None) -> float | None:
    """``30m``, ``24h``, ``7d``, ``2w`` back from now; ``all``: no bound (None)."""
    if value == "all":
        return None
    match = _SINCE.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a duration like 30m, 24h, 7d or 'all'")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    return (time.time() if now is None else now) - seconds


# --- how the numbers are written (the table and the pages alike) ---------------------------


def tokens(n: int) -> str:
    """1234 -> '1,234'; 551138 -> '551k'; 1077317 -> '1.08M'."""
    if n >= 10_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 100_000:
        return f"{n / 1e3:.0f}k"
    return f"{n:,}"


def usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.2f}" if abs(value) >= 100 else f"${value:,.4f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
