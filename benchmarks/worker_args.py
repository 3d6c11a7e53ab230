"""The flags every benchmark worker takes (emulated_worker.py, real_worker.py), and their defaults."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from benchmarks.workloads import default_api, warmup_steps
from caramel.tensorflow.steps import DEFAULT_STEPS_PER_EXECUTION


def add_run_arguments(parser: argparse.ArgumentParser, measured_steps: int) -> None:
    """--steps, --warmup, --steps-per-execution and --whole-job."""
    parser.add_argument("--steps", type=int, default=measured_steps, help=f"measured steps (default {measured_steps})")
    parser.add_argument("--warmup", type=int, help="steps run before measuring (default: the benchmark's for --steps-per-execution)")
    parser.add_argument(
        "--steps-per-execution", type=int, default=DEFAULT_STEPS_PER_EXECUTION,
        help=f"steps per graph execution: Caramel's ctf.function, Keras' steps_per_execution (default {DEFAULT_STEPS_PER_EXECUTION}, Caramel's)",
    )  # fmt: skip
    parser.add_argument(
        "--whole-job", action="store_true",
        help="the run is a whole job of its steps (start-up and decisions included), not the steady state of a long training",
    )  # fmt: skip


def parse_run_arguments(parser: argparse.ArgumentParser, compute: str, apis_of: Mapping[str, Sequence[str]]) -> argparse.Namespace:
    """The parsed flags, --api and --warmup defaulted; an --api the strategy does not train with
    (`apis_of[strategy]`) is refused."""
    args = parser.parse_args()
    args.api = args.api or default_api(compute, args.strategy)
    apis = apis_of[args.strategy]
    if args.api not in apis:
        parser.error(f"--api {args.api}: {args.strategy} trains with {' or '.join(apis)} here")
    if args.warmup is None:
        args.warmup = warmup_steps(args.steps_per_execution)
    return args
