"""The `caramel` command: `caramel run JOB.yaml [--workers N]` trains a CaramelJob on this machine."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from caramel import __version__
from caramel.contract.api import CaramelJob
from caramel.contract.jobfile import JobFileError, load_job, parse_job
from caramel.launch.launcher import LaunchError, LocalRun, RunOutcome
from caramel.contract.progress import ProgressReport, format_report
from caramel.network.spec import TopologySpecError, load_topology

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
WORKER_COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "red"]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="caramel", description="Faster data-parallel TensorFlow training.")
    parser.add_argument("--version", action="version", version=f"caramel {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run a CaramelJob on this machine, its workers as local processes",
        description="Run a CaramelJob on this machine: the same YAML `kubectl apply` takes, with no cluster.",
    )
    run.add_argument("job_file", metavar="JOB.yaml", help="a CaramelJob manifest")
    run.add_argument("--workers", type=positive_int, metavar="N", help="override spec.workers.replicas")
    run.add_argument(
        "--topology",
        metavar="FILE",
        help="the network the ranks run on, for spec.caramel.allreduce (a topology file: YAML or JSON, "
        "one host per rank; see caramel.network.spec); without it the network is flat",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # soft_wrap: long log lines and error messages stay whole, for people and for grep alike.
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        job = load_job(args.job_file)
        if args.workers is not None:
            document = job.model_dump(mode="json", by_alias=True, exclude_unset=True)
            document["spec"].setdefault("workers", {})["replicas"] = args.workers
            job = parse_job(document, source=f"{args.job_file} with --workers {args.workers}")
        topology = load_topology(args.topology) if args.topology else None
        if topology is not None and topology.size != job.world_size:
            raise TopologySpecError(
                f"{args.topology} has {topology.size} hosts; the job runs {job.world_size} ranks "
                "(spec.workers.replicas x slotsPerWorker), and the topology needs one host per rank"
            )
    except JobFileError as error:
        console.print(f"[red]error:[/] {escape(str(error))}")
        return EXIT_BAD_INPUT
    except TopologySpecError as error:
        console.print(f"[red]error:[/] --topology: {escape(str(error))}")
        return EXIT_BAD_INPUT

    workers = job.spec.workers
    shrinks = f", down to {workers.min_workers} worker(s) as workers are lost (spec.workers.minReplicas)" if workers.min_workers < workers.replicas else ""
    console.print(
        f"[bold]caramel run[/] {job.name}: {workers.replicas} worker(s) x {workers.slots} slot(s) "
        f"= {job.world_size} rank(s){escape(shrinks)}"
    )
    display = ProgressDisplay(console)
    try:
        with display:
            outcome = LocalRun(job, display.log, display.progress, display.notice, topology=topology).run()
    except LaunchError as error:
        console.print(f"[red]error:[/] {escape(str(error))}")
        return EXIT_BAD_INPUT
    print_outcome(console, job, outcome)
    if outcome.succeeded:
        return 0
    return EXIT_INTERRUPTED if outcome.reason == "interrupted" else EXIT_FAILED


class ProgressDisplay:
    """Worker logs above a progress bar on a terminal; plain lines (progress included) elsewhere."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("loss {task.fields[loss]}  {task.fields[step_time]}/step  {task.fields[throughput]} ex/s"),
            TimeElapsedColumn(),
            console=console,
            disable=not console.is_terminal,
        )
        self.task = self.bar.add_task("train", total=None, loss="-", step_time="-", throughput="-")

    def __enter__(self) -> ProgressDisplay:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self.bar.__exit__(*exc_info)

    def log(self, worker: int, line: str) -> None:
        colour = WORKER_COLOURS[worker % len(WORKER_COLOURS)]
        self.console.print(f"[{colour}]{escape(line)}[/]")

    def notice(self, message: str) -> None:
        self.console.print(f"[yellow bold]caramel:[/] {escape(message)}")

    def progress(self, report: ProgressReport) -> None:
        if not self.console.is_terminal:
            self.console.print(format_report(report))
            return
        self.bar.update(
            self.task,
            completed=report.step,
            total=report.total,
            loss=f"{report.loss:.4f}",
            step_time=f"{report.step_seconds * 1000:.1f} ms",
            throughput=f"{report.examples_per_second:,.0f}",
        )


def print_outcome(console: Console, job: CaramelJob, outcome: RunOutcome) -> None:
    name, replicas = job.name, job.spec.workers.replicas
    if outcome.succeeded:
        restarted = f" after {outcome.restarts} whole-gang restart(s)" if outcome.restarts else ""
        if outcome.replaced:
            restarted += f", {outcome.replaced} lost worker(s) started again while the elastic gang trained on"
        fewer = f", with {outcome.workers} of {replicas} workers" if outcome.workers < replicas else ""
        console.print(f"[green bold]Succeeded[/] {name} in {outcome.wall_seconds:.1f} s{restarted}{fewer}")
        first, last = outcome.first_report, outcome.last_report
        if last and not last.timed:
            console.print(f"  steps {last.step}/{last.total}   none left to run: resumed from a checkpoint at step {last.step}")
        elif first and last:
            console.print(
                f"  steps {last.step}/{last.total}   loss {first.loss:.4f} -> {last.loss:.4f}   "
                f"median step {last.step_seconds * 1000:.1f} ms   {last.examples_per_second:,.0f} examples/s"
            )
        return
    console.print(f"[red bold]Failed[/] {name}: {escape(outcome.reason)} after {outcome.wall_seconds:.1f} s")
    if outcome.last_lines:
        console.print(f"  last lines of worker {outcome.failed_worker}:")
        for line in outcome.last_lines:
            console.print(f"  | {escape(line)}")


if __name__ == "__main__":
    sys.exit(main())
