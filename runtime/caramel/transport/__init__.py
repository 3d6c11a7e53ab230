"""Moving an all-reduce's bytes between a job's processes.

- `tree_allreduce`: `TreeAllreduce`, which runs a `caramel.allreduce` schedule's trees over TCP.
"""
