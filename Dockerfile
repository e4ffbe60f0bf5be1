# syntax=docker/dockerfile:1
# The livefit image: one image for the learner (`serve`) and the replicas (`replica`).
#
#   docker build -t livefit .                                                   # CPU
#   docker build -t livefit:gpu --build-arg TF_PACKAGE='tensorflow[and-cuda]' .  # NVIDIA GPU
#
# TF_PACKAGE is installed in the same pip resolve as livefit, so pyproject.toml's TensorFlow
# version range still applies; "tensorflow[and-cuda]" adds the CUDA and cuDNN wheels, so the host
# needs only the NVIDIA driver and the NVIDIA Container Toolkit (see deploy/README.md).
# BASE_IMAGE: any Debian-based image with Python >= 3.11; pinned to a patch release (compose too).
ARG BASE_IMAGE=python:3.11.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG TF_PACKAGE=tensorflow
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/livefit
WORKDIR /src
# Only what `pip install .` reads (the package-dir mapping of pyproject.toml), so editing tests or
# deploy files does not invalidate this layer.
COPY pyproject.toml README.md ./
COPY livefit/ livefit/
COPY server/ server/
COPY models/ models/
COPY clients/ clients/
RUN /opt/livefit/bin/pip install . "${TF_PACKAGE}"

FROM ${BASE_IMAGE}
ENV PATH=/opt/livefit/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TF_CPP_MIN_LOG_LEVEL=2
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/livefit livefit \
    && mkdir -p /var/lib/livefit /etc/livefit \
    && chown livefit:livefit /var/lib/livefit
COPY --from=build /opt/livefit /opt/livefit
# A named volume mounted here starts as a copy of this directory, owned by livefit.
VOLUME ["/var/lib/livefit"]
USER livefit
WORKDIR /var/lib/livefit
EXPOSE 8000
# No curl in the slim image; LIVEFIT_HTTP__PORT is the same override livefit itself reads.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('LIVEFIT_HTTP__PORT', '8000') + '/v2/health/live', timeout=4)"]
ENTRYPOINT ["livefit"]
CMD ["serve", "--config", "/etc/livefit/livefit.toml"]
