"""A real Prometheus server for tests, scraping given targets every second."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from conftest import free_port, require_binary


class PrometheusServer:
    def __init__(self, directory: Path, targets: list[str]) -> None:
        self.binary = require_binary("prometheus")
        self.port = free_port()
        self.directory = directory
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [{"job_name": "caramel", "static_configs": [{"targets": targets}]}],
        }
        self.config = directory / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.directory / "prometheus.log").open("wb"),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)
                return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"prometheus did not become ready; see {self.directory / 'prometheus.log'}")

    def __exit__(self, *exc_info) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

    def query(self, expression: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]["result"]
