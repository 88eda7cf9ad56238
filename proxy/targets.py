"""Request targets as the upstream may get them: origin-form paths that stay under the base.

A forwarded path is joined under ``UPSTREAM_URL``'s base path, and requests there may carry
``UPSTREAM_API_KEY``; a ``..`` that an upstream (or a server in front of it) resolves would
leave that base. Dot segments are refused rather than resolved: clients resolve them before
sending, so one that arrives is a probe, and refusing is simpler to get right than resolving
in every encoding.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from ctxproxy.proxy.errors import BadRequest

__all__ = ["check_path", "origin_path"]

# What some servers treat as a segment separator once percent-decoded: / and \ .
_SEPARATORS = re.compile(r"[/\\]")


def origin_path(raw_target: str) -> str:
    """The path of an origin-form target (``/path?query``), still percent-encoded.

    Refuses absolute-form (``http://host/path``), authority-form and asterisk-form targets:
    a proxy for one upstream has no use for them, and their host is not ours to follow.
    """
    if not raw_target.startswith("/"):
        raise BadRequest("the request target must be a path (origin-form), not a URL")
    return raw_target.partition("?")[0]


def check_path(path: str) -> str:
    """``path`` unchanged if no segment of it is ``.`` or ``..``, however it is encoded."""
    decoded = unquote(path, errors="replace")  # %2e%2e, %2E%2e, ..%2f all count
    for segment in _SEPARATORS.split(decoded):
        # ";" starts path parameters, which some servers drop before resolving dots.
        if segment.partition(";")[0] in (".", ".."):
            raise BadRequest("the request path has a dot segment (. or ..); send it resolved")
    return path
