"""Helpers shared by several test modules (fixtures stay in ``conftest.py``).

Tests import these from here (``from tests.helpers import ...``), never from ``conftest``
or from another test module. A process a test spawns imports this file as ``helpers``
(its directory on ``sys.path``), so it imports nothing from the ``tests`` package;
transformers and the trainer are imported inside the functions that need them.
"""

from __future__ import annotations

import random
import re
import socket
import zlib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from lm_eval.api.instance import Instance

from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.search.journal.store import mask_key
from bosch_eval.search.objective.racing import Racer, Tally

if TYPE_CHECKING:
    from bosch_eval.train.trainer import TrainSettings

# -- batches and lm-eval requests ----------------------------------------------------------------------


def left_padded_batch(
    vocab: int, lengths: list[int], seed: int = 1, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask of rows with different lengths, left-padded, on ``device``
    (drawn on the CPU: the same batch on every device)."""
    generator = torch.Generator().manual_seed(seed)
    total = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), total), generator=generator)
    attention = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, length in enumerate(lengths):
        attention[row, total - length :] = 1
        ids[row, : total - length] = 0
    return ids.to(device), attention.to(device)


def requests() -> list[Instance]:
    pairs = [
        ("The quick brown fox", " jumps over the lazy dog."),
        ("The quick brown fox", " jumps"),
        ("The quick brown fox", " sleeps"),
        ("A needle hides in the haystack:", " 7 3 1."),
        ("A needle", " hides in the haystack: 7 3 1. The quick brown fox jumps over the lazy dog."),
    ]
    # By keyword: lm-eval 0.5 reorders Instance's fields and requires task_name and doc_id (0.4 reads them from metadata).
    return [
        Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=idx, task_name=None, doc_id=None)
        for idx, pair in enumerate(pairs)
    ]


def generation_requests() -> list[Instance]:
    prompts = ["The quick brown fox", "A needle hides in the haystack: the special magic number is", "What"]
    kwargs = {"until": ["\n\n"], "max_gen_toks": 24, "do_sample": False}
    return [
        Instance(
            request_type="generate_until", doc={}, arguments=(prompt, kwargs), idx=idx, task_name=None, doc_id=None
        )
        for idx, prompt in enumerate(prompts)
    ]


# -- the dense-band attention oracle -------------------------------------------------------------------

REFERENCE = "bosch_test_dense_band_reference"


def row_sink_flags(padding: torch.Tensor, sinks: int) -> torch.Tensor:
    """``[B, K]`` True at each row's first ``sinks`` real tokens, from the 2D padding mask: a
    real token whose count of real tokens up to and including it is at most ``sinks``
    (written out here, not imported; on the padding's device)."""
    real = padding.bool()
    return real & (real.long().cumsum(dim=-1) <= sinks)


def dense_band_reference(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Eager attention over every head with an explicit band for the SWA heads: key j is
    seen iff j ≤ t and (j is one of the row's first ``sinks`` real tokens, from the 2D
    padding mask the model was called with, or t − j < W), written out here, not imported.
    Runs on the inputs' device."""
    mask: HeadMask = module.reference_mask
    heads_per_group = getattr(module, "num_key_value_groups", 1)  # GPT-2 (MHA) has none
    key = key.repeat_interleave(heads_per_group, dim=1)
    value = value.repeat_interleave(heads_per_group, dim=1)
    batch, q_len, kv_len, device = query.shape[0], query.shape[2], key.shape[2], query.device
    query_pos = torch.arange(q_len, device=device)[:, None] + kv_len - q_len
    key_pos = torch.arange(kv_len, device=device)[None, :]
    lag = query_pos - key_pos
    padding = getattr(module, "reference_padding", None)  # set by reference_logits; None: no padding
    padding = padding if padding is not None else torch.ones(batch, kv_len, device=device)
    sinks = row_sink_flags(padding[:, -kv_len:], mask.sinks)[:, None, :]  # [B, 1, K]
    allowed = attention_mask.expand(batch, query.shape[1], q_len, kv_len).clone()
    for head, bit in enumerate(mask.query_head_bits()[module.layer_idx]):
        if not bit:
            allowed[:, head] &= (lag >= 0) & ((lag < mask.window) | sinks)
    # float64 inside, so the oracle's own rounding stays far below the tolerance.
    scores = (query.double() @ key.double().transpose(2, 3)) * scaling
    # Padding queries see no key at all; zero them so their NaNs cannot leak via value rows.
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1).nan_to_num(0.0)
    return (weights @ value.double()).to(query.dtype).transpose(1, 2), None


def reference_logits(model, mask: HeadMask, ids, attention, grad: bool = False, position_ids=None) -> torch.Tensor:
    """The model's logits with :func:`dense_band_reference` as its attention, on the model's
    device (``ids``/``attention`` there too, e.g. from ``left_padded_batch(device=...)``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from bosch_eval.attention.hybrid_attention import attention_modules

    AttentionInterface.register(REFERENCE, dense_band_reference)
    # sdpa_mask without its causal-skip shortcut: the reference always gets an explicit mask.
    AttentionMaskInterface.register(REFERENCE, lambda *a, **k: sdpa_mask(*a, **{**k, "allow_is_causal_skip": False}))
    original = model.config._attn_implementation
    for module in attention_modules(model).values():
        module.reference_mask, module.reference_padding = mask, attention
    model.set_attn_implementation(REFERENCE)
    try:
        with torch.set_grad_enabled(grad):
            return model(input_ids=ids, attention_mask=attention, position_ids=position_ids).logits
    finally:
        model.set_attn_implementation(original)


# -- calibration tasks with a continuous metric, and the objective that scores them --------------------

# bosch_niah_calib's documents, scored with a continuous metric as well as acc: a random
# model never gets every answer token right, so acc alone is 0 for every mask.
PPL_TASK = "bosch_objective_ppl"
DOT_TASK = "bosch_objective_dot"  # the same documents, the target followed by "."
PLAIN_GROUP = "bosch_objective_group"  # no aggregate_metric_list: S = mean of its tasks
CALIB_METADATA = {"seq_len": 320, "num_examples": 6, "calib_seed": 0}
WINDOW = 8

_TASK = """\
task: {name}
dataset_path: ""
output_type: loglikelihood
test_split: test
custom_dataset: !function bosch_eval.tasks.niah.calibration.dataset
doc_to_text: "{{{{input}}}}"
doc_to_target: " {{{{target}}}}{suffix}"
target_delimiter: ""
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
_GROUP = """\
group: {name}
task: [{tasks}]
metadata:
  version: 1.0
"""


def write_tasks(directory: Path) -> Path:
    """Write the test tasks and group into ``directory`` (an lm-eval include path)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PPL_TASK}.yaml").write_text(_TASK.format(name=PPL_TASK, suffix=""))
    (directory / f"{DOT_TASK}.yaml").write_text(_TASK.format(name=DOT_TASK, suffix="."))
    (directory / f"{PLAIN_GROUP}.yaml").write_text(_GROUP.format(name=PLAIN_GROUP, tasks=f"{PPL_TASK}, {DOT_TASK}"))
    return directory


def masks(shape: ModelShape) -> list[HeadMask]:
    """All full, all SWA, and a checkerboard of the two."""
    checker = [[(layer + group) % 2 for group in range(shape.num_kv_heads)] for layer in range(shape.num_layers)]
    return [
        HeadMask.uniform(shape, full=True),
        HeadMask.uniform(shape, full=False),
        HeadMask.from_rows(checker, shape.num_heads),
    ]


def score_masks(model_dir: str, task_dir: str) -> dict[str, Any]:
    """Build the objective once, score :func:`masks`, record what this process scored
    (one process of ``objective_worker.py``, or the single-process reference)."""
    from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective

    objective = build_objective(
        model_dir,
        CalibrationSettings(
            tasks=(PPL_TASK,),
            include_path=task_dir,
            examples=CALIB_METADATA["num_examples"],
            length=CALIB_METADATA["seq_len"],
            metric="perplexity",
        ),
        # batch 1: a document's score does not depend on its shard's other documents
        LoadSettings(dtype="float32", batch_size=1, window=WINDOW),
    )
    lm = objective.lm
    seen: list[list[int]] = []
    loglikelihood = lm.loglikelihood

    def recording(requests: list[Any], *args: Any, **kwargs: Any) -> Any:
        seen.append(sorted(request.doc_id for request in requests))
        return loglikelihood(requests, *args, **kwargs)

    lm.loglikelihood = recording  # evaluate() looks the method up on the instance
    scores = [objective(mask) for mask in masks(objective.shape)]
    return {"rank": lm.rank, "world_size": lm.world_size, "scores": scores, "docs": seen, "calls": objective.calls}


# -- launching processes -------------------------------------------------------------------------------

PROCESSES = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the search CLI --------------------------------------------------------------------------------------

CALIB = ["--calib-examples", "3", "--calib-len", "320", "--window", "256"]


def search_args(model_dir: Path, task_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        "search", "--model", str(model_dir), "--ratio", "0.5", "--out", str(out), "--budget-per-layer", "6",
        "--calib-tasks", PPL_TASK, "--include-path", str(task_dir), "--calib-metric", "perplexity",
        "--dtype", "float32", *CALIB, *extra,
    ]  # fmt: skip


# -- synthetic search objectives -------------------------------------------------------------------------

SHAPE = ModelShape(num_layers=4, num_heads=8, num_kv_heads=4)


class RetrievalObjective:
    """S(z) of a model whose long-range work is done by a planted set of KV groups.

    ``essential`` groups each carry one unit of score; a ``redundant`` pair carries one
    more unit that is lost only when BOTH are SWA (an interaction: each looks harmless
    alone, so a one-at-a-time static ranking converts both). The all-SWA model keeps a
    floor of 0.05 so that a < b.
    """

    def __init__(self, essential: set[tuple[int, int]], redundant: tuple[tuple[int, int], tuple[int, int]]) -> None:
        self.essential = essential
        self.redundant = redundant
        self.units = len(essential) + 1
        self.calls: list[str] = []

    def __call__(self, mask: HeadMask) -> float:
        key = mask_key(mask.bits)
        assert key not in self.calls, "a mask was evaluated twice"
        self.calls.append(key)
        return score_of(self, mask)


def planted() -> RetrievalObjective:
    # Layer 3 does most retrieval, layer 2 none; layers 1 and 0 share a redundant pair.
    essential = {(3, 0), (3, 1), (3, 2), (1, 0), (0, 3)}
    return RetrievalObjective(essential, redundant=((1, 3), (0, 0)))


def score_of(objective: RetrievalObjective, mask: HeadMask) -> float:
    kept = sum(mask.bits[layer][group] for layer, group in objective.essential)
    kept += any(mask.bits[layer][group] for layer, group in objective.redundant)
    return 0.05 + 0.95 * kept / objective.units


class Killed(Exception):
    """A simulated kill -9: raised from the score function, nothing after it runs."""


class ExampleObjective:
    """A synthetic S(z): the mean of 0/1 per-example values that depend on the mask.

    Example ``e`` is solved when the mask keeps full attention in enough of the groups
    that example needs (a planted set per example), plus a little per-mask noise, so masks
    differ, tie, and some are far apart.
    """

    def __init__(
        self, examples: int = 24, seed: int = 0, chunk: int = 4, processes: int = 1, kill_after: int | None = None
    ) -> None:
        rng = random.Random(seed)
        cells = [(layer, group) for layer in range(SHAPE.num_layers) for group in range(SHAPE.num_kv_heads)]
        self.needs = [rng.sample(cells, 3) for _ in range(examples)]
        self.racer = Racer({"t": examples}, True, self._chunks, self._exact, chunk, processes)
        self.items: list[int] = []  # items per score_chunks call
        self.examples_scored = 0
        self.kill_after = kill_after  # scoring calls (plain calls and rounds of chunks) before a simulated kill

    def value(self, mask: HeadMask, example: int) -> float:
        kept = sum(mask.bits[layer][group] for layer, group in self.needs[example])
        noise = zlib.crc32(f"{mask_key(mask.bits)}/{example}".encode()) % 5 == 0
        return float(kept >= 2) if not noise else float(kept >= 1)

    def __call__(self, mask: HeadMask) -> float:
        # As CalibrationObjective: a plain call's per-example values order the racer's examples.
        self._spend()
        self.examples_scored += len(self.needs)
        values = {e: self.value(mask, e) for e in range(len(self.needs))}
        self.racer.learn(mask, {"t": values})
        return sum(values.values()) / len(values)

    def _chunks(self, items: list[tuple[HeadMask, str, list[int]]]) -> list[dict[int, float]]:
        self._spend()
        self.examples_scored += sum(len(indices) for _, _, indices in items)
        self.items.append(len(items))
        return [{e: self.value(mask, e) for e in indices} for mask, _, indices in items]

    def _spend(self) -> None:
        if self.kill_after is not None:
            if self.kill_after == 0:
                raise Killed  # before the call scores anything, as a kill before its values reach the journal
            self.kill_after -= 1

    def recall(self, mask):  # noqa: ANN001, ANN201 - the ScoreBook protocol
        return self.racer.recall(mask)

    def use_memo(self, memo):  # noqa: ANN001, ANN201
        self.racer.memo = memo

    def _exact(self, tally: Tally) -> float:
        values = tally.in_document_order("t")
        return sum(values) / len(values)

    def race(self, mask, can_win):  # noqa: ANN001, ANN201 - the ScoreBook protocol
        return self.racer.race(mask, can_win)

    def race_many(self, masks, rule_out):  # noqa: ANN001, ANN201
        return self.racer.race_many(masks, rule_out)


# -- training --------------------------------------------------------------------------------------------

MASK_SOURCE = "layers=bme,ratio=0.5,window=8"  # 3 layers: two SWA, one full


def settings_for(model_dir: Path, **changes) -> TrainSettings:
    from bosch_eval.train.trainer import TrainSettings

    base = TrainSettings(
        model=str(model_dir), mask_source=MASK_SOURCE, data="toy", steps=4, seq_len=48, batch_size=4, micro_batch_size=2,
        lr=1e-3, lr_scheduler="cosine", warmup_ratio=0.25, weight_decay=0.01, max_grad_norm=1.0, seed=0,
    )  # fmt: skip
    return replace(base, **changes)


# -- task YAML ---------------------------------------------------------------------------------------------


class TaskYaml(yaml.SafeLoader):
    """lm-eval's task YAML: ``!function`` tags read as nothing (only names and metadata matter here)."""


TaskYaml.add_multi_constructor("!", lambda loader, suffix, node: None)


# -- documentation ---------------------------------------------------------------------------------------
def doc_example(heading: str, language: str = "python") -> tuple[str, str]:
    """The file name and source of the first ``language`` block under ``heading`` in the README or
    ``docs/`` (its first line is ``# <folder>/<file>``): an example a test runs as a new file."""
    root = Path(__file__).resolve().parent.parent
    for path in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        found = re.search(
            rf"^#+ {heading}\n.*?^```{language}\n# \S+/(\w+\.\w+)\n(.*?)^```", path.read_text(), re.M | re.S
        )
        if found:
            return found.group(1), found.group(2)
    raise AssertionError(f"no '{heading}' section with a {language} block in README.md or docs/")
