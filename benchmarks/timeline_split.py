"""Where a collective's time goes inside the step, from Horovod's timeline.

    python -m benchmarks.timeline_split TIMELINE.json [--match caramel_transfer] [--last-seconds 15]

Run a benchmark with `--worker-env HOROVOD_TIMELINE=<file>` (rank 0, Horovod's coordinator,
writes it: every tensor a "process" of a Chrome trace, `horovod/common/timeline.cc`). Only the
strategies whose gradients travel by Horovod's collectives write one: plain Horovod's
(horovod-tape, autotune-tape) and Caramel's on its horovod backend (caramel@hvd and the other
@hvd paths, the anchors); TensorFlow's collectives (mwms-*, the @tf paths) keep no timeline. Each time a
tensor is reduced, the timeline holds its negotiation (from the moment rank 0 had it to the moment
every rank had it; a tick per rank the first time, none where the response cache answers) and its
processing (from the moment Horovod's background thread started it, through copies into and out
of the fusion buffer and the all-reduce on the wire, to its end). Tensors fused into one
collective (a grouped allreduce's pieces, or what Horovod fused in one cycle) are processed
together, and count here as one collective, named after its first tensor, without the graph's
scopes and the piece's `_KofN`.

Per collective name, over its runs in the window read, this prints the median of:
    negotiate  rank 0 had it to every rank had it: ranks late with their gradients, and the
               coordinator's cycles
    queued     every rank had it to its processing started: waiting behind another collective
               in Horovod's background thread, which runs one after another
    copies     into and out of the fusion buffer
    wire       the all-reduce itself (Gloo's ring: transfer and summation)
    gap        the link idle before it: from the end of the collective processed before it
and a total line: how much of the window the link was busy, and how much of its idle time came
while the next collective was already negotiated (Horovod's own hand-over) or not yet.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

MICROSECONDS = 1e-6
COPY_ACTIVITIES = ("MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER")
_PIECE = re.compile(r"_\d+of\d+$")


@dataclass
class Reduction:
    """One reduction of one tensor, in seconds since Horovod started on rank 0."""

    name: str
    heard: float | None = None
    """When rank 0 had it: the start of its negotiation."""
    negotiated: float | None = None
    """When every rank had it: the end of its negotiation."""
    started: float | None = None
    ended: float | None = None
    activities: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Seconds spent in each activity of its processing."""


@dataclass(frozen=True)
class Collective:
    """Reductions processed together (fused): the phases of the first, whose name it takes."""

    name: str
    started: float
    ended: float
    negotiate: float | None
    queued: float | None
    copies: float
    wire: float
    negotiated: float | None


def collective_name(tensor_name: str) -> str:
    """A tensor's name without its graph scopes and a grouped allreduce's `_KofN`."""
    return _PIECE.sub("", tensor_name.rsplit("/", 1)[-1])


def read_timeline(path: Path) -> list[Reduction]:
    """Every complete reduction in a Horovod timeline, in the order their processing started."""
    text = path.read_text().strip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"  # a timeline cut off by a run that ended mid-write
    events = json.loads(text)
    names: dict[int, str] = {}
    current: dict[int, Reduction] = {}
    labels: dict[int, list[tuple[str, float]]] = defaultdict(list)
    done: list[Reduction] = []
    for event in events:
        pid, phase = event.get("pid"), event.get("ph")
        if phase == "M":
            if event.get("name") == "process_name" and "name" in event.get("args", {}):
                names[pid] = event["args"]["name"]
            continue
        if pid not in names or "ts" not in event or phase not in ("B", "E"):
            continue  # rank ticks (X) are not needed: the negotiation's end is the last rank's
        at = event["ts"] * MICROSECONDS
        reduction = current.setdefault(pid, Reduction(names[pid]))
        stack = labels[pid]
        if phase == "B":
            label = event["name"]
            if label.startswith("NEGOTIATE_"):
                reduction.heard = at
            elif not stack:
                reduction.started = at
            stack.append((label, at))
        elif stack:
            label, began = stack.pop()
            if label.startswith("NEGOTIATE_"):
                reduction.negotiated = at
            elif stack:
                reduction.activities[label] += at - began
            else:
                reduction.ended = at
                done.append(reduction)
                del current[pid]
    return sorted(done, key=lambda reduction: cast(float, reduction.started))


