"""What the two sides of a Caramel job agree on: whoever starts workers (`caramel run`, the
operator) and the workers themselves. Nothing here imports TensorFlow; both sides import it.

- `api`: the CaramelJob API (pydantic models; the CRD is generated from them).
- `jobfile`: reading a CaramelJob from YAML, with errors that name the field.
- `env`: the worker environment contract (`worker_env`, `WorkerContract`).
- `ports`: every port of a job, one rule each (`PortMap`).
- `restart`: when a failed gang restarts and when a job gives up (`RestartPolicy`).
- `progress`: the progress log line of rank 0.
- `telemetry`: the Prometheus series the operator reads from rank 0.
- `termination`: a worker's termination message (its final report, or a failure summary).
- `topology`: the network under a job as it travels to the workers.
"""
