"""Knowledge changes announced to every replica: PostgreSQL ``NOTIFY`` on one channel when the
catalogue or a binding changes (a ``ctxproxy knowledge`` command, or ``ctxproxy knowledge
changed`` after a remote core's), and each replica's discovery cache dropped when it hears one,
rather than when its answers' TTL runs out. Only under ``CTXPROXY_STORE_URL``."""

from __future__ import annotations

from collections.abc import Callable

from ctxproxy.plumbing.pg import notify

__all__ = ["CHANNEL", "Changes", "announce"]

CHANNEL = "ctxproxy_knowledge"


def announce(url: str, service_id: str) -> None:
    """Tell every replica of ``service_id`` on ``url`` that discovery's answers may have
    changed. Raises psycopg.Error, OSError."""
    notify(url, CHANNEL, service_id)


class Changes:
    """A count that moves when a change is heard for this service (or may have been missed),
    or when ``local`` (the embedded catalogue's own count, when given) moves: discovery's
    generation."""

    def __init__(self, service_id: str, local: Callable[[], int] | None = None) -> None:
        self._service_id = service_id
        self._local = local
        self._local_seen = local() if local is not None else 0
        self.count = 0

    def heard(self, payload: str | None) -> None:
        """A notification's payload (the service it is for); None: some may have been
        missed."""
        if payload is None or payload == self._service_id:
            self.count += 1

    def current(self) -> int:
        if self._local is not None:
            now = self._local()
            if now != self._local_seen:
                self._local_seen = now
                self.count += 1
        return self.count
