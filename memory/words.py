"""Words of a text, the way search and distillation see them: lower case, no stopwords."""

from __future__ import annotations

import re

__all__ = ["STOPWORDS", "WORD", "terms"]

# The Snowball English list, the one PostgreSQL's 'english' configuration drops too, so that
# both stores match a question on the same words.
STOPWORDS = frozenset(
    """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself
    she her hers herself it its itself they them their theirs themselves what which who whom
    this that these those am is are was were be been being have has had having do does did
    doing a an the and but if or because as until while of at by for with about against
    between into through during before after above below to from up down in out on off over
    under again further then once here there when where why how all any both each few more
    most other some such no nor not only own same so than too very s t can will just don
    should now d ll m o re ve y ain aren couldn didn doesn hadn hasn haven isn ma mightn
    mustn needn shan shouldn wasn weren won wouldn
    """.split()
)

# Letters and digits in any script; '_' separates, as in SQLite's unicode61 tokenizer.
WORD = re.compile(r"[^\W_]+")


def terms(text: str, *, limit: int = 64) -> list[str]:
    """The distinct non-stopwords of ``text`` in order of appearance, at most ``limit``."""
    seen: dict[str, None] = {}
    for match in WORD.finditer(text.lower()):
        word = match.group()
        if word not in STOPWORDS and word not in seen:
            seen[word] = None
            if len(seen) >= limit:
                break
    return list(seen)
