"""Settings: every knob ctxproxy has, each with its env var, default and meaning."""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "CTXPROXY_"
# CTXPROXY_* variables that are not settings: the test suite's own (not read by ctxproxy).
NOT_SETTINGS_PREFIXES = ("CTXPROXY_TEST_", "CTXPROXY_E2E_")
STORE_SCHEMES = ("postgresql://", "postgres://")
SERVICE_ID_PATTERN = r"^[A-Za-z0-9_-]{1,200}$"
_NUMBER = r"\d+(?:\.\d+)?"
_PRICE = re.compile(rf"^[^=,\s][^=,]*={_NUMBER}/{_NUMBER}(?:/{_NUMBER})?$")
# OpenAI's gpt-5.6 and later, gpt-6 and later (any suffix): not gpt-5, gpt-5.5, gpt-5.1-codex.
BREAKPOINT_MODELS = r"gpt-(?:5\.(?:[6-9]|[1-9]\d+)|(?:[6-9]|[1-9]\d+)(?:\.\d+)?)(?:-.+)?"
# One CTXPROXY_PASSTHROUGH entry: a method (or *), then a path whose only * ends it.
_ROUTE = re.compile(r"^(?:\*|[A-Za-z]+)[ \t]+/[^\s*]*\*?$")


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ctxproxy"


class SettingsError(ValueError):
    """A setting has a value ctxproxy cannot start with; the message names the variable."""


