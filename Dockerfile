# syntax=docker/dockerfile:1
# --- build: install ctxproxy and its dependencies into a virtualenv ----------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/ctxproxy
WORKDIR /src
COPY pyproject.toml README.md ./
COPY config config
COPY proxy proxy
COPY injectors injectors
COPY knowledge knowledge
COPY memory memory
RUN /opt/ctxproxy/bin/pip install .
# Bake the tokenizer files in, so the container never downloads at run time.
ENV TIKTOKEN_CACHE_DIR=/opt/ctxproxy/tiktoken
RUN mkdir -p "$TIKTOKEN_CACHE_DIR" && \
    /opt/ctxproxy/bin/python -c "import tiktoken; tiktoken.get_encoding('o200k_base')" || \
    echo "o200k_base not fetched at build time; the bundled cl100k_base fallback is used"

# --- run: slim, non-root ----------------------------------------------------------------------
FROM python:3.11-slim
RUN useradd --create-home --uid 10001 ctxproxy
COPY --from=build /opt/ctxproxy /opt/ctxproxy
ENV PATH=/opt/ctxproxy/bin:$PATH \
    TIKTOKEN_CACHE_DIR=/opt/ctxproxy/tiktoken \
    CTXPROXY_HOST=0.0.0.0 \
    CTXPROXY_PORT=8787 \
    CTXPROXY_DATA_DIR=/data
RUN mkdir -p /data && chown ctxproxy /data
USER ctxproxy
VOLUME ["/data"]
EXPOSE 8787
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=2)" || exit 1
ENTRYPOINT ["ctxproxy"]
CMD ["serve"]
