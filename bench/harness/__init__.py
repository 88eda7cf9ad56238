"""What the benchmarks share: the request and answer they send (``session``, ``upstream``,
``naive``, ``small_codex``, ``hostile``), the Codex client and the pricing upstream of the
replays (``codex``, ``pricing``, ``proxy_settings``), serving apps in process (``serving``) and
as processes (``processes``), the latency client (``client``), a PostgreSQL schema
(``postgres``), the ledger's reference measure (``ledger_reference``), the facts of a run
(``machine``) and writing its block of bench/RESULTS.md (``results``). A benchmark imports
these, never another benchmark's private names."""
