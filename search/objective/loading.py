"""Loading a model once as the ``bosch`` adapter (all heads full) and building its S(z)
on the calibration task(s): the window and calibration length default to the model's
``bosch_defaults.json``, and a calibration set gets its metadata (length, examples, seed,
tokenizer) from the arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.models.model_check import IGNORE_METADATA, truthy
from bosch_eval.models.model_defaults import resolve_window
from bosch_eval.models.resolved_model import ResolvedModel
from bosch_eval.runtime.device import pick_device
from bosch_eval.runtime.errors import SearchError
from bosch_eval.runtime.launch import launch_state
from bosch_eval.search.objective.defaults import (
    DEFAULT_CALIB_EXAMPLES,
    DEFAULT_CALIB_LEN,
    DEFAULT_CALIB_METRIC,
    default_calib_task,
)
from bosch_eval.search.objective.calibration import CalibrationObjective
from bosch_eval.search.objective.racing import Racing
from bosch_eval.tasks.niah.calibration_sets import is_calibration_set


@dataclass(frozen=True)
class CalibrationSettings:
    """What S(z) is measured on: the calibration task(s), their metric and their size.

    Attributes:
        tasks: calibration task/group names; () for the model's default (:func:`default_calib_task`).
        include_path: an extra lm-eval task directory for ``tasks``.
        metric: the calibration metric.
        examples: examples of the calibration set among ``tasks`` (default 64).
        length: its length in tokens (default: the model's ``bosch_defaults.json``, else
            the task's 32768).
        seed: the seed of its examples.
        limit: lm-eval's ``limit`` per task.
        metadata: more TaskManager metadata for the user's own tasks (wins over ours).
        ignore_max_positions: the config understates the model's context (rope scaling):
            the tasks may build inputs past ``max_position_embeddings`` and the adapter
            does not truncate them to it.
        tie_break_tasks: task(s) that order the masks ``tasks`` ties with the found one, under
            the same metric and metadata (:mod:`bosch_eval.search.objective.tie_break`); () for none.
    """

    tasks: tuple[str, ...] = ()
    include_path: str | None = None
    metric: str = DEFAULT_CALIB_METRIC
    examples: int | None = None
    length: int | None = None
    seed: int = 0
    limit: int | float | None = None
    metadata: Mapping[str, Any] | None = None
    ignore_max_positions: bool = False
    tie_break_tasks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("tasks", "tie_break_tasks"):
            value = getattr(self, name)
            object.__setattr__(
                self, name, (value,) if isinstance(value, str) else tuple(value)
            )  # one name, not its letters
        if self.include_path is not None:
            object.__setattr__(self, "include_path", str(self.include_path))

    def for_model(self, model: str) -> CalibrationSettings:
        """These settings with the default calibration set of ``model`` where no task is named."""
        return self if self.tasks else replace(self, tasks=(default_calib_task(model),))

    @property
    def include_paths(self) -> tuple[str, ...]:
        """Where task YAMLs are found beside the bundled ones."""
        return () if self.include_path is None else (self.include_path,)

    @property
    def sized(self) -> bool:
        """Whether a calibration set (``calibration_sets.py``) is among ``tasks``: its size, length
        and seed then come from ``examples``, ``length`` and ``seed``."""
        return any(is_calibration_set(task, self.include_paths) for task in self.tasks)


@dataclass(frozen=True)
class LoadSettings:
    """How the model is loaded as the ``bosch`` adapter and run (all heads full until the
    first mask).

    Attributes:
        window: the SWA window of every scored mask (default: ``bosch_defaults.json``).
        device: ``cpu`` or ``cuda`` (under ``accelerate launch``: each process's device);
            None: cuda when torch sees a GPU, else cpu (:func:`bosch_eval.runtime.device.pick_device`).
        batch_size: lm-eval batch size of one call.
        dtype: model dtype (default: the checkpoint's).
        attn_backend: hybrid attention backend (also taken from ``model_args``, as the CLI passes it).
        model_args: more adapter/loader keyword arguments (``--model-args``).
        prefix_cache_mb: the adapter's prefix-activation cache budget (0 = none).
    """

    window: int | None = None
    device: str | None = None
    batch_size: int = 1
    dtype: str | None = None
    attn_backend: str = "auto"
    model_args: Mapping[str, Any] | None = None
    prefix_cache_mb: int = 0


def build_objective(
    model: str | ResolvedModel,
    calibration: CalibrationSettings = CalibrationSettings(),
    load: LoadSettings = LoadSettings(),
    racing: Racing = Racing(),
) -> CalibrationObjective:
    """Load ``model`` once as a ``bosch`` adapter (all heads full) and build its S(z).

    Args:
        model: a Hugging Face id or local directory (``toy`` is the bundled model), or one
            resolved already.
        calibration: the task(s) and calibration set S(z) is measured on.
        load: how the model is loaded and run.
        racing: whether to race where it can be exact, and in chunks of how many examples.
    """
    extra = dict(load.model_args or {})
    # The CLI has no flag of its own for the kernel: --model-args attn_backend=... names it.
    named_backend = extra.pop("attn_backend", None)
    if named_backend is not None and load.attn_backend not in ("auto", named_backend):
        raise SearchError(
            f"attn_backend={load.attn_backend!r} and model_args attn_backend={named_backend!r}: name one kernel"
        )
    device = pick_device(load.device, "device")
    launch_state(device)
    if isinstance(model, ResolvedModel):
        resolved, model = model, str(model.name)
    else:
        resolved = ResolvedModel.named(
            model, trust_remote_code=truthy(extra.get("trust_remote_code", False), "trust_remote_code")
        )
    path, defaults = resolved.path, resolved.defaults
    calibration = calibration.for_model(model)
    window = resolve_window(load.window, default=defaults.window, source=model, flag="window=W")
    length = calibration.length if calibration.length is not None else defaults.calib_len
    # A config that understates the context: HFLM would left-truncate inputs to it.
    longest = length if length is not None else (DEFAULT_CALIB_LEN if calibration.sized else None)
    max_length = {"max_length": longest} if calibration.ignore_max_positions and longest is not None else {}
    lm = BoschLM(
        pretrained=resolved,
        layers="intr",
        ratio=0.0,  # all full until the first set_mask
        window=window,
        device=device,
        batch_size=load.batch_size,
        dtype=load.dtype if load.dtype is not None else "auto",
        attn_backend=named_backend or load.attn_backend,
        memoize_tokens=True,
        prefix_cache_mb=load.prefix_cache_mb,
        **max_length,
        **extra,
    )
    task_metadata: dict[str, Any] = {"pretrained": path, "tokenizer": path, "calib_seed": calibration.seed}
    if length is not None:
        task_metadata["seq_len"] = length
    if calibration.examples is not None or calibration.sized:
        task_metadata["num_examples"] = (
            calibration.examples if calibration.examples is not None else DEFAULT_CALIB_EXAMPLES
        )
    if calibration.ignore_max_positions:
        task_metadata[IGNORE_METADATA] = True
    task_metadata.update(calibration.metadata or {})
    return CalibrationObjective(
        lm,
        calibration.tasks,
        include_path=calibration.include_path,
        metadata=task_metadata,
        metric=calibration.metric,
        racing=racing,
        limit=calibration.limit,
    )
