"""Pictures for looking at data and predictions: puzzles (``puzzles.py``) and CAPE pose episodes (``pose.py``)."""
