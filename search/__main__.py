"""``python -m bosch_eval.search ...`` — the form ``accelerate launch -m`` needs; same flags as ``bosch-eval search``."""

from __future__ import annotations

import argparse
import sys

from bosch_eval.runtime.errors import exit_status
from bosch_eval.runtime.threads import apply_thread_policy
from bosch_eval.search.cli.find_mask import add_search_arguments, run_from_args


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bosch_eval.search", description=__doc__)
    add_search_arguments(parser)
    args = parser.parse_args()
    apply_thread_policy()  # each process of an `accelerate launch` decides for itself
    return exit_status("bosch_eval.search", lambda: run_from_args(args))


if __name__ == "__main__":
    sys.exit(main())
