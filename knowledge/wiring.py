"""How the knowledge side plugs into the app: its resources, routes and pipeline step."""

from __future__ import annotations

from aiohttp import web

from proxy.pipeline import Step


def install(app: web.Application) -> None:
    """Add the knowledge side's cleanup contexts and local routes to app."""


def step(app: web.Application) -> Step | None:
    """The knowledge pipeline step (called at start-up, after every context is open)."""
    return None
