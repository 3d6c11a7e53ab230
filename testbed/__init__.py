"""What tests/, the operator scale benchmark and the fault campaigns share: the Kubernetes API
emulator, the operator run as a process against it, free ports, and the offline CRD validator.
Run from the repository root (pytest's pythonpath and `python -m` both put it on sys.path)."""
