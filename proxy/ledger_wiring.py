"""How the request ledger plugs into the app: its store, the pipeline step that hands every
model request (Responses, Messages, Chat Completions) to the recorder once it is over, and
the handle the ``/ui`` pages read."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from ctxproxy.injectors import tokens
from ctxproxy.ledger import Ledger, LedgerError, Prices, Record
from ctxproxy.ledger.counterfactual import PartCounter
from ctxproxy.ledger.measure import Bodies, Counting, InProcess, InThread, Measurer, Pending
from ctxproxy.ledger.recorder import Recorder
from ctxproxy.ledger.stores import make_ledger
from ctxproxy.proxy.app import CLOCK, METRICS, SETTINGS
from ctxproxy.request import Access, End, Sent, Step
from ctxproxy.request.protocol import RESPONSES

__all__ = ["LEDGER", "LedgerSide", "LedgerStep", "install", "step"]

log = logging.getLogger("ctxproxy.ledger")


@dataclass(slots=True)
class LedgerSide:
    """The ledger of one app: its store (None: it could not open), recorder and prices."""

    ledger: Ledger | None
    recorder: Recorder | None
    prices: Prices
    error: str | None = None


LEDGER = web.AppKey("ledger", LedgerSide)


def install(app: web.Application) -> None:
    settings = app[SETTINGS]
    prices = Prices.from_settings(settings)
    if not settings.stats_enabled:
        app[LEDGER] = LedgerSide(None, None, prices, "CTXPROXY_STATS_ENABLED is off")
        return
    app.cleanup_ctx.append(_ledger_ctx)


async def _ledger_ctx(app: web.Application) -> AsyncIterator[None]:
    settings, metrics = app[SETTINGS], app[METRICS]
    prices = Prices.from_settings(settings)
    ledger = make_ledger(settings)
    try:
        await ledger.open()
    except LedgerError as exc:
        # The proxy serves on; only the stats are missing (said on /ui and in the log).
        log.warning("request stats are off: the ledger did not open: %s", exc)
        app[LEDGER] = LedgerSide(None, None, prices, str(exc))
        yield
        return
    recorder = Recorder(
        ledger, _counting(settings.stats_process), retention_days=settings.stats_retention_days,
        on_drop=lambda reason, n: metrics.ledger_dropped.labels(reason).inc(n),
        clock=app[CLOCK],
    )
    recorder.start()
    app[LEDGER] = LedgerSide(ledger, recorder, prices)
    try:
        yield
    finally:
        await recorder.close()
        await ledger.close()


def _counting(in_process: bool) -> Counting:
    """Where the rows are counted, started: a child process, else (or if it cannot start) a
    thread of this one."""
    if in_process:
        counting = InProcess()
        try:
            counting.start()
            return counting
        except LedgerError as exc:
            log.warning("request stats are counted in a thread of the worker: %s", exc)
    return InThread(Measurer(PartCounter(tokens.count)))


def step(app: web.Application) -> Step | None:
    """The ledger's pipeline step (called at start-up, after every context is open); None
    when the ledger is off or did not open."""
    side = app.get(LEDGER)
    if side is None or side.recorder is None:
        return None
    return LedgerStep(app, side.recorder)


class LedgerStep:
    """Hands each request that went upstream to the recorder once it is over (its end
    phase): the recorder counts and prices its row off the loop."""

    name = "ledger"

    def __init__(self, app: web.Application, recorder: Recorder) -> None:
        self._app = app
        self._recorder = recorder

    def ended(self, end: End) -> None:
        if end.sent is not None:
            self._recorder.put(pending(self._app, end.sent, end.access, end.status,
                                       bodies=self._recorder.counting.takes_bodies,
                                       principal=end.principal or ""))


TEXT_CHARS = 200  # a row's names: a header may be any length and hold lone surrogates


def _text(value: str) -> str:
    return value[:TEXT_CHARS].encode("utf-8", "replace").decode()


def pending(app: web.Application, sent: Sent, info: Access, status: int, *,
            bodies: bool = True, principal: str = "") -> Pending:
    """The row so far (what the relay knows), for the recorder to count and price: with the
    bodies the proxy parsed if ``bodies`` and it has them, else with their bytes.
    ``principal``: the client key's, whose row it is ('' without client keys)."""
    ex = sent.exchange
    settings = app[SETTINGS]
    notes = info.notes
    degraded = list(info.steps_failed or ())
    if notes is not None and notes.memory_degraded:
        degraded.append("memory")
    if info.fail_open:
        degraded.append("parse")
    if info.upstream_error:
        degraded.append("upstream")
    model = session = ""
    team = agent = user = ""
    if ex is not None:
        value = ex.body.get("model")
        model = value if isinstance(value, str) else ""
        session = ex.identity.session_id or ""
        team, agent = ex.identity.team_id or "", ex.identity.agent_id or ""
        user = ex.identity.owner  # as memory scopes name it
    record = Record(
        at=sent.at, session_id=_text(session), model=_text(model), status=status,
        service_id=settings.service_id, team_id=_text(team), agent_id=_text(agent),
        user_ref=user, principal=principal,
        input_tokens=info.input_tokens, cached_tokens=info.cached_tokens,
        cache_write_tokens=info.cache_write_tokens,
        output_tokens=info.output_tokens,
        turns_in=info.turns_in, turns_forwarded=info.turns_forwarded,
        items_cut=info.items_cut or 0,
        outputs_masked=(notes.outputs_masked or 0) if notes is not None else 0,
        memory_ids=(notes.memory_ids or ()) if notes is not None else (),
        knowledge=bool(notes is not None and notes.knowledge_assets),
        degraded=tuple(degraded), ttfb_ms=info.ttfb_ms, protocol=sent.protocol,
    )
    forwarded = None if sent.forwarded is sent.raw else sent.forwarded
    parsed = _bodies(sent, forwarded) if bodies else None
    if parsed is not None:  # counted from what the proxy parsed: no second parse
        return Pending(record, b"", None, parsed=True, bodies=parsed)
    return Pending(record, sent.raw, forwarded, parsed=ex is not None)


def _bodies(sent: Sent, forwarded: bytes | None) -> Bodies | None:
    """The bodies the proxy parsed, when it has both (else the recorder parses the bytes).
    A Messages request's parse is the steps' view, not its prompt: counted from its bytes."""
    if sent.exchange is not None and sent.exchange.protocol is not RESPONSES:
        return None
    if sent.client_body is None or (forwarded is not None and sent.forwarded_body is None):
        return None
    size = len(sent.raw) + (len(forwarded) if forwarded is not None else 0)
    return Bodies(sent.client_body, sent.forwarded_body if forwarded is not None else None, size)
