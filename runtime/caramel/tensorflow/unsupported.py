"""The error for what Caramel does not serve: a feature of Horovod's API, a keyword of its drop-ins,
an optimizer it cannot wrap. Its message names the feature and says what to do instead.

Horovod's API as Caramel serves it (`horovod._caramel_support`) raises it too, so that a script
catches one error whichever way it reached the refusal."""

from __future__ import annotations

from typing import NoReturn


class NotSupportedByCaramel(NotImplementedError):
    """A feature Caramel does not serve; the message names it and says what to do instead."""


def refuse(feature: str, advice: str) -> NoReturn:
    raise NotSupportedByCaramel(f"{feature} is not supported by Caramel: {advice}")
