# The image the Helm chart runs (charts/nodegate: `nodegate serve`, and python3 for its ca-init
# container), for builders with a registry; build it with
#   docker build --build-arg REVISION=$(git rev-parse HEAD) -t ghcr.io/nodegate/nodegate:0.1.0 .
# `make image` builds the same layout from Debian's packages alone, reproducibly (scripts/image/,
# docs/operations.md); that is the image CI builds and starts (tests/image/).
# Two stages: tpm2-pytss builds against libtss2-dev in the first, the second carries only the
# runtime libraries. The service needs no TPM (it verifies; nodes run `nodegate join`), but the
# package imports tpm2-pytss for the node commands, so libtss2 is present.

FROM python:3.11-slim-bookworm AS build
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      build-essential pkg-config libtss2-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The lock `make image` installs (uv.lock, through scripts/lockfile.py and the uv it pins by hash):
# the same versions and hashes, not whatever the ranges resolve to today.
COPY pyproject.toml uv.lock README.md ./
COPY tools/uv/requirements.txt tools/uv/requirements.txt
COPY scripts/lockfile.py scripts/lockfile.py
RUN python -m venv /opt/nodegate \
 && python scripts/lockfile.py export pip > /tmp/pip.txt \
 && python scripts/lockfile.py export runtime > /tmp/runtime.txt \
 && python scripts/lockfile.py export build > /tmp/build.txt \
 && /opt/nodegate/bin/pip install --no-cache-dir --require-hashes -r /tmp/pip.txt \
 && /opt/nodegate/bin/pip install --no-cache-dir --require-hashes --build-constraint /tmp/build.txt -r /tmp/runtime.txt
COPY attest attest
COPY admission admission
COPY bootstrap bootstrap
# --no-deps: every dependency came from the lock above; the wheel stays in the image for nodes
RUN /opt/nodegate/bin/pip wheel --no-cache-dir --no-deps --build-constraint /tmp/build.txt -w /opt/nodegate/wheels . \
 && /opt/nodegate/bin/pip install --no-cache-dir --no-deps /opt/nodegate/wheels/nodegate-*.whl \
 && python scripts/lockfile.py node-requirements /opt/nodegate/wheels/nodegate-*.whl \
 && /opt/nodegate/bin/pip check
# The vendor EK roots (`ek_roots: [vendors]`): the certificate folder of Debian's
# ruby-tpm-key-attestation, unpacked from its .deb (no Ruby) and checked file by file against
# bootstrap/service/join/vendorroots.py, as scripts/image/build.py does for `make image`.
RUN apt-get update -qq && cd /tmp \
 && apt-get download -q "ruby-tpm-key-attestation=$(/opt/nodegate/bin/python -c 'from bootstrap.service.join import vendorroots as v; print(v.VERSION)')" \
 && dpkg-deb -x ruby-tpm-key-attestation_*.deb /tmp/ek \
 && /opt/nodegate/bin/python -c 'import sys; from pathlib import Path; from bootstrap.service.join import vendorroots as v; src = Path("/tmp/ek") / v.PACKAGE_DIR; [v.check_file(src, f) for f in v.FILES]; sys.exit(1 if v.unlisted(src) else 0)' \
 && mkdir -p /usr/share/nodegate /usr/share/doc/ruby-tpm-key-attestation \
 && cp -r /tmp/ek/usr/share/rubygems-integration/all/gems/tpm-key_attestation-*/lib/tpm/certificates /usr/share/nodegate/ek-roots \
 && cp /tmp/ek/usr/share/doc/ruby-tpm-key-attestation/copyright /usr/share/doc/ruby-tpm-key-attestation/ \
 && rm -rf /tmp/ek /tmp/*.deb /var/lib/apt/lists/*

FROM python:3.11-slim-bookworm
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="nodegate" \
      org.opencontainers.image.description="TPM-attested node bootstrap, hold gate and package admission" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libtss2-esys-3.0.2-0 libtss2-mu0 libtss2-sys1 libtss2-tctildr0 libtss2-tcti-device0 \
      libtss2-rc0 libtss2-fapi1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/nodegate /opt/nodegate
COPY --from=build /usr/share/nodegate /usr/share/nodegate
COPY --from=build /usr/share/doc/ruby-tpm-key-attestation /usr/share/doc/ruby-tpm-key-attestation
# python3 on PATH is the venv's, so the chart's `python3 ca-init.py` sees the installed package.
ENV PATH=/opt/nodegate/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# The chart runs as 65532 with a read-only root filesystem; state lives on mounted volumes.
USER 65532:65532
ENTRYPOINT ["nodegate"]
CMD ["serve", "--config", "/etc/nodegate/config.yaml"]
