"""Loading a model once as the ``bosch`` adapter (all heads full) and building its S(z)
on the calibration task(s): the window and calibration length default to the model's
``bosch_defaults.json``, and ``bosch_niah_calib`` gets its metadata (length, examples, seed,
tokenizer) from the arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bosch_eval.launch import launch_state
from bosch_eval.model_check import resolve_model
from bosch_eval.model_defaults import model_defaults, resolve_window
from bosch_eval.search.objective import DEFAULT_TASKS, CalibrationObjective

DEFAULT_CALIB_EXAMPLES = 64


def build_objective(
    model: str,
    *,
    tasks: Sequence[str] = DEFAULT_TASKS,
    include_path: str | Path | None = None,
    calib_examples: int | None = None,
    calib_len: int | None = None,
    calib_seed: int = 0,
    metric: str = "acc",
    device: str | None = None,
    batch_size: int = 1,
    dtype: str | None = None,
    attn_backend: str = "auto",
    window: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    limit: int | float | None = None,
    max_length: int | None = None,
    model_args: Mapping[str, Any] | None = None,
    prefix_cache_mb: int = 0,
) -> CalibrationObjective:
    """Load ``model`` once as a ``bosch`` adapter (all heads full) and build its S(z).

    Args:
        model: a Hugging Face id or local directory; ``toy`` is the bundled model.
        tasks: calibration task/group names (``bosch_niah_calib`` by default).
        include_path: an extra lm-eval task directory for ``tasks``.
        calib_examples: ``bosch_niah_calib`` examples (default 64).
        calib_len: ``bosch_niah_calib`` length in tokens (default: the model's
            ``bosch_defaults.json``, else the task's 32768).
        calib_seed: seed of the ``bosch_niah_calib`` examples.
        metric: the calibration metric.
        device: ``cpu`` or ``cuda`` (under ``accelerate launch``: each process's device);
            None: cuda when torch sees a GPU, else cpu (:func:`bosch_eval.device.pick_device`).
        batch_size: lm-eval batch size of one call.
        dtype: model dtype (default: the checkpoint's).
        attn_backend: hybrid attention backend.
        window: the SWA window of every scored mask (default: ``bosch_defaults.json``).
        metadata: more TaskManager metadata for the user's own tasks (wins over ours).
        limit: lm-eval's ``limit`` per task.
        max_length: HFLM's ``max_length`` (default: the config's; inputs are left-truncated
            to it), for configs that understate the model's context.
        model_args: more adapter/loader keyword arguments (``--model-args``).
        prefix_cache_mb: the adapter's prefix-activation cache budget (0 = none).
    """
    from bosch_eval.device import pick_device
    from bosch_eval.model_adapters.bosch import BoschLM

    device = pick_device(device, "device")
    launch_state(device)
    path = resolve_model(model)
    defaults = model_defaults(path)
    window = resolve_window(window, default=defaults.window, source=model, flag="window=W")
    lm = BoschLM(
        pretrained=path,
        layers="intr",
        ratio=0.0,  # all full until the first set_mask
        window=window,
        device=device,
        batch_size=batch_size,
        dtype=dtype if dtype is not None else "auto",
        attn_backend=attn_backend,
        memoize_tokens=True,
        prefix_cache_mb=prefix_cache_mb,
        **({"max_length": max_length} if max_length is not None else {}),
        **dict(model_args or {}),
    )
    task_metadata: dict[str, Any] = {"pretrained": path, "tokenizer": path, "calib_seed": calib_seed}
    calib_len = calib_len if calib_len is not None else defaults.calib_len
    if calib_len is not None:
        task_metadata["seq_len"] = calib_len
    if calib_examples is not None or "bosch_niah_calib" in tasks:
        task_metadata["num_examples"] = calib_examples if calib_examples is not None else DEFAULT_CALIB_EXAMPLES
    task_metadata.update(metadata or {})
    return CalibrationObjective(lm, tasks, include_path=include_path, metadata=task_metadata, metric=metric, limit=limit)
