"""The upstream client: one pooled aiohttp session, the only way out to the real API.

aiohttp's client rather than httpx here: it shares the server's event loop and C HTTP parser,
and on the relay's hot path that costs several times less CPU than h11 (bench/RESULTS.md,
Proxy overhead: Hot path profile).
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections.abc import Callable

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from ctxproxy.proxy.errors import BadRequest, UpstreamTimeout, UpstreamUnreachable
from ctxproxy.proxy.targets import check_path

LARGE_BODY = 512 * 1024
WARN_EVERY_S = 60.0  # an unreachable upstream is a warning once a minute, not per request

log = logging.getLogger("ctxproxy")


def shown_url(url: str | URL) -> str:
    """``url`` as an error or a log line may show it: scheme, host, port and path, without
    the user, password, query or fragment, any of which may carry a credential."""
    parsed = URL(url).with_query(None).with_fragment(None)
    return str(parsed.with_user(None) if parsed.is_absolute() else parsed)


class Upstream:
    """Sends requests to ``base_url`` and nowhere else, and maps failures to ProxyErrors."""

    def __init__(
        self,
        base_url: str,
        connect_timeout_s: float,
        read_timeout_s: float,
        *,
        connector: Callable[[], aiohttp.BaseConnector] | None = None,
    ) -> None:
        self.base = URL(base_url)
        self._shown = shown_url(self.base)
        # The transport seam: tests give a connector of their own (a Unix socket, say).
        self._connector = connector
        # The read timeout is ours (``send``, ``Idle``), not aiohttp's sock_read: that one
        # cancels a timer and makes a new one on every chunk read.
        self.read_timeout_s = read_timeout_s
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._warned_at = -WARN_EVERY_S

    async def start(self) -> None:
        connector = self._connector() if self._connector else aiohttp.TCPConnector(
            limit=0, ttl_dns_cache=300, enable_cleanup_closed=True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,  # relay bytes as the upstream encoded them
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def url(self, path: str, query_string: str = "") -> URL:
        """``path`` (client side, /v1 stripped) under the base URL; the client's Host is ignored.

        Raises BadRequest for a path with dot segments, which could resolve outside the base.
        """
        check_path(path)
        base_path = self.base.raw_path.rstrip("/")
        url = self.base.with_path(base_path + "/" + path.lstrip("/"), encoded=True)
        return URL(f"{url}?{query_string}", encoded=True) if query_string else url

    async def send(
        self, method: str, url: URL, headers: CIMultiDict[str], body: bytes | None
    ) -> aiohttp.ClientResponse:
        """Send and return once the status line and headers are in (body not read)."""
        assert self._session is not None, "Upstream.start() was not awaited"
        # A large body is written in chunks from a stream, not in one write (aiohttp warns).
        data: bytes | io.BytesIO | None = (
            io.BytesIO(body) if body is not None and len(body) > LARGE_BODY else body
        )
        try:
            async with asyncio.timeout(self.read_timeout_s):
                return await self._session.request(
                    method, url, headers=headers, data=data, allow_redirects=False
                )
        except TimeoutError as exc:
            raise UpstreamTimeout("the upstream did not answer in time") from exc
        except ValueError as exc:
            # aiohttp refuses to write what HTTP forbids (a control character in the target or
            # a header): the request itself is malformed.
            raise BadRequest(f"the request cannot be forwarded: {exc}") from exc
        except aiohttp.ClientError as exc:
            now = time.monotonic()
            if now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                log.warning("the upstream %s cannot be reached: %s (requests get 502)",
                            self._shown, exc)
            # The URL named, and the setting when no connection was made, so that a newcomer
            # sees what to fix.
            hint = ("; check CTXPROXY_UPSTREAM_URL"
                    if isinstance(exc, aiohttp.ClientConnectorError) else "")
            raise UpstreamUnreachable(
                f"the upstream {self._shown} could not be reached ({type(exc).__name__}){hint}"
            ) from exc


class Idle:
    """Breaks ``response``'s body with a read timeout once it has sent nothing for
    ``timeout_s`` while read. The relay marks each chunk: ``writing`` before it hands one to
    the client (a slow client is not a silent upstream), ``moved`` after.

    One timer a response, moved on only when it fires: aiohttp's own (``sock_read``) cancels
    a timer and makes a new one for every chunk, a share of the event loop's time under
    bench/load.py worth saving (bench/RESULTS.md, Load)."""

    __slots__ = ("_handle", "_last", "_loop", "_response", "_timeout_s")

    def __init__(self, response: aiohttp.ClientResponse, timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._response = response
        self._timeout_s = timeout_s
        self._last: float | None = self._loop.time()
        self._handle = self._loop.call_at(self._last + timeout_s, self._check)

    def writing(self) -> None:
        self._last = None

    def moved(self) -> None:
        self._last = self._loop.time()

    def cancel(self) -> None:
        self._handle.cancel()

    def _check(self) -> None:
        now = self._loop.time()
        due = now + self._timeout_s if self._last is None else self._last + self._timeout_s
        if now < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self._response.content.set_exception(
            aiohttp.ServerTimeoutError("no data from the upstream within the read timeout"))
