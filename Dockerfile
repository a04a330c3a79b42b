# The Acurio analysis queue: `queue-service serve` as a non-root user, health-checked by
# `queue-service probe` (grpc.health.v1, so no separate probe binary).
#
# The base is Debian bookworm made from Debian's own packages (python3, python3-venv,
# ca-certificates) with mmdebstrap and `docker import`: no registry image is needed.
# `deploy/build-image` makes the base when it is missing, then builds, runs and checks this image.
# No init process: `queue-service` handles SIGTERM itself as PID 1 and starts no children.
ARG BASE_IMAGE=acurio-queue-base:bookworm

FROM ${BASE_IMAGE} AS build
# PEM certificates the build machine needs to reach the package index (a TLS-inspecting proxy);
# used by this stage only, never part of the final image.
ARG EXTRA_CA_PEM=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The dependencies, pip and the build backend come from the hash-locked requirements.lock
# (deploy/lock-dependencies writes it): exact versions, each file checked against its hash,
# nothing unpinned fetched. The project itself then goes in without resolving anything.
COPY requirements.lock pyproject.toml README.md ./
COPY queue_service ./queue_service
RUN if [ -n "$EXTRA_CA_PEM" ]; then \
      cat /etc/ssl/certs/ca-certificates.crt > /tmp/ca.pem && printf '%s\n' "$EXTRA_CA_PEM" >> /tmp/ca.pem \
      && export PIP_CERT=/tmp/ca.pem; \
    fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --quiet --require-hashes -r requirements.lock \
 && /opt/venv/bin/pip install --quiet --no-deps --no-build-isolation . \
 && /opt/venv/bin/pip check \
 && rm -f /tmp/ca.pem

FROM ${BASE_IMAGE}
RUN echo 'queue:x:10001:10001:acurio queue:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'queue:x:10001:' >> /etc/group
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    QUEUE_LISTEN_ADDR=0.0.0.0:50051 \
    QUEUE_LOG_FORMAT=json
USER 10001:10001
# 50051: gRPC. 8080: the web console and the Connect / gRPC-Web endpoint, served when
# QUEUE_HTTP_ADDR is set (compose and deploy/k8s set 0.0.0.0:8080).
EXPOSE 50051 8080
# The probe reads QUEUE_LISTEN_ADDR (a wildcard host is checked on 127.0.0.1).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 CMD ["queue-service", "probe"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["queue-service"]
CMD ["serve"]
