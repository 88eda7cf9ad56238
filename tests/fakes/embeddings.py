"""A small deterministic embedder for the tests, served as ``POST /v1/embeddings``.

Bag of concepts: each word counts towards its concept (the words of a group in ``SYNONYMS``
share one; any other word is its own), hashed into ``DIM`` dimensions, L2-normalised. So a
question that shares no word with a fact but says the same thing in the listed synonyms is
near it, as with a real model, and every answer is the same bytes for the same text.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

DIM = 1024
SYNONYMS = (
    {"release", "releases", "ship", "shipping", "train", "publish", "cadence"},
    {"tuesday", "tuesdays", "fortnight", "fortnightly", "biweekly", "weekday"},
    {"decide", "decided", "agreed", "agree", "settled", "plan"},
    {"invoice", "invoices", "bill", "billing", "bills"},
    {"rounding", "round", "rounded", "cents", "precision"},
)
STOP = frozenset(
    "a an the of to in on at for and or is are was were be we us our you your it its that this "
    "what which how did do does about with let's lets every second".split()
)
_CONCEPT = {word: min(group) for group in SYNONYMS for word in group}


def embed(text: str) -> list[float]:
    vector = [0.0] * DIM
    for word in re.findall(r"[a-z0-9']+", text.lower()):
        if word in STOP:
            continue
        concept = _CONCEPT.get(word, word)
        slot = int.from_bytes(hashlib.sha256(concept.encode()).digest()[:4], "big") % DIM
        vector[slot] += 1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0:
        vector[0] = norm = 1.0  # a text of stop words only: some direction, never zeros
    return [x / norm for x in vector]


def answer(body: Any) -> dict[str, Any]:
    """The OpenAI-shaped answer to an embeddings request body."""
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    return {
        "object": "list",
        "model": body.get("model", "fake"),
        "data": [{"object": "embedding", "index": i, "embedding": embed(t)}
                 for i, t in enumerate(texts)],
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }
