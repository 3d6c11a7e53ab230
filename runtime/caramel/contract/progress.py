"""Progress reports: one log line from rank 0, readable by people and parsed by `caramel run`.

    caramel-progress step=120 total=200 loss=0.4312 step_seconds=0.0521 examples_per_second=1228.4

In a cluster the same lines land in the pod log. The last report of a run has final=1 and
carries the run's averages instead of the last step's figures; a run resumed from a checkpoint at
its last step runs no step, and its final report has only the step (step_seconds=0, loss=nan).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

MARKER = "caramel-progress"
_PAIR = re.compile(r"(\w+)=(\S+)")


@dataclass(frozen=True)
class ProgressReport:
    step: int
    total: int
    loss: float
    step_seconds: float
    examples_per_second: float
    final: bool = False

    @property
    def timed(self) -> bool:
        """Whether a step was run and timed: not so in the final report of a run that had none left."""
        return self.step_seconds > 0


def format_report(report: ProgressReport) -> str:
    values = asdict(report)
    values["final"] = int(report.final)
    pairs = " ".join(f"{key}={value:.6g}" if isinstance(value, float) else f"{key}={value}" for key, value in values.items())
    return f"{MARKER} {pairs}"


def parse_report(line: str) -> ProgressReport | None:
    """The report in a log line (whatever prefix it has), or None if the line is not one."""
    _, marker, rest = line.partition(MARKER + " ")
    if not marker:
        return None
    values = dict(_PAIR.findall(rest))
    try:
        return ProgressReport(
            step=int(values["step"]),
            total=int(values["total"]),
            loss=float(values["loss"]),
            step_seconds=float(values["step_seconds"]),
            examples_per_second=float(values["examples_per_second"]),
            final=values["final"] == "1",
        )
    except (KeyError, ValueError):
        return None
