"""All-reduce algorithms over a network (`caramel.network`), as schedules of chunk transfers, and
what they cost on it. Pure: nothing here moves bytes between processes (`caramel.collectives.tree_transport` does).

- `chunk_schedule`: a `Schedule` (per-step `ChunkTransfer`s) and one rank's plan of a phase.
- `baseline_schedules`: ring, recursive halving-doubling and hierarchical schedules.
- `multitree_schedule`: MULTITREE's trees and schedule.
- `replay`: a reference executor of schedules on in-memory buffers: what a schedule means.
- `simulate`: the link-level simulator, `predict_seconds` and `auto`'s choice; its costs are the
  planner's alpha-beta `LinkModel`.
"""
