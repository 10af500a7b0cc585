# The server image: one image, one `ldp` entry point; docker-compose.yml picks the sub-command
# (collector, shuffler, estimator, sink) per service.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    LDP_METRICS=/app/metrics/example.json

WORKDIR /app
COPY pyproject.toml README.md ./
COPY client_sdk ./client_sdk
COPY pipeline ./pipeline
COPY collector ./collector
COPY estimator ./estimator
COPY simulator ./simulator
COPY ldp_cli ./ldp_cli
COPY metrics ./metrics

RUN pip install --no-cache-dir ".[server]" \
 && useradd --system --uid 10001 --home-dir /data ldp \
 && mkdir -p /data/collector /data/estimator /data/dataset && chown -R ldp /data

USER ldp
VOLUME /data
EXPOSE 8080 8090
ENTRYPOINT ["ldp"]
CMD ["--help"]
