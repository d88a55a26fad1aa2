"""Evaluation of a policy on test sets (`searchr1 eval`): the runner (`evaluate.py`), the pure
aggregation (`stats.py`), the reports (`report.py`) and the command's wiring (`run.py`)."""
