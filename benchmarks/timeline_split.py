"""Where a collective's time goes inside the step, from Horovod's timeline.

    python -m benchmarks.timeline_split TIMELINE.json [--match caramel_transfer] [--last-seconds 20]

Run a benchmark with `--worker-env HOROVOD_TIMELINE=<file>` (rank 0, Horovod's coordinator,
writes it: every tensor a "process" of a Chrome trace, `horovod/common/timeline.cc`). Each time a
tensor is reduced, the timeline holds:
- its negotiation, where rank 0 coordinated it: the moment rank 0 first heard of it, a tick as
  each rank reported it ready, and the end, once the last one had (a tensor whose negotiation
  Horovod's response cache answered has none);
- its processing: from the moment Horovod's background thread started it (it runs one response
  after another) through activities (copies into and out of the fusion buffer, the all-reduce
  on the wire) to its end.

Per tensor, over its reductions in the window read, this prints the median of:
    skew      first rank ready to last rank ready: a rank late with its gradients
    respond   last rank ready to the end of negotiation: the coordinator's cycle
    queued    end of negotiation to the start of processing: waiting behind another collective
              in Horovod's background thread (unknown where the response cache answered)
    copies    into and out of the fusion buffer
    wire      the all-reduce itself (Gloo's ring: transfer and summation)
    gap       the link idle before it: from the end of the collective processed before it to
              its start
and a total line: how much of the window the link was busy, idle while nothing was ready for
it, and idle while this tensor was already negotiated (Horovod's own hand-over).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

MICROSECONDS = 1e-6
COPY_ACTIVITIES = ("MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER")


@dataclass
class Reduction:
    """One reduction of one tensor, in seconds since Horovod started on rank 0."""

    name: str
    heard: float | None = None
    """When rank 0 first heard of it (None where the response cache answered)."""
    ready: dict[int, float] = field(default_factory=dict)
    """When each rank reported it ready."""
    negotiated: float | None = None
    started: float | None = None
    ended: float | None = None
    activities: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Seconds spent in each activity of its processing."""

    @property
    def wire(self) -> float:
        return sum(seconds for activity, seconds in self.activities.items() if activity not in COPY_ACTIVITIES)

    @property
    def copies(self) -> float:
        return sum(self.activities.get(activity, 0.0) for activity in COPY_ACTIVITIES)


def read_timeline(path: Path) -> list[Reduction]:
    """Every complete reduction in a Horovod timeline, in the order their processing started."""
    text = path.read_text().strip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"  # a timeline cut off by a run that ended mid-write
    events = json.loads(text)
    names: dict[int, str] = {}
    open_reduction: dict[int, Reduction] = {}
    open_activity: dict[int, tuple[str, float]] = {}
    depth: dict[int, list[str]] = defaultdict(list)
    done: list[Reduction] = []
    for event in events:
        pid, phase = event.get("pid"), event.get("ph")
        if phase == "M":
            if event.get("name") == "process_name" and "name" in event.get("args", {}):
                names[pid] = event["args"]["name"]
            continue
        if pid not in names or "ts" not in event:
            continue
        at = event["ts"] * MICROSECONDS
        reduction = open_reduction.setdefault(pid, Reduction(names[pid]))
        stack = depth[pid]
        if phase == "B":
            label = event["name"]
            if label.startswith("NEGOTIATE_"):
                reduction.heard = at
            elif not stack:
                reduction.started = at
            else:
                open_activity[pid] = (label, at)
            stack.append(label)
        elif phase == "X" and stack and stack[-1].startswith("NEGOTIATE_"):
            reduction.ready[int(event["name"])] = at
        elif phase == "E" and stack:
            label = stack.pop()
            if label.startswith("NEGOTIATE_"):
                reduction.negotiated = at
            elif stack:
                activity, began = open_activity.pop(pid, (label, at))
                reduction.activities[activity] += at - began
            else:
                reduction.ended = at
                if reduction.started is not None:
                    done.append(reduction)
                del open_reduction[pid]
    return sorted(done, key=lambda r: r.started)


