"""Caramel's compatibility packages: `horovod`, Horovod's API served by Caramel.

The worker entrypoint puts this directory on the training processes' path, where `horovod` is a
top-level package. It is a package itself only so that the import contracts (pyproject.toml's
[tool.importlinter]) see `caramel.compat.horovod` as the layer above the runtime it is.
"""
