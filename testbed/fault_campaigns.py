"""Fault campaigns: break things on purpose, many times, and count what survives.

    python -m testbed.fault_campaigns [--campaign all|workers|operator|bad-jobs] [--trials N] [--seed S]

- workers: a checkpointed `caramel run` job (2 workers, real TensorFlow and Horovod); each trial
  SIGKILLs a random worker's training process at a random step. The run must restart the whole
  gang (spec.runPolicy.backoffLimit), resume from the latest checkpoint and end with final
  weights whose digest equals an uninterrupted run's, on every rank.
- operator: the operator against the Kubernetes API emulator; each trial SIGKILLs it at a random
  moment while it creates a large gang or restarts one, starts a new operator, and counts
  duplicate pods (two for one worker of the gang, or pods of two gangs) and orphans (pods
  without a live owning job) once the job runs again.
- bad-jobs: invalid CaramelJobs, hand-written and fuzzed from the CRD's schema, through the CLI
  (`caramel run`, in process, with process creation replaced by a counter) and through the
  operator against the emulator. Each must be refused naming the field, with nothing started
  or created. The offline CRD check (what the API server would refuse) is tallied beside them.

Prints one line per trial and the tallies; exits 1 if any trial failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.bad_jobs import HAND_WRITTEN, BadJob, fuzzed
from testbed.crd_validation import validate_object, version_schema
from testbed.local_runs import BackgroundRun, digests
from testbed.operator_harness import JOBS, NETWORK_POLICIES, PODS, SERVICES, Emulator, Operator, eventually
from testbed.ports import free_port_block

REPO = Path(__file__).resolve().parent.parent
PROGRESS = re.compile(r"caramel-progress step=(\d+)")


@dataclass
class Trial:
    ok: bool
    detail: str


def job_manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "caramel.dev/v1alpha1", "kind": "CaramelJob", "metadata": {"name": name}, "spec": spec}


# --- workers ---------------------------------------------------------------------------------


class WorkerCampaign:
    # Enough steps that a kill lands mid-training: rank 0 reports progress every half second (what
    # the trial waits for), and this model's steps take 2 to 25 ms (200 steps once ended before
    # the first report after step 21). A kill comes in the first half of the run, so that at
    # least one report interval's steps at the fastest are left after it.
    STEPS = 2000
    CHECKPOINT_INTERVAL = 100

    def __init__(self, directory: Path, seed: int, steps: int = STEPS) -> None:
        self.directory = directory
        self.rng = random.Random(seed)
        self.steps = steps
        self._expected: str | None = None

    def job_file(self, name: str) -> Path:
        spec = {
            "script": "examples/train_small.py",
            "args": ["--steps", str(self.steps), "--batch-size", "32", "--hidden", "128"],
            "workers": {"replicas": 2},
            "rendezvous": {"port": free_port_block(5)},  # and the ranks' collective ports after it
            "metrics": {"port": free_port_block(4)},
            "caramel": {"transportPort": free_port_block(4)},  # 29500 by default: claimed by a job that may run multitree
            "checkpoint": {"path": str(self.directory / name / "ckpt"), "intervalSteps": self.CHECKPOINT_INTERVAL},
            "runPolicy": {"backoffLimit": 2},
        }
        path = self.directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(job_manifest("fault-workers", spec)))
        return path

    def expected_digest(self) -> str:
        """The final weights of an uninterrupted run."""
        if self._expected is None:
            run = BackgroundRun(self.job_file("uninterrupted"))
            assert run.finish() == 0, run.output
            ranks = digests(run.output)
            assert len(ranks) == 2 and len(set(ranks.values())) == 1, run.output
            self._expected = ranks[0]
        return self._expected

    def trial(self, index: int) -> Trial:
        expected = self.expected_digest()
        rank = self.rng.randrange(2)
        step = self.rng.randrange(self.CHECKPOINT_INTERVAL + 1, self.steps // 2)
        run = BackgroundRun(self.job_file(f"trial-{index}"))
        deadline = time.monotonic() + 300
        while not any(int(s) >= step for s in PROGRESS.findall(run.output)):
            if run.process.poll() is not None or time.monotonic() > deadline:
                return Trial(False, f"the run ended before step {step}:\n{run.output[-2000:]}")
            time.sleep(0.05)
        reached = max(int(s) for s in PROGRESS.findall(run.output))
        run.training_process(rank).send_signal(signal.SIGKILL)
        code = run.finish()
        output = run.output
        restored = re.findall(r"restored .*ckpt-\d+ at step (\d+)", output)
        ranks = digests(output)
        what = f"killed rank {rank} after step {reached} of {self.steps}, resumed from step {restored[-1] if restored else '-'}"
        if code != 0 or "restarting the whole gang" not in output:
            return Trial(False, f"{what}: exit {code}, no gang restart:\n{output[-3000:]}")
        if not restored or int(restored[-1]) >= self.steps:
            return Trial(False, f"{what}: the new gang did not resume training from a checkpoint:\n{output[-3000:]}")
        if set(ranks.values()) != {expected} or len(ranks) != 2:
            return Trial(False, f"{what}: digests {ranks} differ from the uninterrupted run's {expected}")
        return Trial(True, f"{what}, final weights equal the uninterrupted run's")


# --- operator --------------------------------------------------------------------------------


class OperatorCampaign:
    def __init__(self, directory: Path, seed: int) -> None:
        self.directory = directory
        self.rng = random.Random(seed)
        self.emulator = Emulator(directory)

    def close(self) -> None:
        self.emulator.stop()

    def trial(self, index: int) -> Trial:
        api = self.emulator.api
        name = f"crash-{index}"
        replicas = self.rng.randrange(8, 33)
        scenario = self.rng.choice(["creating the gang", "restarting the gang"])
        operator = Operator(self.emulator, self.directory)
        try:
            api.create_job(name, {"script": "train.py", "workers": {"replicas": replicas}})
            if scenario == "restarting the gang":
                eventually(lambda: len(api.pods(name)) == replicas, timeout=60, what="the first gang")
                api.run_pods(name)
                eventually(lambda: api.status(name).get("phase") == "Running", timeout=60, what="Running")
                api.set_pod_status(f"{name}-worker-{self.rng.randrange(replicas)}", {"phase": "Failed"})
                eventually(lambda: api.status(name).get("restarts") == 1, timeout=60, what="a restart")
                # Mid-reconcile: while the failed gang goes, or the new one is being created.
                time.sleep(self.rng.uniform(0.0, 1.0))
            else:
                # Mid-reconcile: once the first pods of the gang exist, while the rest are created.
                eventually(lambda: api.pods(name), timeout=60, what="the first pods", interval=0.01)
                time.sleep(self.rng.uniform(0.0, 0.2))
            pods_at_kill = len(api.pods(name))
            operator.process.send_signal(signal.SIGKILL)
            operator.process.wait()
        finally:
            operator.stop()
        successor = Operator(self.emulator, self.directory)
        try:
            def running_gang() -> bool:
                gang = str(api.status(name).get("gang", 0))
                pods = [p for p in api.pods(name) if not p["metadata"].get("deletionTimestamp")]
                for pod in pods:
                    if pod["metadata"]["labels"]["caramel.dev/gang"] == gang and (pod.get("status") or {}).get("phase") != "Running":
                        api.set_pod_status(pod["metadata"]["name"], {"phase": "Running"})  # the kubelet
                return api.status(name).get("phase") == "Running" and len(pods) == replicas

            eventually(running_gang, timeout=120, what=f"{name} running again")
            duplicates, orphans = self.count_duplicates_and_orphans()
            api.delete(f"{JOBS}/{name}")  # the operator releases it, the garbage collector its pods
            eventually(lambda: not api.pods(name), timeout=60, what="the job's pods collected")
        finally:
            successor.stop()
        what = f"{scenario} of {replicas} workers, killed with {pods_at_kill} pods: {duplicates} duplicate, {orphans} orphan pods"
        return Trial(duplicates == 0 and orphans == 0, what)

    def count_duplicates_and_orphans(self) -> tuple[int, int]:
        api = self.emulator.api
        jobs = {job["metadata"]["uid"]: job for job in api.items(JOBS)}
        live = [p for p in api.items(PODS) if not p["metadata"].get("deletionTimestamp")]
        orphans = [p for p in live if not any(ref["uid"] in jobs for ref in p["metadata"].get("ownerReferences") or [])]
        seen: dict[tuple[str, str], int] = {}
        for pod in live:
            labels = pod["metadata"]["labels"]
            key = (labels["caramel.dev/job"], labels["caramel.dev/worker-index"])
            seen[key] = seen.get(key, 0) + 1
        stale_gangs = [
            p for p in live for job in jobs.values()
            if p["metadata"]["labels"]["caramel.dev/job"] == job["metadata"]["name"]
            and p["metadata"]["labels"]["caramel.dev/gang"] != str((job.get("status") or {}).get("gang", 0))
        ]
        return sum(count - 1 for count in seen.values()) + len(stale_gangs), len(orphans)


# --- bad jobs --------------------------------------------------------------------------------


def bad_jobs(seed: int, fuzz: int) -> list[BadJob]:
    from caramel_operator.crd import custom_resource_definition

    return HAND_WRITTEN + list(fuzzed(version_schema(custom_resource_definition()), fuzz, seed))


class BadJobCampaign:
    def __init__(self, directory: Path, seed: int, fuzz: int) -> None:
        from caramel_operator.crd import custom_resource_definition

        self.directory = directory
        self.jobs = bad_jobs(seed, fuzz)
        self.crd = custom_resource_definition()

    def through_cli(self, bad: BadJob) -> Trial:
        import caramel.launch.launcher
        from caramel.launch.cli import main

        started: list[Any] = []
        original = caramel.launch.launcher.spawn
        caramel.launch.launcher.spawn = lambda *args, **kwargs: started.append(args) or original(*args, **kwargs)  # type: ignore[func-returns-value]  # records, then spawns
        path = self.directory / "bad.yaml"
        path.write_text(yaml.safe_dump(bad.manifest))
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                code = main(["run", str(path)])
        finally:
            caramel.launch.launcher.spawn = original
        named = bad.field in errors.getvalue()
        return Trial(code == 2 and named and not started, f"exit {code}, field named: {named}, processes started: {len(started)}")

    def through_operator(self) -> list[Trial]:
        emulator = Emulator(self.directory)
        operator = Operator(emulator, self.directory)
        api = emulator.api
        try:
            names = []
            for index, bad in enumerate(self.jobs):
                manifest = dict(bad.manifest, metadata={**bad.manifest["metadata"]})
                if bad.field != "metadata.name":
                    manifest["metadata"]["name"] = f"bad-{index}"
                manifest["metadata"]["namespace"] = "default"
                api.create(JOBS, manifest)
                names.append(manifest["metadata"]["name"])

            def failed(name: str) -> bool:
                return api.status(name).get("phase") == "Failed"

            eventually(lambda: all(failed(name) for name in names), timeout=300, what="every bad job Failed")
            time.sleep(2)  # a few more passes: anything the operator would create, it has by now
            trials = []
            for bad, name in zip(self.jobs, names):
                status = api.status(name)
                reason = next((c["reason"] for c in status.get("conditions", []) if c["type"] == "Failed"), None)
                created = sum(
                    1 for path in (PODS, SERVICES, NETWORK_POLICIES) for obj in api.items(path)
                    if obj["metadata"].get("labels", {}).get("caramel.dev/job") == name
                )
                named = bad.field in status.get("message", "")
                trials.append(Trial(reason == "InvalidSpec" and named and created == 0,
                                    f"{reason}, field named: {named}, objects created: {created}"))
            return trials
        finally:
            operator.stop()
            emulator.stop()

    def through_crd(self, bad: BadJob) -> bool:
        return any(bad.field in str(violation) for violation in validate_object(self.crd, bad.manifest))


# --- the script ------------------------------------------------------------------------------


def run_trials(name: str, trials: int, trial: Callable[[int], Trial]) -> list[Trial]:
    results = []
    for index in range(trials):
        started = time.monotonic()
        result = trial(index)
        results.append(result)
        print(f"  {name} {index + 1}/{trials}: {'ok  ' if result.ok else 'FAIL'} {result.detail} ({time.monotonic() - started:.1f} s)", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaign", choices=["all", "workers", "operator", "bad-jobs"], default="all")
    parser.add_argument("--trials", type=int, default=10, help="trials of the workers and operator campaigns (default 10)")
    parser.add_argument("--fuzzed", type=int, default=20, help="fuzzed bad jobs besides the hand-written ones (default 20)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    tallies: list[tuple[str, int, int, str]] = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        if args.campaign in ("all", "workers"):
            started = time.monotonic()
            (root / "workers").mkdir()
            campaign = WorkerCampaign(root / "workers", args.seed)
            results = run_trials("workers", args.trials, campaign.trial)
            tallies.append(("workers: killed worker, resumed, equal weights", len(results), sum(r.ok for r in results),
                            f"{time.monotonic() - started:.0f} s"))
        if args.campaign in ("all", "operator"):
            started = time.monotonic()
            (root / "operator").mkdir()
            operator_campaign = OperatorCampaign(root / "operator", args.seed)
            try:
                results = run_trials("operator", args.trials, operator_campaign.trial)
            finally:
                operator_campaign.close()
            tallies.append(("operator: killed mid-reconcile, 0 duplicate/orphan pods", len(results), sum(r.ok for r in results),
                            f"{time.monotonic() - started:.0f} s"))
        if args.campaign in ("all", "bad-jobs"):
            started = time.monotonic()
            (root / "bad").mkdir()
            bad = BadJobCampaign(root / "bad", args.seed, args.fuzzed)
            hand = sum(not job.fuzzed for job in bad.jobs)
            print(f"  bad jobs: {hand} hand-written, {len(bad.jobs) - hand} fuzzed", flush=True)
            cli = [bad.through_cli(job) for job in bad.jobs]
            operator = bad.through_operator()
            for job, via_cli, via_operator in zip(bad.jobs, cli, operator):
                if not (via_cli.ok and via_operator.ok):
                    print(f"  FAIL {job.title} [{job.field}]: CLI {via_cli.detail}; operator {via_operator.detail}", flush=True)
            crd = sum(bad.through_crd(job) for job in bad.jobs)
            elapsed = f"{time.monotonic() - started:.0f} s"
            tallies.append(("bad jobs via CLI: refused, field named, nothing started", len(cli), sum(r.ok for r in cli), elapsed))
            tallies.append(("bad jobs via operator: InvalidSpec, field named, 0 objects", len(operator), sum(r.ok for r in operator), elapsed))
            tallies.append(("bad jobs via the CRD, offline (the API server's refusal)", len(bad.jobs), crd, elapsed))
    print()
    print("| campaign | trials | passed | failed | time |")
    print("| --- | --- | --- | --- | --- |")
    for title, trials, passed, elapsed in tallies:
        print(f"| {title} | {trials} | {passed} | {trials - passed} | {elapsed} |")
    return 0 if all(passed == trials for _, trials, passed, _ in tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
