from caramel.contract.progress import ProgressReport, format_report, parse_report


def test_report_round_trips_through_a_prefixed_log_line():
    report = ProgressReport(step=12, total=200, loss=0.4312, step_seconds=0.0521, examples_per_second=1228.4, final=True)
    line = "rank 0 | " + format_report(report)
    assert line == "rank 0 | caramel-progress step=12 total=200 loss=0.4312 step_seconds=0.0521 examples_per_second=1228.4 final=1"
    assert parse_report(line) == report


def test_other_lines_are_not_reports():
    assert parse_report("rank 1 | Epoch 1 loss=0.3") is None
    assert parse_report("caramel-progress step=x") is None
