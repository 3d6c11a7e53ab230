"""The CaramelJob API, the job file and the worker environment contract.

Shared by the operator, `caramel run` and the workers; nothing here imports TensorFlow.
"""
