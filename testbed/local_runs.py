"""`caramel run` as a background process, for tests and the worker fault campaign: its output
line by line, its process tree, its ranks' final weight digests."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, cast

import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
TRAINABLE_VARIABLE = re.compile(r"optimizer/(?:.+/)?_trainable_variables/(\d+)/\.ATTRIBUTES/VARIABLE_VALUE")


def checkpoint_weights(directory: Path) -> dict[str, np.ndarray]:
    """The trainable weights in the latest checkpoint in `directory` of a Caramel run, by index,
    read without the script's model: a Keras 3 optimizer tracks the weights it updates, in the
    model's order, as its `_trainable_variables`, and the checkpoint names them there only."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(directory))
    reader = tf.train.load_checkpoint(latest)
    found = {
        int(match[1]): reader.get_tensor(name)
        for name, _ in tf.train.list_variables(latest)
        if (match := TRAINABLE_VARIABLE.fullmatch(name))
    }
    return {f"trainable variable {index}": found[index] for index in sorted(found)}


def digests(output: str) -> dict[int, str]:
    """Each rank's final `weights digest` line (a SHA-256 of its trainable weights)."""
    return {int(rank): digest for rank, digest in re.findall(r"rank (\d+) \| caramel: weights digest (\w+)", output)}


class BackgroundRun:
    """`caramel run` in the background, its output collected line by line."""

    def __init__(self, job_file: Path, topology: Path | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "caramel.launch.cli", "run", str(job_file), *(["--topology", str(topology)] if topology else [])],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in cast(IO[str], self.process.stderr):  # stderr=PIPE
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str | re.Pattern[str], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        found = (lambda: text.search(self.output)) if isinstance(text, re.Pattern) else (lambda: text in self.output)
        while not found():
            assert self.process.poll() is None, f"caramel exited before {text!r}:\n{self.output}"
            assert time.monotonic() < deadline, f"no {text!r} after {timeout} s:\n{self.output}"
            time.sleep(0.1)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)

    def gang(self) -> list[psutil.Process]:
        """The entrypoints and training processes: rank 0's plan searches, which come and go, left out."""
        members = []
        for process in self.descendants():
            try:
                if "caramel.planner.search" not in process.cmdline():
                    members.append(process)
            except psutil.NoSuchProcess:
                continue
        return members

    def training_process(self, rank: int) -> psutil.Process:
        for process in self.descendants():
            try:
                if process.environ().get("HOROVOD_RANK") == str(rank):
                    return process
            except psutil.NoSuchProcess:
                continue
        raise AssertionError(f"no training process of rank {rank} among {self.descendants()}")

    def finish(self, timeout: float = 300) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code
