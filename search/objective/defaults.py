"""The search's defaults that its command line shows, in a module that imports no heavy library:
``bosch-eval search --help`` (and ``calib-check --help``) must not load torch, numpy or
lm-eval to print them (models/model_check and model_identity load none)."""

from bosch_eval.models.model_check import BUNDLED_MODELS
from bosch_eval.models.model_identity import portable_name

# The calibration set a search, a ranking or calib-check takes when none is named
# (results/smollm2/calibration_choice.md): every value format a NIAH test uses. The bundled
# toys keep the paper's set D, the only format they were trained on (toy/corpus.py).
DEFAULT_CALIB_TASK = "bosch_niah_calib_formats"
PAPER_CALIB_TASK = "bosch_niah_calib"
DEFAULT_CALIB_EXAMPLES = 64
# Accuracy first, the answer's probability on ties (tasks/niah/tiebreak.py; issue 67): a named
# deviation from the paper's accuracy that never reorders masks of different accuracy.
DEFAULT_CALIB_METRIC = "acc_tiebreak"
DEFAULT_CALIB_LEN = 32768  # bosch_niah_calib's own default (tasks/niah/calibration.py)
# The prefix-activation cache's budget. At the paper's scale one example's states are T·D·2
# bytes (32k × 2048 × bf16 = 128 MB): 1 GB keeps 8 of its 64 calibration examples on the GPU.
DEFAULT_PREFIX_CACHE_MB = 1024


def default_calib_task(model: str) -> str:
    """The calibration set for ``model`` (an alias, a path or a hub id) when none is named:
    :data:`PAPER_CALIB_TASK` for a bundled toy, else :data:`DEFAULT_CALIB_TASK`."""
    return PAPER_CALIB_TASK if portable_name(str(model)) in BUNDLED_MODELS else DEFAULT_CALIB_TASK
