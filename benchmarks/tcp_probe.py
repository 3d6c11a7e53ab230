"""TCP throughput between two emulated workers, without external tools.

    python benchmarks/tcp_probe.py recv PORT            # prints one JSON line when the sender is done
    python benchmarks/tcp_probe.py send HOST PORT SECONDS

The receiver times from the first byte to the sender's close, so connection set-up and the
start-up of the sender's interpreter do not count.
"""

from __future__ import annotations

import json
import socket
import sys
import time

CHUNK = 1 << 20


def receive(port: int) -> None:
    with socket.create_server(("", port)) as server:
        connection, _ = server.accept()
    with connection:
        received = len(connection.recv(CHUNK))
        started = time.perf_counter()
        while chunk := connection.recv(CHUNK):
            received += len(chunk)
        seconds = time.perf_counter() - started
    print(json.dumps({"bytes": received, "seconds": seconds, "mbit_per_s": received * 8 / seconds / 1e6}))


def send(host: str, port: int, seconds: float) -> None:
    deadline = time.monotonic() + 10
    while True:  # the receiver may still be starting
        try:
            connection = socket.create_connection((host, port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    payload = bytes(CHUNK)
    with connection:
        connection.settimeout(None)
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            connection.sendall(payload)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "recv":
        receive(int(args[0]))
    else:
        send(args[0], int(args[1]), float(args[2]))
