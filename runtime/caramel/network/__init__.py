"""The network a job runs on: a description of hosts, switches and links, and nothing that moves
data over it. Pure (no I/O but reading a topology file, no cluster, no TensorFlow).

- `model`: `Topology` (hosts in rank order, switches, full-duplex links) and its routes.
- `synthetic`: 2D torus and mesh, fat-tree, racks behind uplinks; `STANDARD`, the benchmark's set.
- `spec`: topology files (YAML/JSON) for local runs and benchmarks.
- `labels`: a placed gang's topology from Kubernetes node labels and per-level link speeds.
- `wire`: a `Topology` to and from its wire format (`caramel.contract.topology`), and the
  topology a worker runs on.
"""
