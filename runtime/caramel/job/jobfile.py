"""Transitional: now `caramel.contract.jobfile` (see `caramel.job`)."""

from caramel.contract.jobfile import describe_validation_error as describe_validation_error
