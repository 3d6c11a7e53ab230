"""matplotlib as the processes the tests start see it: not installed, as in the runtime image.

tests/conftest.py puts this directory first on the PYTHONPATH of every process a test starts.
The test environment carries matplotlib for the benchmarks' plots (the bench extra), which the
pytest processes themselves draw; Keras 3 imports `matplotlib.pyplot` at import whenever it can
(keras.src.visualization), which cost every training process a test started 0.7 s of CPU that
no rank in the image spends. Keras catches this ImportError as it catches a missing package.
"""

raise ImportError("matplotlib is left out of the processes the tests start, as it is out of the runtime image (testbed/without_matplotlib)")
