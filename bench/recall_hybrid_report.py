"""bench.recall_hybrid's relevance gate, as its runs measured it: the tables its report adds.

- ``Gate``: one set's hybrid run as the similarity gate sees it (each ask's best similarity
  and word match, for the facts and for the absent asks), and what passes at a gate ``t``;
- ``gate_report``: how well each gate in ``GATES`` separates the facts from the absent asks;
- ``sweep_report``: the derive set end to end at each ``--sweep`` gate, what the default
  EMBEDDINGS_MIN_SIMILARITY was chosen by;
- ``share``: an ask kind's recalled share, as every table shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ctxproxy.config import load_settings

if TYPE_CHECKING:  # only annotations: bench.recall_hybrid imports this module
    from bench.recall_hybrid import Result


def share(result: Result, kind: str) -> str:
    """The share of ``kind``'s asks recalled, as "80% (8/10)"; "-" without asks."""
    asks = result.asks[kind]
    return f"{result.recalled[kind] / asks:.0%} ({result.recalled[kind]}/{asks})" if asks else "-"


GATES = [round(0.10 + 0.05 * n, 2) for n in range(9)]  # similarity gates swept: 0.10-0.50


@dataclass
class Gate:
    """One set's hybrid run, as the relevance gate sees it."""

    facts: list[tuple[float | None, float]]  # per fact ask: the fact's best similarity, match
    wrong: list[float]  # similarities of the other memories the fact asks found
    absent: list[tuple[float | None, float]]  # per absent ask: best similarity, best match
    fused_fact: list[float]  # the fact's fused relevance, where it passed the gate
    fused_wrong: list[float]  # the others' that passed
    fused_absent: list[float]  # an absent ask's best fused relevance, where any passed

    @classmethod
    def of(cls, result: Result) -> Gate:
        gate = cls([], [], [], [], [], [])
        for kind, marker, seen in result.seen:
            sims = [(i, sim, match) for i, (text, sim, match) in seen.hits.items()
                    if kind == "absent" or marker not in text]
            if kind == "absent":
                gate.absent.append((max((s for _, s, _ in sims if s is not None), default=None),
                                    max((m for _, _, m in sims), default=0.0)))
                if seen.fused:
                    gate.fused_absent.append(max(seen.fused.values()))
                continue
            right = [(i, sim, match) for i, (text, sim, match) in seen.hits.items()
                     if marker in text]
            gate.facts.append((max((s for _, s, _ in right if s is not None), default=None),
                               max((m for _, _, m in right), default=0.0)))
            gate.wrong += [s for _, s, _ in sims if s is not None]
            gate.fused_fact += [seen.fused[i] for i, _, _ in right if i in seen.fused]
            gate.fused_wrong += [seen.fused[i] for i, _, _ in sims if i in seen.fused]
        return gate

    def passing(self, t: float, min_score: float) -> tuple[int, int]:
        """(fact asks whose fact passes, absent asks with a memory passing) at gate ``t``."""
        def passes(sim: float | None, match: float) -> bool:
            return (sim is not None and sim >= t) or match >= min_score
        return (sum(passes(*f) for f in self.facts), sum(passes(*a) for a in self.absent))


def _q(values: Sequence[float], p: int) -> str:
    return f"{np.percentile(values, p):.2f}" if values else "-"


def gate_report(runs: dict[tuple[str, str, str], Result], min_score: float,
                default: float) -> list[str]:
    """How well a similarity gate separates the facts from the absent asks, per set."""
    gates = {name: Gate.of(r) for (name, store, mode), r in runs.items()
             if mode == "hybrid" and store == next(iter(k[1] for k in runs))}
    if not gates:
        return []
    lines = ["", "The relevance gate, measured on the first store's hybrid runs: for each "
             "paraphrase ask, the fact's best similarity among the 20 nearest memories and "
             "the share of the question's words it holds; for each absent ask, the nearest "
             "memory's. A memory passes at gate t when its similarity is at least t or it "
             f"holds RECALL_MIN_SCORE ({min_score}) of the question's words.", "",
             "| set | fact's similarity p10 / p50 / p90 (not among the 20 nearest) "
             "| other memories' p50 / p90 / max | absent ask's nearest p50 / p90 / max |",
             "|---|---|---|---|"]
    for name, g in gates.items():
        found = [s for s, _ in g.facts if s is not None]
        near = [s for s, _ in g.absent if s is not None]
        lines.append(f"| {name} | {_q(found, 10)} / {_q(found, 50)} / {_q(found, 90)} "
                     f"({len(g.facts) - len(found)}) | {_q(g.wrong, 50)} / {_q(g.wrong, 90)} / "
                     f"{_q(g.wrong, 100)} | {_q(near, 50)} / {_q(near, 90)} / {_q(near, 100)} |")
    lines += ["", "| similarity gate t | " + " | ".join(
        f"{name}: facts passing / absent asks let through" for name in gates) + " |",
        "|---:|" + "---:|" * len(gates)]
    for t in GATES:
        cells = []
        for g in gates.values():
            facts, noise = g.passing(t, min_score)
            cells.append(f"{facts}/{len(g.facts)} / {noise}/{len(g.absent)}")
        mark = " (default)" if abs(t - default) < 1e-9 else ""
        lines.append(f"| {t:.2f}{mark} | " + " | ".join(cells) + " |")
    lines += ["", "Fused relevance (reciprocal rank fusion after the gate, scaled so that "
              "each turn's best is 1): "
              + "; ".join(
                  f"{name}: the fact's p50 {_q(g.fused_fact, 50)}, the others' p50 "
                  f"{_q(g.fused_wrong, 50)}, an absent ask's best p50 {_q(g.fused_absent, 50)}"
                  for name, g in gates.items())
              + ". The fused score ranks within a turn and says nothing across turns (every "
              "turn with any candidate has one at 1): it is no gate, so the gate stays on each "
              "search's own evidence, before the fusion."]
    return lines


def sweep_report(swept: dict[float, Result], store: str) -> list[str]:
    """The derive set end to end at each similarity gate: what the default was chosen by."""
    if not swept:
        return []
    default = load_settings(env={}).embeddings_min_similarity
    lines = ["", f"The derive set end to end ({store}, hybrid) at each "
             "EMBEDDINGS_MIN_SIMILARITY:", "",
             "| gate | paraphrase asks recalled | lexical asks recalled "
             "| absent asks given a recall block | memory tokens / ask |",
             "|---:|---:|---:|---:|---:|"]
    for t, r in sorted(swept.items()):
        tokens = f"{np.mean(r.tokens):.0f}" if r.tokens else "0"
        lines.append(f"| {t:.2f}{' (default)' if abs(t - default) < 1e-9 else ''} | "
                     f"{share(r, 'paraphrase')} | {share(r, 'lexical')} "
                     f"| {r.noise}/{r.asks['absent']} | {tokens} |")
    lines += ["", "The default is chosen on the derive set only (the held-out rows above "
              "are at the default as it stands): the most facts recalled among the gates that "
              "keep bench.economics at or under direct at every session length (see the note "
              "below this block)."]
    return lines
