"""lm-eval YAML tasks shipped with bosch-eval (installed as ``bosch_eval.tasks``)."""

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent
