"""The network topology of a job, and the all-reduce algorithms that use it."""
