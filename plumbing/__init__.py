"""Plumbing the sides share: a PostgreSQL pool whose schema is migrated under an advisory
lock, an SQLite file's set-up (owner-only, WAL, pragmas, ``user_version`` migrations,
immediate write transactions), and a least-recently-used map bounded by entries and bytes.
Below the sides (memory, ledger, knowledge) and above the rendering: it knows no side's
records, only connections, files and bounds."""
