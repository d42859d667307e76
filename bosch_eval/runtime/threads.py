"""How many threads this process computes with on the CPU: decided once, here.

Why: torch's intra-op pool (OpenMP) starts one thread per core and splits every matrix
product, softmax and add between them; each split ends at a barrier that waits for the
slowest thread. When another process keeps one of the cores busy, the scheduler takes a
thread of ours off its core for a whole time slice (milliseconds) while the others spin at
the barrier, and a forward pass of a small model is thousands of such splits: on the 2-core
machine of issue 40 the quickstart took 55 minutes with the default (2 threads beside a
busy process) and 5 with ``OMP_NUM_THREADS=1``. One thread less than the usable cores
leaves a core for everything else (the OS, a tokenizer, another job); on 2 cores that is
one thread, which on the toy models is as fast as two on an idle machine. On SmolLM2 in
bf16 (8 × 1024 tokens) two threads are 1.8× faster alone and 1.1× slower beside a busy
process, so a job that has the machine to itself sets ``OMP_NUM_THREADS`` to the core
count, as ``results/smollm2/commands.sh`` does (``benchmarks/threads_loaded.py`` measures
both, idle and beside a busy process; ``results/smollm2/threads.md``).

The usable cores are those this process may run on (``os.sched_getaffinity``), capped by
a cgroup CPU quota when one is set (containers, Slurm). Whatever the user set wins: a
variable of :data:`THREAD_VARIABLES` already in the environment is left as it is, and
torch's own count is then not touched either (torch reads ``OMP_NUM_THREADS`` /
``MKL_NUM_THREADS`` itself).

:func:`apply_thread_policy` is called by ``bosch-eval`` before any command imports torch
(the variables then reach torch, tokenizers and every process ``accelerate launch``
starts) and by the ``bosch`` adapter, for ``lm_eval --model bosch``, where torch is
already imported (so it sets torch's count directly). Nothing here imports torch.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("bosch_eval")

# Set to the chosen count when unset: OpenMP (torch's intra-op pool on CPU), MKL and
# OpenBLAS (numpy, torch's BLAS), and Rayon (the Rust pool of Hugging Face tokenizers).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS")
# torch's intra-op count follows these when they are set (at::init_num_threads).
TORCH_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
TOKENIZERS_VARIABLE = "TOKENIZERS_PARALLELISM"

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class ThreadPolicy:
    """The thread counts of this process and why.

    Attributes:
        cores: the cores this process may use (affinity, capped by a cgroup quota).
        threads: torch intra-op, OpenMP, BLAS and tokenizer threads.
        reason: where ``threads`` comes from, for the log.
    """

    cores: int
    threads: int
    reason: str


def cgroup_cpu_limit(root: Path = _CGROUP_ROOT, proc_cgroup: Path = _PROC_CGROUP) -> int | None:
    """Whole cores allowed by this process's cgroup CPU quota (rounded up), or None: no
    quota, or none that can be read cheaply (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, where = line.split(":", 2)
        where = where.lstrip("/")
        if controllers == "":  # cgroup v2: "0::/path"
            found = _read_first(root / where / "cpu.max", root / "cpu.max")
            if found is not None:
                quota, _, period = found.partition(" ")
                limit = _cores(quota, period)
                if limit is not None:
                    return limit
        elif "cpu" in controllers.split(","):  # cgroup v1: "N:cpu,cpuacct:/path"
            for folder in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                quota = _read_first(folder / where / "cpu.cfs_quota_us", folder / "cpu.cfs_quota_us")
                period = _read_first(folder / where / "cpu.cfs_period_us", folder / "cpu.cfs_period_us")
                if quota is not None and period is not None:
                    limit = _cores(quota, period)
                    if limit is not None:
                        return limit
    return None


def _read_first(*paths: Path) -> str | None:
    for path in paths:
        try:
            return path.read_text().strip()
        except OSError:
            continue
    return None


def _cores(quota: str, period: str) -> int | None:
    """``ceil(quota / period)``; None for no quota ("max", -1) or text that is not a number."""
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return max(1, math.ceil(quota_us / period_us))


def usable_cores() -> int:
    """The cores this process may run on, capped by its cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return max(1, min(cores, limit) if limit is not None else cores)


def decide(environ: MutableMapping[str, str] | None = None, cores: int | None = None) -> ThreadPolicy:
    """The thread count for ``cores`` usable cores (default: :func:`usable_cores`): the
    user's ``OMP_NUM_THREADS`` (else ``MKL_NUM_THREADS``) when set to a positive integer,
    else one less than the cores, at least one."""
    environ = os.environ if environ is None else environ
    cores = usable_cores() if cores is None else cores
    for name in TORCH_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return ThreadPolicy(cores, int(value), f"{name}={value} (yours)")
    threads = max(1, cores - 1)
    return ThreadPolicy(
        cores, threads, f"{cores} usable core(s), one left for other work" if cores > 1 else "1 usable core"
    )


def apply_thread_policy(environ: MutableMapping[str, str] | None = None) -> ThreadPolicy:
    """Decide the thread count and put it where each library reads it.

    Every variable of :data:`THREAD_VARIABLES` the user did not set gets the count, and
    ``TOKENIZERS_PARALLELISM`` says whether tokenizers may use threads (also keeping its
    fork warning away). If torch is already imported and the user set neither
    ``OMP_NUM_THREADS`` nor ``MKL_NUM_THREADS``, its intra-op count is set directly.
    """
    environ = os.environ if environ is None else environ
    policy = decide(environ)
    users = any(environ.get(name) for name in TORCH_VARIABLES)
    for name in THREAD_VARIABLES:
        environ.setdefault(name, str(policy.threads))
    environ.setdefault(TOKENIZERS_VARIABLE, "true" if policy.threads > 1 else "false")
    torch = sys.modules.get("torch")
    if torch is not None and not users and environ is os.environ and torch.get_num_threads() != policy.threads:
        torch.set_num_threads(policy.threads)
    log.debug("threads: %d (%s)", policy.threads, policy.reason)
    return policy
