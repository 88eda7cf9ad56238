# Sourced by `make test`: makes sure a PostgreSQL server, the Codex CLI and Claude Code are
# there, and exports CTXPROXY_TEST_PG_URL, CTXPROXY_TEST_CODEX and CTXPROXY_TEST_CLAUDE for the
# tests, and that Chromium is there for the dashboard's browser test. Installs from the package
# registries on first use (Debian's postgresql, chromium and chromium-driver; npm's
# @openai/codex and @anthropic-ai/claude-code).

_ctx_root=$(pwd)
_codex_version=${CODEX_VERSION:-0.169.0}
_claude_version=${CLAUDE_VERSION:-2.1.328}

_ctx_pg() {
    if [ -n "${CTXPROXY_TEST_PG_URL:-}" ]; then return 0; fi
    if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(ls /usr/lib/postgresql 2>/dev/null)" ]; then
        echo "services: installing PostgreSQL (apt-get)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null || return 1
    fi
    local ver
    ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
    if ! pg_lsclusters -h 2>/dev/null | grep -q "^$ver main"; then
        pg_createcluster "$ver" main >/dev/null || return 1
    fi
    if ! pg_lsclusters -h | grep -q "^$ver main .* online"; then
        pg_ctlcluster "$ver" main start || return 1
    fi
    local port
    port=$(pg_lsclusters -h | awk -v v="$ver" '$1==v && $2=="main" {print $3}')
    su postgres -c "psql -q -p $port -tc \"SELECT 1 FROM pg_roles WHERE rolname='ctxproxy'\"" | grep -q 1 ||
        su postgres -c "psql -q -p $port -c \"CREATE ROLE ctxproxy LOGIN SUPERUSER PASSWORD 'ctxproxy'\"" >/dev/null
    su postgres -c "psql -q -p $port -tc \"SELECT 1 FROM pg_database WHERE datname='ctxproxy_test'\"" | grep -q 1 ||
        su postgres -c "createdb -p $port -O ctxproxy ctxproxy_test"
    export CTXPROXY_TEST_PG_URL="postgresql://ctxproxy:ctxproxy@127.0.0.1:$port/ctxproxy_test"
}

_ctx_codex() {
    if [ -n "${CTXPROXY_TEST_CODEX:-}" ]; then return 0; fi
    local dir="$_ctx_root/.cache/codex-$_codex_version"
    if [ ! -x "$dir/node_modules/.bin/codex" ]; then
        echo "services: installing @openai/codex@$_codex_version (npm)" >&2
        mkdir -p "$dir" && npm install --silent --no-audit --no-fund --prefix "$dir" "@openai/codex@$_codex_version" >/dev/null || return 1
    fi
    export CTXPROXY_TEST_CODEX="$dir/node_modules/.bin/codex"
}

_ctx_claude() {
    if [ -n "${CTXPROXY_TEST_CLAUDE:-}" ]; then return 0; fi
    local dir="$_ctx_root/.cache/claude-code-$_claude_version"
    if [ ! -x "$dir/node_modules/.bin/claude" ]; then
        echo "services: installing @anthropic-ai/claude-code@$_claude_version (npm)" >&2
        mkdir -p "$dir" && npm install --silent --no-audit --no-fund --prefix "$dir" "@anthropic-ai/claude-code@$_claude_version" >/dev/null || return 1
    fi
    export CTXPROXY_TEST_CLAUDE="$dir/node_modules/.bin/claude"
}

_ctx_chromium() {
    # The dashboard's browser test drives Debian's Chromium through chromedriver.
    if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
        return 0
    fi
    echo "services: installing Chromium and chromedriver (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
}

_ctx_pg || echo "services: PostgreSQL could not be started" >&2
_ctx_codex || echo "services: the Codex CLI could not be installed" >&2
_ctx_claude || echo "services: Claude Code could not be installed" >&2
_ctx_chromium || echo "services: Chromium could not be installed" >&2