@dataclass(frozen=True)
class Phases:
    skew: float | None
    respond: float | None
    queued: float | None
    copies: float
    wire: float
    gap: float


def phases(reductions: list[Reduction]) -> list[tuple[Reduction, Phases]]:
    """Each reduction's phases; `gap` against the reduction processed before it (Horovod's
    background thread runs one after another)."""
    out = []
    previous_end: float | None = None
    for reduction in reductions:
        gap = 0.0 if previous_end is None else max(0.0, reduction.started - previous_end)
        queued = max(0.0, reduction.started - reduction.negotiated) if reduction.negotiated is not None else None
        ticks = sorted(reduction.ready.values())
        skew = ticks[-1] - ticks[0] if ticks else None
        respond = reduction.negotiated - ticks[-1] if ticks and reduction.negotiated is not None else None
        out.append((reduction, Phases(skew, respond, queued, reduction.copies, reduction.wire, gap)))
        previous_end = reduction.ended if previous_end is None else max(previous_end, reduction.ended)
    return out


def median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def report(reductions: list[Reduction], match: str, last_seconds: float | None) -> None:
    if not reductions:
        print("no complete reduction in the timeline")
        return
    if last_seconds is not None:
        end = max(r.ended for r in reductions)
        reductions = [r for r in reductions if r.started >= end - last_seconds]
    timed = phases(reductions)
    window = max(r.ended for r in reductions) - min(r.started for r in reductions)
    by_name: dict[str, list[Phases]] = defaultdict(list)
    for reduction, phase in timed:
        if match in reduction.name:
            by_name[reduction.name].append(phase)

    def ms(value: float | None) -> str:
        return f"{value * 1e3:8.2f}" if value is not None else f"{'-':>8}"

    print(f"{'tensor':44} {'times':>5} {'skew':>8} {'respond':>8} {'queued':>8} {'copies':>8} {'wire':>8} {'gap':>8}  (ms, medians)")
    for name, rows in sorted(by_name.items(), key=lambda item: statistics.median(p.wire for p in item[1]), reverse=True):
        print(
            f"{name[-44:]:44} {len(rows):5d} {ms(median([p.skew for p in rows]))} {ms(median([p.respond for p in rows]))} "
            f"{ms(median([p.queued for p in rows]))} {ms(median([p.copies for p in rows]))} {ms(median([p.wire for p in rows]))} "
            f"{ms(median([p.gap for p in rows]))}"
        )
    busy = sum(p.wire + p.copies for _, p in timed)
    negotiated_idle = sum(p.gap for r, p in timed if r.negotiated is not None and r.negotiated <= r.started - p.gap)
    idle = sum(p.gap for _, p in timed)
    print(
        f"\nwindow {window:.3f} s, {len(timed)} reductions: processing {busy:.3f} s ({busy / window:.0%}: wire and copies), idle "
        f"{idle:.3f} s between reductions, of which {negotiated_idle:.3f} s while the next one was already negotiated"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for the phases.")
    parser.add_argument("timeline", type=Path, help="a Horovod timeline (HOROVOD_TIMELINE, written by rank 0)")
    parser.add_argument("--match", default="", help="only tensors whose name contains this (default: all)")
    parser.add_argument("--last-seconds", type=float, help="only the reductions of the timeline's last seconds (the steady state)")
    args = parser.parse_args(argv)
    if not args.timeline.is_file():
        parser.error(f"{args.timeline}: no such file")
    try:
        reductions = read_timeline(args.timeline)
    except (json.JSONDecodeError, KeyError, ValueError) as error:
        print(f"timeline_split: {args.timeline} is not a Horovod timeline: {error}", file=sys.stderr)
        return 2
    report(reductions, args.match, args.last_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
