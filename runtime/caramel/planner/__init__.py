"""The pure transfer planner and link model: plans are functions of data every rank shares."""
