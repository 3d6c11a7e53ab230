"""Transitional: now `caramel.contract.api` (see `caramel.job`)."""

from caramel.contract.api import *  # noqa: F403
