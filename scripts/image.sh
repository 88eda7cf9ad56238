#!/usr/bin/env bash
# Build the container image and check it runs, on a machine with no container registry:
# the base is made from Debian's packages (debootstrap, then podman import), the build runs
# with chroot isolation (crun cannot create containers here: cgroups in hybrid mode), and the
# image is started with `buildah run --isolation=chroot` (`podman run` fails on
# setrlimit RLIMIT_NPROC in this sandbox). Checks /healthz, /readyz and one proxied request
# against a fake upstream on the host. Needs root and Debian's package mirror.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${IMAGE_WORK:-/tmp/ctxproxy-image}
store=(--storage-driver=vfs)
base=localhost/ctxproxy-base:bookworm
image=localhost/ctxproxy:check
port=${IMAGE_PORT:-18787}
up_port=$((port + 1))
mkdir -p "$work"

need=()
for tool in podman buildah debootstrap curl; do command -v $tool >/dev/null || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! podman "${store[@]}" image exists $base; then
    echo "image: making a Debian bookworm base with python3-venv (debootstrap)" >&2
    rm -rf "$work/root" && mkdir -p "$work"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
        "$work/root" http://deb.debian.org/debian >"$work/debootstrap.log"
    rm -rf "$work/root/var/cache/apt/archives/"*.deb
    tar -C "$work/root" -c . | podman "${store[@]}" import - $base >/dev/null
fi

echo "image: building $image" >&2
# The host's CA bundle, for pip behind this machine's TLS setup (read-only, build time only).
podman "${store[@]}" build --isolation=chroot --network=host -v /etc/ssl/certs:/etc/ssl/certs:ro \
    --build-arg BASE=$base -t $image . >"$work/build.log"

echo "image: starting it against a fake upstream on the host" >&2
.venv/bin/python - "$up_port" <<'PY' &
import asyncio, sys
from aiohttp import web
from tests.fakes.upstream import FakeUpstream
async def main() -> None:
    runner = web.AppRunner(FakeUpstream().app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", int(sys.argv[1])).start()
    await asyncio.sleep(120)
asyncio.run(main())
PY
fake=$!
ctr=$(buildah "${store[@]}" from $image)
buildah "${store[@]}" run --isolation=chroot --network=host -e CTXPROXY_PORT=$port \
    -e CTXPROXY_UPSTREAM_URL=http://127.0.0.1:$up_port/v1 "$ctr" -- ctxproxy serve \
    >"$work/run.log" 2>&1 &
proxy=$!
cleanup() { kill $proxy $fake 2>/dev/null || true; buildah "${store[@]}" rm "$ctr" >/dev/null 2>&1 || true; }
trap cleanup EXIT
for _ in $(seq 1 60); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.5; done
curl -sf "http://127.0.0.1:$port/healthz" | grep -q '"ok"'
curl -sf "http://127.0.0.1:$port/readyz" | grep -q 'true'
answer=$(curl -sf -X POST "http://127.0.0.1:$port/v1/responses" -H 'content-type: application/json' \
    -H 'session-id: image-check' \
    -d '{"model":"gpt-5","stream":true,"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}]}]}')
grep -q "response.completed" <<<"$answer"
echo "image: ok: /healthz, /readyz and a proxied request answered by $image" >&2
