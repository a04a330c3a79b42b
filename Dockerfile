# syntax=docker/dockerfile:1
# The Acurio analysis queue: `queue-service serve` as a non-root user, with a gRPC health probe.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY queue_service ./queue_service
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --upgrade pip \
 && /opt/venv/bin/pip install .

FROM golang:1.24-bookworm AS probe
RUN CGO_ENABLED=0 go install github.com/grpc-ecosystem/grpc-health-probe@v0.4.39

FROM python:3.11-slim
RUN groupadd --system --gid 10001 queue && useradd --system --uid 10001 --gid queue --no-create-home queue
COPY --from=build /opt/venv /opt/venv
COPY --from=probe /go/bin/grpc-health-probe /usr/local/bin/grpc-health-probe
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    QUEUE_LISTEN_ADDR=0.0.0.0:50051 \
    QUEUE_LOG_FORMAT=json
USER 10001:10001
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["grpc-health-probe", "-addr=127.0.0.1:50051"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["queue-service"]
CMD ["serve"]
