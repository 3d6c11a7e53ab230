"""`python -m caramel.launch.one_tensorflow`: fail unless exactly one TensorFlow distribution is
installed. Two (tensorflow and tensorflow-cpu, as tf-keras's requirement brings) overwrite each
other's files and make every worker probe for CUDA. Imports no TensorFlow."""

from __future__ import annotations

import sys
from importlib.metadata import distributions

TENSORFLOW_DISTRIBUTIONS = {"tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos", "tf-nightly"}


def installed_tensorflows() -> list[str]:
    names = {(dist.metadata["Name"] or "").lower().replace("_", "-") for dist in distributions()}
    return sorted(names & TENSORFLOW_DISTRIBUTIONS)


def main() -> int:
    found = installed_tensorflows()
    if len(found) != 1:
        print(f"expected exactly one TensorFlow distribution, found {found or 'none'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
