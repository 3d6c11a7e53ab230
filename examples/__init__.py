"""Example training scripts and their CaramelJobs; tests import their models as `examples.*`."""
