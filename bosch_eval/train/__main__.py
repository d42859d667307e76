"""``python -m bosch_eval.train ...`` — the form ``accelerate launch -m`` needs; same flags as ``bosch-eval train``."""

from __future__ import annotations

import argparse
import sys

from bosch_eval.runtime.errors import exit_status
from bosch_eval.train.cli import add_train_arguments, run_from_args


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bosch_eval.train", description=__doc__)
    add_train_arguments(parser)
    args = parser.parse_args()
    return exit_status("bosch_eval.train", lambda: run_from_args(args))


if __name__ == "__main__":
    sys.exit(main())
