"""``python -m bosch_eval.search ...`` — the form ``accelerate launch -m`` needs; same flags as ``bosch-eval search``."""

from __future__ import annotations

import argparse
import sys

from bosch_eval.errors import BoschError
from bosch_eval.search.search_cli import add_search_arguments, run_from_args


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bosch_eval.search", description=__doc__)
    add_search_arguments(parser)
    try:
        run_from_args(parser.parse_args())
    except BoschError as err:
        print(f"bosch_eval.search: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
