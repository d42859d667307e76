"""The processes of an ``accelerate launch``, as the search, its CLI and the ``bosch``
adapter share them: one accelerate state, lm-eval told each process's share, and work done
on the main process alone with its result, or its error, on every process (were the error
not broadcast, the others would wait forever for the result).

CPU processes: under a launcher (``WORLD_SIZE`` > 1) on CPU, accelerate joins the processes
over gloo only when its state is first created with ``cpu=True``; a plain ``PartialState()``
on a machine without GPUs leaves every process alone, each scoring every document.
``accelerate launch --cpu`` starts a single process unless given an MPI hostfile, so CPU
processes are started with ``accelerate launch --multi_gpu --num_processes N`` (or
``torchrun --nproc_per_node N``) and ``--device cpu``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from accelerate import Accelerator, PartialState
from accelerate.utils import broadcast_object_list

from bosch_eval.runtime.errors import LaunchError

if TYPE_CHECKING:
    from lm_eval.models.huggingface import HFLM

T = TypeVar("T")


def launched_processes() -> int:
    """How many processes the launcher started (``WORLD_SIZE``; 1 outside a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def join_cpu_processes(device: str) -> None:
    """Under a launcher on CPU, create accelerate's state with ``cpu=True`` (gloo) before
    anything else (HFLM's ``Accelerator()``) creates it without."""
    if launched_processes() > 1 and device.split(":")[0] == "cpu":
        PartialState(cpu=True)


def launch_state(device: str = "cpu") -> PartialState:
    """accelerate's process state, set up for ``device`` before anything else touches it.

    Call this before the first ``PartialState()``/``Accelerator()`` of the program
    (``build_objective`` does, too late if the caller made one already); outside a launcher
    it is ``PartialState()``.

    Raises:
        LaunchError: launched as N processes, but accelerate's state already exists for
            another number (it was created earlier, without ``cpu=True``).
    """
    join_cpu_processes(device)
    state = PartialState()
    launched = launched_processes()
    if launched > 1 and state.num_processes != launched:
        raise LaunchError(
            f"launched as {launched} processes, but accelerate's state was created for {state.num_processes}: "
            "something called PartialState()/Accelerator() before launch_state(device); on a machine "
            "without GPUs that leaves every process alone (each would score every document and write "
            "every file). Call bosch_eval.runtime.launch.launch_state(device) first."
        )
    return state


@functools.cache
def destroy_process_group_at_exit() -> None:
    """Tear the launch's process group down when the interpreter exits (registered once).

    Left to interpreter shutdown, gloo's threads can be destroyed while still joinable and
    the process aborts ("terminate called without an active exception"), failing the
    whole launch after every score was written.
    """
    atexit.register(PartialState().destroy_process_group)


@dataclass
class ProcessShard:
    """Which share of the documents lm-eval gives this process: ``rank`` of ``world_size``
    (the ``bosch`` adapter's ``rank`` and ``world_size``, which lm-eval reads to shard)."""

    rank: int = 0
    world_size: int = 1

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """Meanwhile lm-eval sees one process: this process scores every request it is given,
        with no sharding and no collectives (the search's mask-parallel evaluation)."""
        rank, world = self.rank, self.world_size
        self.rank, self.world_size = 0, 1
        try:
            yield
        finally:
            self.rank, self.world_size = rank, world


def shard_over_processes(lm: HFLM, hflm: ProcessShard) -> ProcessShard:
    """Under ``accelerate launch`` with N > 1 processes, make lm-eval give each process
    its own 1/N of the documents (``rank`` = global process index, ``world_size`` = N);
    else HFLM's own share, ``hflm``.

    HFLM (lm-eval 0.4.13) turns data parallelism on only when more than one GPU is
    visible, so CPU processes (gloo) and one-GPU nodes each scored every document;
    it takes ``local_process_index`` as the rank, so across nodes two processes
    scored the same shard and gathered duplicates; and it keeps world size 1 for a
    preloaded model. lm-eval's ``evaluate`` reaches the processes through
    ``lm.accelerator`` (gather, barrier) and ``torch.distributed`` (gather_object).
    The device stays HFLM's: the accelerator's (``cuda:<local index>`` on GPU nodes,
    ``cpu`` under ``--cpu``) for a model loaded by name, the model's own when preloaded.
    """
    state = PartialState()
    if state.num_processes <= 1:
        if launched_processes() > 1:
            warnings.warn(
                f"bosch: launched as {launched_processes()} processes, but accelerate's state was created "
                "for one (a PartialState()/Accelerator() without cpu=True on a machine without GPUs); "
                "every process will score every request. Pass device=cpu to the adapter, or create "
                "PartialState(cpu=True) first.",
                RuntimeWarning,
                stacklevel=3,
            )
        return hflm
    destroy_process_group_at_exit()
    if getattr(lm, "accelerator", None) is None:
        lm.accelerator = Accelerator()  # shares the launch's process group
    return ProcessShard(state.process_index, state.num_processes)


def on_main_then_everywhere(action: Callable[[], T] | None, error: type[Exception], processes: int) -> T:
    """Run ``action`` on the main process (every other process passes None) and return its
    result on all ``processes``.

    Raises:
        error: ``action`` raised it; every process raises it, with its message, instead of
            the others waiting for a broadcast that never comes.
    """
    payload: list[Any] = [None]
    if action is not None:
        try:
            payload = [(action(),)]
        except error as err:
            payload = [str(err)]
    if processes > 1:
        broadcast_object_list(payload, from_process=0)
    if isinstance(payload[0], str):
        raise error(payload[0])
    return payload[0][0]
