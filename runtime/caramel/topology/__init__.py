"""The network a job runs on, and the all-reduce algorithms that use it. Pure (no I/O, no cluster)
but for `transport`, which runs a schedule between the job's processes.

- `model`: `Topology` (hosts in rank order, switches, full-duplex links) and its routes.
- `synthetic`: 2D torus and mesh, fat-tree, racks behind uplinks; `STANDARD`, the benchmark's set.
- `spec`: topology files (YAML/JSON) for local runs and benchmarks.
- `labels`: a placed gang's topology from Kubernetes node labels and per-level link speeds.
- `wire`: a topology as compact JSON, for the workers' environment.
- `schedule`: all-reduce schedules (per-step chunk transfers) and one rank's plan of a phase.
- `collectives`: ring, recursive halving-doubling and hierarchical schedules.
- `multitree`: MULTITREE's trees and schedule.
- `replay`: a reference executor of schedules on in-memory buffers.
- `transport`: the executor between processes: a schedule's trees over TCP (`TreeAllreduce`).
- `simulate`: the link-level simulator, `predict_seconds` and `auto`'s choice.
"""
