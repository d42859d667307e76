"""Synthetic needle-in-a-haystack tasks: the BOSCH calibration set and a RULER-like eval suite.

``calibration.py`` builds ``bosch_niah_calib`` (paper §3.3, B.4), ``eval_suite.py`` the six
``bosch_niah_*`` tasks (§3.5, B.6); both generate their text offline and size it in the
model's own tokens (``haystack.py``).
"""
