"""Where a model runs: the one device choice of every command.

``bosch-eval search``, ``compare``, ``bench``, ``rank`` and ``lm_eval --model bosch`` (through
the adapter) all call :func:`pick_device`. With no device given it picks one that exists the
way lm-eval does (CUDA when torch sees a GPU, else the CPU) and says which, once per
process. A device that does not exist is an error naming the setting and what this torch
can use, instead of torch's ``AssertionError: Torch not compiled with CUDA enabled`` from
deep inside model loading.
"""

from __future__ import annotations

import functools
import logging

from bosch_eval.runtime.errors import DeviceError

log = logging.getLogger("bosch_eval")

AUTO = "auto"


def _cuda_problem() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"this torch ({torch.__version__}) was built without CUDA"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return None


def default_device() -> str:
    """lm-eval's choice when none is given (HFLM): ``cuda`` when torch sees a GPU, else ``cpu``."""
    return "cpu" if _cuda_problem() is not None else "cuda"


@functools.cache
def _say_picked(device: str, reason: str) -> None:
    # Once per process and choice: the search builds the adapter again for every
    # accelerate process, compare once per load; one line is enough.
    log.warning("bosch-eval: no device given; running on %s (%s)", device, reason)


def pick_device(requested: str | None, setting: str = "device") -> str:
    """The device to run on.

    Args:
        requested: what the user asked for; None or ``"auto"`` = pick one that exists
            (``cuda`` when available, else ``cpu``) and say which.
        setting: the flag or model_arg the value came from, named in errors
            (``--device``, ``device``).

    Raises:
        DeviceError: ``requested`` is not a device name, or names one this machine or
            this torch build lacks (CUDA on a CPU-only torch, ``cuda:3`` with one GPU, mps
            off macOS).
    """
    import torch

    if requested is None or requested == AUTO:
        device = default_device()
        _say_picked(device, "torch sees a CUDA device" if device == "cuda" else _cuda_problem() or "")
        return device
    try:
        parsed = torch.device(requested)
    except (RuntimeError, TypeError) as err:
        raise DeviceError(
            f"{setting} {requested!r}: not a device name ({err}); expected cpu, cuda, cuda:N or auto"
        ) from None
    if parsed.type == "cuda":
        problem = _cuda_problem()
        if problem is not None:
            raise DeviceError(
                f"{setting} {requested!r}: {problem}; use {setting} cpu, or give none to pick one that exists"
            )
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise DeviceError(f"{setting} {requested!r}: torch sees {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(
            f"{setting} {requested!r}: torch has no MPS device here (macOS with Apple silicon only); use {setting} cpu"
        )
    return requested


def slow_cpu_bfloat16(dtype: object, device: str) -> str | None:
    """Why bf16 on this CPU is slow, or None. Without AMX or AVX512-BF16 instructions torch's
    bf16 matrix products take a fallback path several times slower than float32 (on the
    AVX2 cores of issue 37's sessions, 5× for a layer's product and 60–130× for a 1024² one), so
    a user who chose bf16 for speed should hear that float32 is faster here."""
    import torch

    if dtype != torch.bfloat16 or torch.device(device).type != "cpu":
        return None
    native = [getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    if any(check is None for check in native) or any(check() for check in native):
        return None  # native bf16, or a torch that cannot say: nothing to warn about
    return (
        f"dtype bfloat16 on a CPU without AMX or AVX512-BF16 instructions ({torch.backends.cpu.get_cpu_capability()}): "
        "torch's bf16 matrix products take a fallback several times slower than float32 here; dtype=float32 is faster "
        "(scores in the two dtypes can differ by rounding, so keep one dtype for masks you compare)"
    )


@functools.cache
def warn_slow_cpu_bfloat16(dtype: object, device: str) -> None:
    """Log :func:`slow_cpu_bfloat16`'s reason once per process and setting."""
    problem = slow_cpu_bfloat16(dtype, device)
    if problem is not None:
        log.warning("bosch-eval: %s", problem)
