"""Wires the proxy's sides together: the window, knowledge discovery and memory, in order."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from config import Settings
from knowledge import wiring as knowledge_wiring
from memory import wiring as memory_wiring
from proxy.app import SETTINGS, add_passthrough, create_app
from proxy.pipeline import Step, WindowStep


def steps(app: web.Application) -> Sequence[Step]:
    """The request pipeline, in order: cut the history, then add knowledge, then memory."""
    settings = app[SETTINGS]
    ordered: list[Step | None] = [
        WindowStep.from_settings(settings),
        knowledge_wiring.step(app),
        memory_wiring.step(app),
    ]
    return [s for s in ordered if s is not None]


def build_app(settings: Settings) -> web.Application:
    """The full app as ``ctxproxy serve`` runs it."""
    app = create_app(settings, steps=steps)
    knowledge_wiring.install(app)
    memory_wiring.install(app)
    add_passthrough(app)  # last: local routes first
    return app
