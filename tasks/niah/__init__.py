"""Synthetic needle-in-a-haystack tasks: the BOSCH calibration sets and a RULER-like eval suite.

``calibration.py`` builds ``bosch_niah_calib`` (paper §3.3, B.4) and ``retrieval_calib.py``
``bosch_retrieval_calib`` (issue 29); ``eval_suite.py`` the six ``bosch_niah_*`` tasks (§3.5,
B.6) and ``dev_split.py`` their development split ``bosch_niah_dev``. All generate their text
offline and size it in the model's own tokens (``haystack.py``).
"""
