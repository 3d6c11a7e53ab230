"""Transitional: now `caramel.contract.env` (see `caramel.job`)."""

from caramel.contract.env import RENDEZVOUS_TIMEOUT_SECONDS as RENDEZVOUS_TIMEOUT_SECONDS
