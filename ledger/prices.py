"""Model prices for the cost estimates: a small table of common models, overridable by
``CTXPROXY_PRICES``. Models not in it show tokens only, never a guessed price."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ctxproxy.config import Settings

__all__ = ["DEFAULT_PRICES", "Price", "Prices", "parse_prices"]

PER = 1_000_000  # prices are per million tokens


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million input tokens: uncached, read from the prompt cache, written to it."""

    input: float
    cached: float
    write: float

    def cost(self, input_tokens: int, cached_tokens: int, written: int | None = None) -> float:
        """What a prompt of ``input_tokens``, ``cached_tokens`` of them cached, costs (USD).

        ``written``: the tokens the upstream reported it wrote to its cache (models that
        price writes apart), at the write price, the rest of the uncached at the input
        price. None (not reported): the uncached are all written (the input price where
        writes cost nothing extra, as with OpenAI's prefix caching).
        """
        uncached = max(0, input_tokens - cached_tokens)
        if written is None:
            return (uncached * self.write + cached_tokens * self.cached) / PER
        written = min(written, uncached)
        return ((uncached - written) * self.input + written * self.write
                + cached_tokens * self.cached) / PER


def _openai(input_price: float, cached: float) -> Price:
    return Price(input_price, cached, input_price)


# Public list prices (USD per 1M tokens) as of late 2025; check yours and override. The
# breakpoint-rule models (gpt-5.6 and later) have no entry: their prices are not guessed, and
# CTXPROXY_PRICES gives them (their write price then follows CTXPROXY_BREAKPOINT_WRITE_RATIO).
DEFAULT_PRICES: Mapping[str, Price] = {
    "gpt-5": _openai(1.25, 0.125),
    "gpt-5-codex": _openai(1.25, 0.125),
    "gpt-5.1": _openai(1.25, 0.125),
    "gpt-5.1-codex": _openai(1.25, 0.125),
    "gpt-5-mini": _openai(0.25, 0.025),
    "gpt-5-nano": _openai(0.05, 0.005),
    "gpt-4.1": _openai(2.00, 0.50),
    "gpt-4.1-mini": _openai(0.40, 0.10),
    "gpt-4o": _openai(2.50, 1.25),
    "gpt-4o-mini": _openai(0.15, 0.075),
    "o3": _openai(2.00, 0.50),
    "o4-mini": _openai(1.10, 0.275),
    "claude-sonnet-4": Price(3.00, 0.30, 3.75),
    "claude-opus-4": Price(15.00, 1.50, 18.75),
}


class Prices:
    """Looks a model up: its exact name, else the longest known name it starts with followed
    by ``-`` (``gpt-5-2025-08-07`` is ``gpt-5``), else None (unknown: tokens only)."""

    def __init__(self, table: Mapping[str, Price] = DEFAULT_PRICES) -> None:
        self._table = dict(table)
        self._by_length = sorted(self._table, key=len, reverse=True)

    def __call__(self, model: str) -> Price | None:
        price = self._table.get(model)
        if price is not None:
            return price
        for name in self._by_length:
            if model.startswith(name + "-"):
                return self._table[name]
        return None

    @classmethod
    def from_setting(cls, value: str | None,
                     write_ratio: Callable[[str], float] = lambda model: 1.0) -> Prices:
        """The default table with ``CTXPROXY_PRICES`` on top (see ``parse_prices``)."""
        return cls({**DEFAULT_PRICES, **parse_prices(value or "", write_ratio)})

    @classmethod
    def from_settings(cls, settings: Settings) -> Prices:
        """The table ``settings`` give: an entry of a breakpoint model without a write price
        writes at ``breakpoint_write_ratio`` of its input price."""

        def ratio(model: str) -> float:
            return settings.breakpoint_write_ratio if settings.follows_breakpoints(model) else 1.0

        return cls.from_setting(settings.prices, ratio)


def parse_prices(
    value: str, write_ratio: Callable[[str], float] = lambda model: 1.0
) -> dict[str, Price]:
    """``model=input/cached[/write],...`` (USD per 1M tokens; write defaults to input times
    ``write_ratio(model)``).

    Raises ValueError naming the entry that is wrong.
    """
    table: dict[str, Price] = {}
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        model, sep, numbers = entry.partition("=")
        parts = numbers.split("/")
        if not sep or not model.strip() or len(parts) not in (2, 3):
            raise ValueError(f"{entry!r} is not model=input/cached[/write]")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"{entry!r}: prices must be numbers") from None
        if any(v < 0 for v in values):
            raise ValueError(f"{entry!r}: prices cannot be negative")
        name = model.strip()
        table[name] = Price(values[0], values[1], values[2] if len(values) == 3
                            else values[0] * write_ratio(name))
    return table
