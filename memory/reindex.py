"""`ctxproxy memory reindex`: embed the stored memories that have no vector yet, or whose
vectors were cut into chunks otherwise than today.

For a store made before embeddings were turned on, after a change of model, or by an older
chunking (before each statement of a prompt had a vector of its own): it walks the records by
id, compares each one's stored chunks under ``CTXPROXY_EMBEDDINGS_MODEL`` with what
memory.vectors.chunks makes of its text, and indexes those that differ a batch at a time,
writing each batch's vectors before the next, so an interrupted run loses at most one batch
and the next run goes on from what is left. Chunks already embedded are found by digest.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from ctxproxy.config import Settings
from ctxproxy.memory.embed import EmbedError, embedder_from
from ctxproxy.memory.indexer import Indexer
from ctxproxy.memory.model import Store

__all__ = ["reindex"]


class Progress:
    """``done/total (share) rate`` on one line of a terminal, or a line per tenth elsewhere."""

    def __init__(self, total: int, out: TextIO) -> None:
        self.total = max(total, 1)
        self.out = out
        self.started = time.monotonic()
        self.tty = out.isatty()
        self.shown = -1

    def __call__(self, done: int) -> None:
        share = min(done / self.total, 1.0)
        tenth = int(share * 10)
        if not self.tty and tenth == self.shown:
            return
        self.shown = tenth
        rate = done / max(time.monotonic() - self.started, 1e-9)
        width = 30
        bar = "#" * int(share * width) + "-" * (width - int(share * width))
        line = f"reindex [{bar}] {done}/{self.total} ({share:.0%}) {rate:.0f}/s"
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n",
              file=self.out, flush=True)


async def reindex(store: Store, args: argparse.Namespace, settings: Settings) -> int:
    embedder = embedder_from(settings)
    if embedder is None:
        print("ctxproxy memory reindex: CTXPROXY_EMBEDDINGS_URL is not set", file=sys.stderr)
        return 2
    try:
        indexer = Indexer(store, embedder, batch=settings.embeddings_batch,
                          timeout_s=settings.embeddings_timeout_ms / 1000)
        total = await store.count_embeddable()
        if total == 0:
            print(f"every memory has a vector of {embedder.model}")
            return 0
        progress = Progress(total, sys.stderr)
        try:
            done = await indexer.reindex(progress=progress)
        except EmbedError as exc:
            if progress.tty:
                print(file=sys.stderr)
            print(f"ctxproxy memory reindex: embeddings failed: {exc}; run it again to go on",
                  file=sys.stderr)
            return 1
        if progress.tty:
            print(file=sys.stderr)
        if done == 0:
            print(f"every memory has a vector of {embedder.model}")
        else:
            print(f"embedded {done} memories with {embedder.model}")
        return 0
    finally:
        await embedder.aclose()
