"""The composition root: builds the app and its pipeline, the one place that wires the sides.

The request's path, in order: the window cuts the history (``window/``), knowledge discovery
adds the ``<knowledge_tools>`` block (``knowledge/``), memory adds its typed blocks
(``memory/``), and for the models that cache only at breakpoints the end of the agent's
context and of those blocks are marked (``injectors/breakpoints.py``); then the relay
forwards (``proxy/app.py``). As the answer comes back, memory keeps what the turn brought and
stores the answered turn; once the request is over, the ledger records its row and
``explain`` keeps it (the phases: ``request/phases.py``). The window's masked outputs are
kept whole for their fetch line by ``proxy/outputs.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from aiohttp import web

from ctxproxy.config import Settings
from ctxproxy.injectors.breakpoints import Breakpoints
from ctxproxy.proxy import explain, knowledge_wiring, ledger_wiring, memory_wiring, outputs, ui
from ctxproxy.proxy.app import METRICS, SETTINGS, add_passthrough, create_app
from ctxproxy.proxy.server import Limits
from ctxproxy.proxy.upstream import Upstream
from ctxproxy.request import Step
from ctxproxy.window.step import WindowStep


def steps(app: web.Application) -> Sequence[Step]:
    """The request pipeline, in order: cut the history, then add knowledge, then memory,
    then mark the cache breakpoints where those steps left stable prefixes; once the request
    is over, record its row in the ledger and keep it for ``explain``. Each phase runs the
    steps that have it in this order."""
    settings = app[SETTINGS]
    ordered: list[Step | None] = [
        WindowStep.from_settings(settings, archive=outputs.archive(app)),
        knowledge_wiring.step(app),
        memory_wiring.step(app),
        Breakpoints(settings.follows_breakpoints),
        ledger_wiring.step(app),
        *explain.steps(app),
    ]
    return [s for s in ordered if s is not None]


def build_app(
    settings: Settings,
    *,
    upstream: Upstream | None = None,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """The full app as ``ctxproxy serve`` runs it (``clock``: the ledger's time)."""
    app = create_app(settings, steps=steps, upstream=upstream, clock=clock)
    knowledge_wiring.install(app)
    memory_wiring.install(app)
    ledger_wiring.install(app)
    outputs.install(app)
    ui.install(app)
    explain.install(app)
    add_passthrough(app)  # last: local routes first
    return app


def limits(app: web.Application) -> Limits:
    """The limits the app's connections are served under (``server.Runner``)."""
    settings, closed = app[SETTINGS], app[METRICS].connections_closed
    return Limits(header_timeout_s=settings.header_timeout_s, keepalive_s=settings.keepalive_s,
                  max_connections=settings.max_connections,
                  closed=lambda reason: closed.labels(reason).inc())
