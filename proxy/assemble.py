"""Wires the proxy's sides together: the window, knowledge discovery and memory, in order."""

from __future__ import annotations

from aiohttp import web

from config import Settings
from proxy.app import add_passthrough, create_app


def build_app(settings: Settings) -> web.Application:
    """The full app as ``ctxproxy serve`` runs it."""
    app = create_app(settings)
    add_passthrough(app)
    return app
