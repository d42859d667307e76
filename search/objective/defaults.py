"""The search's defaults that its command line shows, in a module that imports nothing:
``bosch-eval search --help`` (and ``calib-check --help``) must not load torch, numpy or
lm-eval to print them."""

DEFAULT_CALIB_TASK = "bosch_niah_calib"
DEFAULT_CALIB_EXAMPLES = 64
# Accuracy first, the answer's probability on ties (tasks/niah/tiebreak.py; issue 67): a named
# deviation from the paper's accuracy that never reorders masks of different accuracy.
DEFAULT_CALIB_METRIC = "acc_tiebreak"
DEFAULT_CALIB_LEN = 32768  # bosch_niah_calib's own default (tasks/niah/calibration.py)
# The prefix-activation cache's budget. At the paper's scale one example's states are T·D·2
# bytes (32k × 2048 × bf16 = 128 MB): 1 GB keeps 8 of its 64 calibration examples on the GPU.
DEFAULT_PREFIX_CACHE_MB = 1024
