# syntax=docker/dockerfile:1
# BASE: any image with Python 3.11+ and its venv module at python3 (python:3.11-slim, or a
# Debian bookworm root with python3-venv where no registry can be reached; scripts/image.sh).
ARG BASE=python:3.11-slim

# --- build: install ctxproxy and its dependencies into a virtualenv ----------------------------
FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/ctxproxy
WORKDIR /src
COPY pyproject.toml README.md ./
# The one package, ctxproxy (its entries link to the folders below), and every folder it links
# to (tests/test_image.py checks none is left out).
COPY ctxproxy ctxproxy
COPY config config
COPY request request
COPY injectors injectors
COPY plumbing plumbing
COPY window window
COPY knowledge knowledge
COPY memory memory
COPY ledger ledger
COPY proxy proxy
RUN /opt/ctxproxy/bin/pip install .
# Bake the tokenizer files in, so the container never downloads at run time.
# hadolint ignore=DL3064
ENV TIKTOKEN_CACHE_DIR=/opt/ctxproxy/tiktoken
RUN mkdir -p "$TIKTOKEN_CACHE_DIR" && \
    /opt/ctxproxy/bin/python -c "import tiktoken; tiktoken.get_encoding('o200k_base')" || \
    echo "o200k_base not fetched at build time; the bundled cl100k_base fallback is used"

# --- run: slim, non-root ----------------------------------------------------------------------
FROM ${BASE}
RUN useradd --create-home --uid 10001 ctxproxy
COPY --from=build /opt/ctxproxy /opt/ctxproxy
# hadolint ignore=DL3064
ENV PATH=/opt/ctxproxy/bin:$PATH \
    TIKTOKEN_CACHE_DIR=/opt/ctxproxy/tiktoken \
    CTXPROXY_HOST=0.0.0.0 \
    CTXPROXY_PORT=8787 \
    CTXPROXY_DATA_DIR=/data
RUN mkdir -p /data && chown ctxproxy /data
USER 10001
VOLUME ["/data"]
EXPOSE 8787
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=2)"]
ENTRYPOINT ["ctxproxy"]
CMD ["serve"]