class Settings(BaseSettings):
    """ctxproxy's configuration. Built once in ``main()`` and passed down."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # --- the HTTP edge -------------------------------------------------------------------
    host: str = Field(
        "127.0.0.1", description="Address to listen on (the container sets 0.0.0.0)."
    )
    port: int = Field(8787, ge=0, le=65535, description="Port to listen on.")
    public_url: str | None = Field(
        None, description="Address the model can reach this proxy at; default http://HOST:PORT."
    )
    upstream_url: str = Field(
        "https://api.openai.com/v1", description="The real Responses API base URL."
    )
    anthropic_url: str = Field(
        "https://api.anthropic.com",
        description="The real Anthropic API base URL: where /v1/messages (Claude Code) goes.",
    )
    upstream_api_key: SecretStr | None = Field(
        None,
        description="Replaces the client's Authorization when set; unset: forward the client's.",
    )
    chat_url: str | None = Field(
        None,
        description="The real Chat Completions API base URL: where /v1/chat/completions goes; "
        "unset: UPSTREAM_URL, with UPSTREAM_API_KEY.",
    )
    chat_api_key: SecretStr | None = Field(
        None,
        description="Replaces the client's Authorization on requests to CHAT_URL when set; "
        "unset: forward the client's. Needed with CLIENT_KEYS and CHAT_URL (client keys are "
        "never forwarded upstream).",
    )
    anthropic_api_key: SecretStr | None = Field(
        None,
        description="The key sent to ANTHROPIC_URL as x-api-key (for /v1/messages), in place of "
        "the client's x-api-key and Authorization; unset: forward the client's own, except "
        "under CLIENT_KEYS, where Anthropic requests then get a 500 naming this setting.",
    )
    upstream_connect_timeout_s: float = Field(10.0, gt=0, description="Upstream connect timeout.")
    upstream_read_timeout_s: float = Field(
        900.0, gt=0,
        description="Longest wait for the upstream's answer to begin, then between its bytes.",
    )
    max_body_mb: float = Field(32.0, gt=0, description="Largest request body accepted, in MiB.")
    header_timeout_s: float = Field(
        10.0, gt=0,
        description="Longest a client may take to send a request's line and headers, from "
        "its connection's opening or its next request's first byte; then the connection is "
        "closed (with a 408 when nothing else is being answered on it). The body is not counted.",
    )
    keepalive_s: float = Field(
        75.0, gt=0,
        description="Longest a kept-alive client connection may sit idle between requests "
        "before it is closed (it would otherwise hold one of MAX_CONNECTIONS).",
    )
    max_connections: int = Field(
        1024, ge=1,
        description="Client connections a server process holds open at most (each worker "
        "its own); one more is closed as soon as it is accepted, the open ones unharmed.",
    )
    workers: int = Field(
        1,
        ge=1,
        description="Server processes sharing PORT (SO_REUSEPORT) and the store; 0 or auto: "
        "one per CPU. 1: a single process, no supervisor. Each has its own caches and /metrics.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log level."
    )
    log_format: Literal["json", "text"] = Field("json", description="Log line format.")

    client_keys: str | None = Field(
        None,
        description="Accepted client bearer keys: 'KEY [principal=NAME] [teams=A,B] "
        "[agents=X,Y] [users=any|none|KEYS] [admin]' entries separated by ';', or @FILE (one a "
        "line), or plain 'key1,key2'. Other callers get 401; identity headers beyond a key's "
        "claims 403; the key's principal is part of every memory scope, and the dashboard and "
        "explain show a key only its principal's data (admin: everyone's). A key comes as "
        "'Authorization: Bearer KEY' or as x-api-key (Claude Code, the anthropic SDK). The "
        "upstream gets UPSTREAM_API_KEY (Anthropic's: ANTHROPIC_API_KEY), never the client's.",
    )
    passthrough: str | None = Field(
        None,
        description="Under CLIENT_KEYS, the other routes forwarded to the upstream (with "
        "UPSTREAM_API_KEY, which every key shares), beside POST /v1/responses, POST "
        "/v1/messages, POST /v1/messages/count_tokens, GET /v1/models and GET /v1/models/*: "
        "'METHOD /path' entries separated by ',' (METHOD * is any "
        "method; a path ending in * covers every path it starts; /v1 is optional), e.g. "
        "'GET /v1/files, POST /v1/responses/compact'; '* /*' forwards everything. Other "
        "routes get a 403 and nothing is sent. Without CLIENT_KEYS every route is forwarded.",
    )

    allowed_hosts: str | None = Field(
        None,
        description="Names (comma-separated, without a port) a request's Host may give beside "
        "localhost, the loopback addresses, HOST and PUBLIC_URL's host; * allows any (behind a "
        "load balancer). Another Host gets 421. Bound to 0.0.0.0 or :: with CLIENT_KEYS set, "
        "any Host is accepted (every caller needs a key).",
    )
    allowed_origins: str | None = Field(
        None,
        description="Web origins (comma-separated, scheme://host[:port]) whose pages may call "
        "the proxy beside its own (the dashboard). A request with another Origin header gets "
        "403 (/healthz and /readyz aside).",
    )

    # --- the history window --------------------------------------------------------------
    window_policy: Literal["cost", "fixed"] = Field(
        "cost",
        description="How the window cuts: 'cost' cuts where a cut pays by the prompt-cache "
        "prices (CACHED_INPUT_RATIO, CACHE_WRITE_RATIO), between KEEP_MIN_TURNS and KEEP_TURNS "
        "turns and under WINDOW_MAX_TOKENS; 'fixed' keeps KEEP_TURNS, in steps of TRIM_SLACK "
        "or at TRIM_AT_TOKENS.",
    )
    keep_turns: int = Field(
        5, ge=1,
        description="The most user turns forwarded (the newest included); with the fixed "
        "policy, the turns each cut keeps.",
    )
    keep_min_turns: int = Field(
        1, ge=1,
        description="The fewest user turns a cut leaves (the newest included; cost policy).",
    )
    cut_digest_chars: int = Field(
        6000, ge=0,
        description="After a cut, tell the model what was cut: a map of the paths and names "
        "the newest cut turns' commands and reasoning used (those most turns used first) in "
        "one <earlier_turns> message of at most this many characters; 0: off.",
    )
    window_max_tokens: int = Field(
        120_000, ge=0,
        description="Cut whole older turns to keep the forwarded input under about this many "
        "tokens (estimated from bytes; cost policy); 0: no ceiling.",
    )
    cached_input_ratio: float = Field(
        0.1, gt=0, le=1,
        description="The provider's price of a cached input token, as a share of an input "
        "token's (cost policy).",
    )
    cache_write_ratio: float = Field(
        1.0, ge=0,
        description="The provider's price of writing a token to its prompt cache, as a share "
        "of an input token's (1.25 where writes cost extra; cost policy), for models that "
        "cache any prefix (not BREAKPOINT_MODELS).",
    )
    breakpoint_models: str = Field(
        BREAKPOINT_MODELS,
        description="A regular expression matched against a request's whole model name: the "
        "models that cache a prompt only at its breakpoints (the end of the prompt and up to "
        "three marked content parts; OpenAI's gpt-5.6 and later). For them the proxy marks "
        "the end of the agent's context and of the blocks it puts before the first forwarded "
        "turn, and the window prices a cut by BREAKPOINT_WRITE_RATIO; empty: no model.",
    )
    breakpoint_write_ratio: float = Field(
        1.25, ge=0,
        description="The price of writing a token to the prompt cache of BREAKPOINT_MODELS, "
        "as a share of an input token's (cost policy, and the ledger's prices of those "
        "models when CTXPROXY_PRICES gives no write price).",
    )
    trim_slack: int = Field(
        5,
        ge=0,
        description="Fixed policy: let the history grow this many turns past KEEP_TURNS before "
        "cutting back (fewer prefix changes, warmer provider cache); 0 cuts on every turn.",
    )
    trim_at_tokens: int = Field(
        0,
        ge=0,
        description="Fixed policy: cut back to KEEP_TURNS when the forwarded input passes about "
        "this many tokens (estimated from bytes), instead of counting turns; 0: off.",
    )
    mask_tool_outputs: bool = Field(
        True,
        description="At each cut, shorten the tool outputs of the older kept turns to a head "
        "and tail (the calls stay; the newest turn is never masked): those turns are read "
        "uncached at a cut anyway.",
    )
    mask_keep_chars: int = Field(
        1000, ge=0, description="Characters a masked tool output keeps (half head, half tail)."
    )
    mask_fetch_mb: float = Field(
        64.0, ge=0,
        description="MiB of masked tool outputs each process keeps whole (least recently "
        "used out first) for the curl line in the mask's note, which fetches one back for the "
        "same session and scope; 0: no curl line.",
    )

    mask_store_mb: float = Field(
        32.0, ge=0,
        description="MiB of masked tool outputs the store keeps per scope (service, team, "
        "agent, user; the oldest out first), redacted, so that any replica or worker answers "
        "a fetch line, and after a restart: in PostgreSQL under STORE_URL, else in "
        "outputs.sqlite3 in the data dir; 0: only each process's own (MASK_FETCH_MB).",
    )
    mask_store_hours: float = Field(
        24.0, gt=0, description="How long the store keeps a masked tool output."
    )

    # --- identity ------------------------------------------------------------------------
    team_id: str | None = Field(None, description="Team when the request has no x-team-id.")
    agent_id: str | None = Field(None, description="Agent when the request has no x-agent-id.")
    user_key: SecretStr | None = Field(
        None, description="User key when the request has no x-tdai-user-key (never forwarded)."
    )
    service_id: str = Field(
        "default", pattern=SERVICE_ID_PATTERN, description="Tenant id sent to the core."
    )

    # --- knowledge -----------------------------------------------------------------------
    core_url: str | None = Field(None, description="Core service URL; unset: the embedded core.")
    core_token: SecretStr | None = Field(None, description="Bearer token for the core service.")
    core_timeout_ms: int = Field(1500, gt=0, description="Timeout of one core call.")
    knowledge_ttl_s: float = Field(
        300.0, ge=0,
        description="How long discovery results are kept. A remote core's changes show "
        "within it; the embedded core's (`ctxproxy knowledge ...`) on the next request. Under "
        "STORE_URL every replica hears of a change at once (PostgreSQL NOTIFY: a `ctxproxy "
        "knowledge` command, or `ctxproxy knowledge changed` after a remote core's).",
    )
    capability_ttl_s: float = Field(
        3600.0, gt=0,
        description="How often the capability tokens in the <knowledge_tools> curl lines "
        "rotate (a token is accepted for up to twice this). Each rotation changes the block, "
        "so the prompt cache is rebuilt once per rotation.",
    )
    knowledge_negative_ttl_s: float = Field(
        30.0, ge=0, description="How long a failed discovery is remembered before retrying."
    )

    # --- memory --------------------------------------------------------------------------
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Where the SQLite stores (memory, request rows), the embedded core's "
        "catalogue and the outputs key live; printed at start and by `ctxproxy doctor`."
    )
    store_url: str | None = Field(
        None, description="postgresql://... to share memory between replicas; unset: SQLite."
    )
    memory_enabled: bool = Field(True, description="Store and recall typed memory.")
    chat_memory_asset: bool = Field(
        True,
        description="With memory on and a team, list the caller's own memory in "
        "<knowledge_tools> as the chat_memory-{team}-{agent} asset (tools: search, read, "
        "recent), for the model to pull from.",
    )
    working_ttl_s: float = Field(1800.0, gt=0, description="Sliding TTL of working memory.")
    semantic_threshold: float = Field(
        0.75, ge=0, le=1, description="Score a distilled fact needs to become semantic memory."
    )
    distill_interval_s: float = Field(5.0, gt=0, description="Distillation period.")
    recall_k: int = Field(5, ge=0, description="Memories recalled per turn at most.")
    recall_min_score: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Share of the question's words that one line of a memory (with the "
        "command that printed it) must hold for it to be recalled; a turn with no such "
        "memory gets no recall block (0: recall the best matches whatever they share).",
    )
    recall_elsewhere_min_score: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Share of the whole prompt's words (not of one question in a long "
        "prompt) one line of an earlier turn of another session must hold to be recalled "
        "(a memory named by id aside): a new task's prompt shares some words with any earlier "
        "task's turn by chance, and a block that shows it costs tokens on every request.",
    )
    memory_tokens: int = Field(1200, ge=0, description="Token budget of the memory blocks.")
    memory_placement: Literal["split", "instructions"] = Field(
        "split",
        description="split: slow blocks in a message before the first forwarded turn (changed "
        "only by a cut), each turn's recall before its own prompt (kept there while the turn "
        "is in the window; for Anthropic Messages the slow blocks and the cut's digest are "
        "one block at the end of system); instructions: everything in instructions.",
    )
    weight_working: float = Field(1.5, ge=0, description="Recall weight of working memory.")
    weight_episodic: float = Field(1.0, ge=0, description="Recall weight of episodic memory.")
    weight_semantic: float = Field(0.8, ge=0, description="Recall weight of semantic memory.")
    memory_timeout_ms: int = Field(
        1000, gt=0,
        description="The most a request waits for memory before going without it (and uncut); "
        "its answer, once the upstream accepted it, waits at most this long for the turn's "
        "working-memory write.",
    )
    memory_process: bool = Field(
        True,
        description="Store episodes and parse claims in a child process of each worker, at the "
        "lowest priority, and run the SQLite store's searches in 2 processes of each worker's "
        "own (off: in threads of the worker, whose event loop then waits for the GIL while they "
        "work).",
    )
    ingest_queue_size: int = Field(1000, gt=0, description="Pending memory writes at most.")
    ingest_queue_mb: float = Field(
        256.0, gt=0,
        description="MiB of pending memory writes at most (each estimated by the request it "
        "came with); a write over it is refused and counted, and the session's next request "
        "derives it again.",
    )

    # --- embeddings (hybrid recall) ------------------------------------------------------
    embeddings_url: str | None = Field(
        None,
        description="Base URL of an OpenAI-compatible embeddings API (POST URL/embeddings: "
        "OpenAI, Ollama, vLLM, llama.cpp, TEI); unset: recall stays lexical.",
    )
    embeddings_model: str = Field(
        "text-embedding-3-small", description="The embedding model asked for."
    )
    embeddings_api_key: SecretStr | None = Field(
        None, description="Bearer key for the embeddings API; unset: none is sent."
    )
    embeddings_timeout_ms: int = Field(
        300, gt=0,
        description="How long a turn waits for its question's embedding before recalling "
        "lexically (ingest batches get ten times this).",
    )
    embeddings_batch: int = Field(
        32, ge=1, le=2048, description="Texts per embeddings call at ingest and reindex."
    )
    embeddings_min_similarity: float = Field(
        0.25, ge=-1, le=1,
        description="Cosine similarity a memory found by its meaning but not by the "
        "question's words (RECALL_MIN_SCORE) needs to be recalled; model-dependent. Chosen "
        "with all-MiniLM-L6-v2 (bench/RESULTS.md, Hybrid recall): the most facts recalled on "
        "bench/paraphrases.py's derive set among the gates that keep bench.economics at or "
        "under the cost of going direct at every length. With that model the scores of facts "
        "and of the nearest memories to questions whose answer is in none overlap (the same "
        "section): no gate keeps that noise out without losing facts.",
    )

    memory_pgvector: bool = Field(
        True,
        description="On PostgreSQL: search vectors in the database with pgvector (an HNSW "
        "index) when it has the `vector` extension or this role may create it. Off: every "
        "process keeps its copy of the scopes' vectors (VECTOR_CACHE_MB) and never alters "
        "the schema for pgvector.",
    )
    vector_cache_mb: float = Field(
        256.0, gt=0,
        description="MiB of memory vectors each process holds for the exact search, loaded "
        "per scope on its first search; past it the least recently searched scopes are "
        "dropped (and read again from the store when searched). One scope larger than it "
        "is still held, alone.",
    )

    # --- stats: the request ledger (ctxproxy stats, /ui) -------------------------------------
    stats_enabled: bool = Field(
        True,
        description="Keep a row of numbers per /v1/responses request (tokens, cuts, recalls, "
        "no prompt text) in the store, for `ctxproxy stats` and /ui.",
    )
    stats_process: bool = Field(
        True,
        description="Count the rows' tokens in a child process of each worker, at the lowest "
        "priority (off: in a thread of the worker, whose event loop then waits for the GIL "
        "while it counts).",
    )
    stats_retention_days: float = Field(
        30.0, ge=0, description="Days the request rows are kept; 0: kept for ever."
    )
    prices: str | None = Field(
        None,
        description="Model prices for the cost estimates, USD per 1M tokens, on top of the "
        "built-in table: model=input/cached[/cache-write],... (e.g. gpt-5=1.25/0.125).",
    )

    capture_dir: Path | None = Field(
        None,
        description="Debugging: write each forwarded /v1/responses body here, secrets "
        "redacted (one JSON file a request); unset: off.",
    )

    @field_validator("upstream_url", "anthropic_url", "chat_url", "core_url", "public_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("embeddings_url")
    @classmethod
    def _embeddings_url(cls, value: str | None) -> str | None:
        if not value:  # set but empty means unset: recall stays lexical
            return None
        return cls._http_url(value)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers_auto(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("auto", "0"):
            value = 0
        if value == 0:
            # The CPUs this process may run on (a cpuset), not every CPU of the host.
            return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
                os.cpu_count() or 1)
        return value

    @field_validator("store_url")
    @classmethod
    def _store_scheme(cls, value: str | None) -> str | None:
        if not value:  # CTXPROXY_STORE_URL= (set but empty) means unset: the local SQLite store
            return None
        if not value.startswith(STORE_SCHEMES):
            # Falling back to SQLite would quietly stop replicas sharing memory.
            raise ValueError(
                "must start with postgresql:// or postgres:// (unset: the local SQLite store)"
            )
        return value

    @field_validator("prices")
    @classmethod
    def _prices_format(cls, value: str | None) -> str | None:
        for entry in (e.strip() for e in (value or "").split(",")):
            if entry and not _PRICE.match(entry):
                raise ValueError(f"{entry!r} is not model=input/cached[/cache-write]")
        return value or None

    @field_validator("breakpoint_models")
    @classmethod
    def _model_pattern(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @field_validator("passthrough")
    @classmethod
    def _routes_format(cls, value: str | None) -> str | None:
        for entry in (e.strip() for e in (value or "").split(",")):
            if entry and not _ROUTE.match(entry):
                raise ValueError(f"{entry!r} is not 'METHOD /path' (METHOD or * ; a trailing * "
                                 "in the path for a prefix)")
        return value or None

    @field_validator("client_keys")
    @classmethod
    def _keys_file_exists(cls, value: str | None) -> str | None:
        if value and value.startswith("@") and not Path(value[1:]).is_file():
            raise ValueError(f"no such file: {value[1:]}")
        return value

    @model_validator(mode="after")
    def _client_keys_need_an_upstream_key(self) -> Settings:
        if self.client_keys and self.upstream_api_key is None:
            raise ValueError(
                "CTXPROXY_CLIENT_KEYS needs CTXPROXY_UPSTREAM_API_KEY (client keys are never "
                "forwarded upstream)"
            )
        if self.client_keys and self.chat_url and self.chat_api_key is None:
            raise ValueError(
                "CTXPROXY_CLIENT_KEYS with CTXPROXY_CHAT_URL needs CTXPROXY_CHAT_API_KEY (client "
                "keys are never forwarded upstream)"
            )
        return self

    def follows_breakpoints(self, model: object) -> bool:
        """Whether ``model`` (a request's ``model``) caches only at breakpoints."""
        pattern = _pattern(self.breakpoint_models)
        return isinstance(model, str) and pattern.fullmatch(model) is not None

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    @property
    def reachable_url(self) -> str:
        """The base URL the model can curl (embedded knowledge service)."""
        if self.public_url:
            return self.public_url
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"


@functools.lru_cache(maxsize=8)
def _pattern(value: str) -> re.Pattern[str]:
    # Empty: no model (not the empty name).
    return re.compile(value or r"(?!)")


def load_settings(env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Build Settings from ``env`` (default: the process environment) plus overrides.

    Raises SettingsError naming the first bad variable.
    """
    source = os.environ if env is None else env
    values: dict[str, object] = {
        name: source[ENV_PREFIX + name.upper()]
        for name in Settings.model_fields
        if ENV_PREFIX + name.upper() in source
    }
    values.update(overrides)
    try:
        # Values are passed explicitly so that tests never read the developer's environment.
        return Settings.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        if not err["loc"]:  # a rule across settings: its message names them
            raise SettingsError(str(err["msg"]).removeprefix("Value error, ")) from exc
        name = ENV_PREFIX + str(err["loc"][0]).upper()
        raise SettingsError(f"{name}: {str(err['msg']).removeprefix('Value error, ')}") from exc


def unknown_settings(env: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """(variable, closest known variable or None) for each ``CTXPROXY_*`` that is no setting.

    Unknown variables are ignored, so a misspelled one would pass silently: start-up warns.
    """
    source = os.environ if env is None else env
    known = [name.upper() for name in Settings.model_fields]
    found = []
    for name in sorted(source):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper.startswith(NOT_SETTINGS_PREFIXES):
            continue
        if name.removeprefix(ENV_PREFIX) not in known:
            # Compared without the prefix, which every name shares and would make all close.
            close = difflib.get_close_matches(upper.removeprefix(ENV_PREFIX), known, n=1)
            found.append((name, ENV_PREFIX + close[0] if close else None))
    return found


def describe_settings() -> list[tuple[str, str, str]]:
    """(env var, default, description) for every setting, for ``--help``."""
    rows = []
    for name, field in Settings.model_fields.items():
        if field.default_factory is not None:
            default = "$XDG_DATA_HOME/ctxproxy, else ~/.local/share/ctxproxy"
        elif field.default is None:
            default = "unset"
        else:
            default = str(field.default)
        rows.append((ENV_PREFIX + name.upper(), default, field.description or ""))
    return rows
