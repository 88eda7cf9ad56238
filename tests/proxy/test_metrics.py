"""/metrics of a server of several workers: every worker's registry, added up."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from ctxproxy.proxy.app import METRICS, PEERS
from ctxproxy.proxy.local import metrics_route, sibling_app
from ctxproxy.proxy.metrics import Metrics, combine
from ctxproxy.proxy.workers import Peers


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_workers_metrics_add_up_sample_by_sample() -> None:
    one, two = Metrics(), Metrics()
    one.requests.labels("responses", "200").inc(3)
    two.requests.labels("responses", "200").inc(4)
    two.requests.labels("responses", "400").inc()
    one.ttfb.observe(0.02)
    two.ttfb.observe(0.2)
    one.queue_depth.set(2)
    two.queue_depth.set(5)

    got = _samples(combine([one.render().decode(), two.render().decode()]).decode())

    assert got[("ctxproxy_requests_total", (("route", "responses"), ("status", "200")))] == 7
    assert got[("ctxproxy_requests_total", (("route", "responses"), ("status", "400")))] == 1
    assert got[("ctxproxy_upstream_ttfb_seconds_count", ())] == 2
    assert got[("ctxproxy_upstream_ttfb_seconds_bucket", (("le", "0.025"),))] == 1
    assert got[("ctxproxy_upstream_ttfb_seconds_bucket", (("le", "0.25"),))] == 2
    assert abs(got[("ctxproxy_upstream_ttfb_seconds_sum", ())] - 0.22) < 1e-9
    assert got[("ctxproxy_ingest_queue_depth", ())] == 7
    assert got[("ctxproxy_workers_scraped", ())] == 2
    # When a series began is the earliest worker's, not a sum of times.
    created = ("ctxproxy_upstream_ttfb_seconds_created", ())
    assert got[created] == min(_samples(one.render().decode())[created],
                               _samples(two.render().decode())[created])


async def test_a_worker_that_does_not_answer_is_left_out_of_the_scrape(tmp_path: Path) -> None:
    app = web.Application()
    app[METRICS] = metrics = Metrics()
    app[PEERS] = Peers(tmp_path, 3, 0)  # its siblings' sockets are not there
    app.router.add_get("/metrics", metrics_route)
    metrics.requests.labels("responses", "200").inc(5)

    async with TestClient(TestServer(app)) as client:
        r = await client.get("/metrics")
        got = _samples(await r.text())

    assert r.status == 200
    assert got[("ctxproxy_requests_total", (("route", "responses"), ("status", "200")))] == 5
    assert got[("ctxproxy_workers_scraped", ())] == 1


async def test_a_workers_socket_serves_its_metrics_and_nothing_else() -> None:
    metrics = Metrics()
    metrics.requests.labels("responses", "200").inc(2)
    async with TestClient(TestServer(sibling_app(metrics))) as client:
        own = await client.get("/metrics")
        relayed = await client.post("/v1/responses", json={"model": "m", "input": "hi"})
        got = _samples(await own.text())

    assert got[("ctxproxy_requests_total", (("route", "responses"), ("status", "200")))] == 2
    assert relayed.status == 404  # no way around client keys