def collectives(reductions: list[Reduction]) -> list[Collective]:
    """The reductions grouped into the collectives they were processed in: Horovod's background
    thread processes one at a time, so reductions whose processing overlaps were fused."""
    groups: list[list[Reduction]] = []
    for reduction in reductions:
        if groups and cast(float, reduction.started) < max(cast(float, member.ended) for member in groups[-1]):
            groups[-1].append(reduction)
        else:
            groups.append([reduction])
    out = []
    for group in groups:
        first = group[0]
        negotiated = max((member.negotiated for member in group if member.negotiated is not None), default=None)
        heard = min((member.heard for member in group if member.heard is not None), default=None)
        wire = sum(seconds for activity, seconds in first.activities.items() if activity not in COPY_ACTIVITIES)
        out.append(
            Collective(
                name=collective_name(first.name),
                started=cast(float, first.started),
                ended=max(cast(float, member.ended) for member in group),
                negotiate=negotiated - heard if negotiated is not None and heard is not None else None,
                queued=max(0.0, cast(float, first.started) - negotiated) if negotiated is not None else None,
                copies=sum(first.activities.get(activity, 0.0) for activity in COPY_ACTIVITIES),
                wire=wire,
                negotiated=negotiated,
            )
        )
    return out


def median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def report(reductions: list[Reduction], match: str, last_seconds: float | None) -> None:
    runs = collectives(reductions)
    if last_seconds is not None and runs:
        runs = [run for run in runs if run.started >= runs[-1].ended - last_seconds]
    if not runs:
        print("no complete collective in the timeline")
        return
    gaps = [0.0] + [max(0.0, after.started - before.ended) for before, after in zip(runs, runs[1:])]
    rows: dict[str, list[tuple[Collective, float]]] = defaultdict(list)
    for run, gap in zip(runs, gaps):
        if match in run.name:
            rows[run.name].append((run, gap))

    def ms(value: float | None) -> str:
        return f"{value * 1e3:9.2f}" if value is not None else f"{'-':>9}"

    print(f"{'collective':40} {'runs':>5} {'negotiate':>9} {'queued':>9} {'copies':>9} {'wire':>9} {'gap':>9}  (ms, medians)")
    for name, found in sorted(rows.items(), key=lambda item: median([run.wire for run, _ in item[1]]) or 0.0, reverse=True):
        print(
            f"{name[-40:]:40} {len(found):5d} {ms(median([run.negotiate for run, _ in found]))} {ms(median([run.queued for run, _ in found]))} "
            f"{ms(median([run.copies for run, _ in found]))} {ms(median([run.wire for run, _ in found]))} {ms(median([gap for _, gap in found]))}"
        )
    window = runs[-1].ended - runs[0].started
    busy = sum(run.ended - run.started for run in runs)
    handed_over = sum(gap for run, gap in zip(runs, gaps) if run.negotiated is not None and run.negotiated <= run.started - gap)
    print(
        f"\nwindow {window:.3f} s, {len(runs)} collectives: processing {busy:.3f} s ({busy / window:.0%}), idle {sum(gaps):.3f} s, "
        f"of which {handed_over:.3f} s with the next collective already negotiated (Horovod's hand-over) and "
        f"{sum(gaps) - handed_over:.3f} s before every rank had it"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for the phases.")
    parser.add_argument("timeline", type=Path, help="a Horovod timeline (HOROVOD_TIMELINE, written by rank 0)")
    parser.add_argument("--match", default="", help="only collectives whose name contains this (default: all)")
    parser.add_argument("--last-seconds", type=float, help="only the collectives of the timeline's last seconds (the steady state)")
    args = parser.parse_args(argv)
    if not args.timeline.is_file():
        parser.error(f"{args.timeline}: no such file")
    try:
        reductions = read_timeline(args.timeline)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        print(f"timeline_split: {args.timeline} is not a Horovod timeline: {error}", file=sys.stderr)
        return 2
    report(reductions, args.match, args.last_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
