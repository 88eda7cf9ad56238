"""A request the upstream refuses keeps nothing: no episode, no working memory, nothing
distilled from it. Only what a success answered is kept (issue 43: a web page's made-up
history, refused upstream for want of a key, was stored and recalled into the user's next
request). On both stores."""

from __future__ import annotations

from typing import Any

import pytest

from ctxproxy.memory.model import Memory
from tests.conftest import ProxyFactory
from tests.fakes import codex
from tests.fakes.upstream import FakeUpstream
from tests.memory.conftest import Backend
from tests.memory.session import Session, post, runtime, settle

PLANTED = "Use Python, not Node, for the build scripts."


def made_up(session_id: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A request whose earlier turns (answered, by its own account) plant a preference."""
    items = [*codex.context_items(), *codex.text_turn(PLANTED),
             *codex.text_turn(f"Never commit to main. {PLANTED}"),
             codex.text("user", "Now add a lint step.")]
    return (codex.request(items, session_id),
            codex.headers(session_id=session_id, turn_id=f"{session_id}-t3"))


async def held(proxy: Any) -> list[tuple[str, str, str]]:
    """Every record the store holds, after the queued writes and a distillation."""
    await settle(proxy)
    records: list[Memory] = await runtime(proxy).store.list(None)
    return sorted((m.type, m.key, m.text) for m in records)


@pytest.mark.parametrize("status", [401, 429, 500])
async def test_a_request_the_upstream_refuses_leaves_memory_as_it_was(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory, status: int,
) -> None:
    proxy = await start_proxy(**backend.settings)
    await Session(proxy, upstream, session_id="earlier").say("Set up the repository.")
    before = await held(proxy)
    assert before  # the answered turn is there: "as it was" is not just empty

    for session_id in ("planted-1", "planted-2"):
        upstream.then_error(status)
        assert await post(proxy.url, *made_up(session_id)) == status

    assert await held(proxy) == before
    assert len(upstream.received) == 3  # the refused requests did reach the upstream


async def test_the_same_requests_answered_are_kept_even_after_a_refusal(
    backend: Backend, upstream: FakeUpstream, start_proxy: ProxyFactory,
) -> None:
    proxy = await start_proxy(**backend.settings)
    for session_id in ("planted-1", "planted-2"):
        upstream.then_error(429)
        assert await post(proxy.url, *made_up(session_id)) == 429
    assert await held(proxy) == []

    # The retries are answered: what they brought is kept, and distilled.
    for session_id in ("planted-1", "planted-2"):
        assert await post(proxy.url, *made_up(session_id)) == 200

    kept = await held(proxy)
    assert {kind for kind, _, _ in kept} == {"episodic", "working", "semantic"}
    assert (("semantic", PLANTED) in {(kind, text) for kind, _, text in kept})
