"""Transitional: `caramel.job` is now `caramel.contract`.

Only what files outside Caramel's packages still name lives here (operator/caramel_operator/config.py,
the Makefile, the Dockerfile), each module re-exporting from its new home. Delete this package
once they name `caramel.contract` and `caramel.launch.one_tensorflow`.
"""
