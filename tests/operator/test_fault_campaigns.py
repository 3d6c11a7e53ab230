"""One round of the operator and bad-job fault campaigns (`python -m testbed.fault_campaigns`
runs them in full; the worker campaign's trial is in test_local_run.py, with real workers)."""

from __future__ import annotations

from testbed.fault_campaigns import BadJobCampaign, OperatorCampaign


def test_bad_jobs_are_refused_naming_the_field_with_nothing_started_or_created(tmp_path):
    campaign = BadJobCampaign(tmp_path, seed=3, fuzz=10)
    assert sum(not job.fuzzed for job in campaign.jobs) >= 40
    failures = [
        f"{job.title}: CLI {cli.detail}; operator {operator.detail}"
        for job, cli, operator in zip(campaign.jobs, map(campaign.through_cli, campaign.jobs), campaign.through_operator())
        if not (cli.ok and operator.ok)
    ]
    assert failures == []
    assert all(campaign.through_crd(job) for job in campaign.jobs)


def test_an_operator_killed_mid_reconcile_leaves_no_duplicate_or_orphan_pod(tmp_path):
    campaign = OperatorCampaign(tmp_path, seed=5)
    try:
        for index in range(2):
            trial = campaign.trial(index)
            assert trial.ok, trial.detail
    finally:
        campaign.close()
