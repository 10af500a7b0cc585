# The server image: one image, one `ldp` entry point; docker-compose.yml picks the sub-command
# (collector, shuffler, estimator, sink) per service.

# The Rust extensions the services use in production, built as wheels: the native upload front the collector
# serves its device-facing port with (`--front native`, docs/COLLECTOR.md) and the compiled batch opener of
# sealed reports (docs/SEALED.md). Only the wheels reach the image below.
FROM python:3.11-slim AS native
RUN apt-get update && apt-get install -y --no-install-recommends curl ca-certificates build-essential cmake \
 && curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal \
 && pip install --no-cache-dir "maturin>=1.16,<2"
ENV PATH=/root/.cargo/bin:$PATH
COPY native/front /src/front
COPY native/opener /src/opener
RUN maturin build --release --locked -m /src/front/Cargo.toml -o /wheels \
 && maturin build --release --locked -m /src/opener/Cargo.toml -o /wheels

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    LDP_METRICS=/app/metrics/example.json

WORKDIR /app
COPY pyproject.toml README.md ./
COPY ldp_core ./ldp_core
COPY client_sdk ./client_sdk
COPY pipeline ./pipeline
COPY collector ./collector
COPY estimator ./estimator
COPY simulator ./simulator
COPY ldp_cli ./ldp_cli
COPY metrics ./metrics

COPY --from=native /wheels /tmp/wheels
RUN pip install --no-cache-dir ".[server]" /tmp/wheels/*.whl && rm -rf /tmp/wheels \
 && useradd --system --uid 10001 --home-dir /data ldp \
 && mkdir -p /data/collector /data/estimator /data/dataset && chown -R ldp /data

USER ldp
VOLUME /data
EXPOSE 8080 8090
ENTRYPOINT ["ldp"]
CMD ["--help"]
