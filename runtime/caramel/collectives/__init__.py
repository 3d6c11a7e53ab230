"""What moves tensors between a job's ranks. Caramel's planner decides which gradients travel
together and in which order (`caramel.planner`, and `caramel.tensorflow.planned_transfers` builds
that into the step); the modules here move them.

- `backend`: the seam. `Backend` (one fused all-reduce, the backend's own way of averaging a
  step's gradients, and the broadcasts, gathers and probes built on them), `BACKENDS`, and the
  choice and set-up of the job's backend.
- `horovod_backend`: Horovod's C++ collectives over Gloo.
- `tensorflow_backend`: TensorFlow's own collective ops over gRPC.
- `fusion`: the tensors of one call moved as one flat buffer per dtype.
- `multitree`: planned transfers all-reduced by MULTITREE's trees from inside the step's graph.
- `tree_transport`: the trees' executor, over TCP between the processes (no TensorFlow).
"""
