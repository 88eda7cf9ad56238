"""The app's typed keys: what the composition root (``proxy.app``) and the sides' wiring put
on the application and on each request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from ctxproxy.config import Settings
from ctxproxy.proxy.metrics import Metrics
from ctxproxy.proxy.pipeline import Pipeline
from ctxproxy.proxy.upstream import Upstream
from ctxproxy.proxy.workers import Peers
from ctxproxy.request import Access, Exchange, Sent

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
UPSTREAM = web.AppKey("upstream", Upstream)
ANTHROPIC = web.AppKey("anthropic", Upstream)  # the Anthropic API (ANTHROPIC_URL)
CHAT_UPSTREAM = web.AppKey("chat", Upstream)  # the Chat Completions API (CHAT_URL, or UPSTREAM)
PIPELINE = web.AppKey("pipeline", Pipeline)
READY = web.AppKey("ready", dict)
# What /readyz asks besides start-up and shutdown: each side's name and whether it can serve
# (the memory store reachable, say), so a load balancer routes around a replica that cannot.
ReadyCheck = Callable[[], Awaitable[bool]]
READY_CHECKS: web.AppKey[dict[str, ReadyCheck]] = web.AppKey("ready_checks")
PEERS = web.AppKey("peers", Peers)  # set in a worker of several (CTXPROXY_WORKERS)
KEYED = web.AppKey("keyed", bool)  # under CLIENT_KEYS: a client's credential is ours alone
# The app's wall clock (a bench replays hours of a session in seconds with its own).
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")

ACCESS = web.RequestKey("access", Access)
SENT = web.RequestKey("sent", Sent)
# The request's parsed body, from its parse on: what the pipeline's later phases are told of.
EXCHANGE = web.RequestKey("exchange", Exchange)
