# Caramel's one image: the operator (the default command) and the worker runtime.
#
#   scripts/build-image.sh      # here: no image can be pulled, so the base is made locally with
#                               # debootstrap (scripts/build-base-image.sh) and passed as BASE_IMAGE
#   docker build --build-arg BASE_IMAGE=python:3.11-slim-bookworm -t caramel:0.1.0 .   # elsewhere
#
# Any Debian bookworm based image works as the base: it needs Python 3.11 (bookworm's python3),
# which is installed with apt when the base has none. No BuildKit-only syntax: the legacy builder,
# all that Debian's docker.io has, builds it too.

ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS base
ENV DEBIAN_FRONTEND=noninteractive
RUN if ! command -v python3 >/dev/null || ! python3 -c "import ensurepip, venv" 2>/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -c "import sys; assert sys.version_info[:2] == (3, 11), 'Caramel needs Python 3.11, the base has ' + sys.version"

# Every version pin is read from pyproject.toml, the one place they are written, into a pip
# constraints file. Only its dependency list is copied onward, so editing other parts of
# pyproject.toml keeps the cached Horovod build.
FROM base AS pins
COPY pyproject.toml /tmp/
RUN python3 -c "import tomllib; print(*tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
    > /constraints.txt

# Horovod ships only as source and compiles against one TensorFlow ABI, so its wheel is built here
# against the pinned TensorFlow, with the patch that lets it build against TensorFlow 2.19+, by the
# script `make setup` runs. cmake comes from apt: the cmake 4 wheel breaks Horovod's bundled Gloo.
# python3-dev holds Debian's Python headers (public Python images carry their own, and then it is
# merely unused).
FROM base AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake g++ make patch python3-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/build
ENV PATH=/opt/build/bin:$PATH
COPY --from=pins /constraints.txt /tmp/
RUN pip install --no-cache-dir --upgrade pip setuptools wheel \
    && pip install --no-cache-dir -c /tmp/constraints.txt tensorflow-cpu
COPY scripts/horovod /src/scripts/horovod
RUN bash /src/scripts/horovod/build-wheel.sh python3 /wheels
# Caramel itself, as a wheel, so that the runtime stage holds the installed package only and
# no second copy of the source.
COPY pyproject.toml README.md /src/
COPY runtime /src/runtime
COPY operator /src/operator
RUN pip wheel --no-deps --no-cache-dir --wheel-dir /wheels /src

FROM base AS runtime
# tcmalloc, which the entrypoint preloads into training processes (spec.workers.memoryAllocator).
RUN apt-get update && apt-get install -y --no-install-recommends libtcmalloc-minimal4 \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --uid 10001 --create-home --home-dir /home/caramel caramel
ENV VIRTUAL_ENV=/opt/caramel/venv
# `python` is the venv's python: worker commands are `python -m caramel.launch.entrypoint ...`.
ENV PATH=$VIRTUAL_ENV/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN python3 -m venv $VIRTUAL_ENV && pip install --no-cache-dir --upgrade pip
# TensorFlow and Horovod first, in their own layer: code changes do not download them again.
COPY --from=pins /constraints.txt /opt/caramel/
COPY --from=builder /wheels/horovod-*.whl /opt/caramel/wheels/
RUN pip install --no-cache-dir -c /opt/caramel/constraints.txt tensorflow-cpu keras /opt/caramel/wheels/horovod-*.whl
COPY --from=builder /wheels/caramel-*.whl /opt/caramel/wheels/
RUN pip install --no-cache-dir -c /opt/caramel/constraints.txt /opt/caramel/wheels/caramel-*.whl \
    && TF_CPP_MIN_LOG_LEVEL=3 python -c "from horovod.tensorflow import mpi_ops; import caramel.tensorflow, caramel_operator.builders" \
    && python -m caramel.job.one_tensorflow
WORKDIR /app
COPY examples examples
# A numeric UID, so that Kubernetes' runAsNonRoot can check it.
USER 10001
CMD ["python", "-m", "caramel_operator"]
