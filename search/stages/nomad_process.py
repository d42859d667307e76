"""PyNomad in a child process, so that a crash of NOMAD cannot take the search with it.

PyNomad 4.6.0 (the newest release) sometimes dies with ``NOMAD::Exception ... ArrayOfDouble:
Array is not defined`` followed by a segmentation fault. Reproduced on binary problems of 4
and 5 variables with a random objective: 7 of 30 seeds at n = 4, 2 of 10 at n = 5, always once
MADS has evaluated nearly every point of the cube; it killed a toy search in Stage 1
(``results/toy_search/optimizers.md``). A segfault cannot be caught in-process, so MADS runs
in a child that only imports PyNomad; every point it proposes is sent to the parent, which
evaluates it (the LLM stays in the parent) and sends the value back.

If the child dies, the run ends there: the points it had evaluated stay evaluated, and the
caller is told why it stopped. Nothing is retried with other settings, so a resumed search
replays the same calls and ends the same way.

Protocol: one JSON object per line on two pipes. Parent → child: the run (``x0``, ``n``,
``params``), then one ``{"value": v}`` per request, with ``v`` null for "not evaluated"
(budget spent, or the parent's loss failed: NOMAD then fails every later point and stops).
Child → parent: ``{"x": [...]}`` per point, then ``{"done": true}``. NOMAD's own output
goes to a log file whose tail is the crash message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence

Point = tuple[int, ...]


def run_nomad_isolated(evaluate: Callable[[Point], float | None], x0: Sequence[int], params: Sequence[str]) -> str:
    """Run ``PyNomad.optimize`` on binary variables from ``x0`` in a child process.

    Args:
        evaluate: the loss at a point, or ``None`` when the point is not to be evaluated.
            An exception raised here stops NOMAD (every later point fails) and is re-raised
            once the child has ended.
        x0: the start point (0/1 entries); its length is the number of variables.
        params: NOMAD parameter lines (``"BB_INPUT_TYPE * B"``, ``"MAX_BB_EVAL 100"``, ...).

    Returns:
        ``""`` when PyNomad returned normally, else why it did not: the child's exit status
        and NOMAD's last message.
    """
    to_child_read, to_child_write = os.pipe()
    from_child_read, from_child_write = os.pipe()
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", __spec__.name, str(to_child_read), str(from_child_write)],
            pass_fds=(to_child_read, from_child_write),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        os.close(to_child_read)
        os.close(from_child_write)
        failure: list[BaseException] = []
        done = False
        with os.fdopen(from_child_read) as receive:
            try:
                _write(to_child_write, {"n": len(x0), "x0": [int(b) for b in x0], "params": list(params)})
                for line in receive:
                    message = json.loads(line)
                    if message.get("done"):
                        done = True
                        break
                    _write(
                        to_child_write,
                        {"value": None if failure else _evaluate(evaluate, tuple(message["x"]), failure)},
                    )
            except BrokenPipeError:
                pass  # the child died between two messages: its exit status says why
            finally:
                os.close(to_child_write)
        returncode = child.wait()
        if failure:
            raise failure[0]
        if done and returncode == 0:
            return ""
        log.seek(0)
        lines = [line.strip() for line in log.read().splitlines() if line.strip()]
        last = lines[-1] if lines else "no output"
        return f"PyNomad exited with status {returncode}: {last}"


def _evaluate(evaluate: Callable[[Point], float | None], point: Point, failure: list[BaseException]) -> float | None:
    try:
        return evaluate(point)
    except BaseException as error:  # noqa: BLE001 - re-raised by run_nomad_isolated once the child ends
        failure.append(error)
        return None


def _write(fd: int, message: dict) -> None:
    # Unbuffered: a write to a dead peer fails here, with nothing left to flush at close.
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _child_main(receive_fd: int, send_fd: int) -> None:
    import PyNomad  # only the child imports it

    with os.fdopen(receive_fd) as receive:
        run = json.loads(receive.readline())
        n = run["n"]

        def blackbox(eval_point) -> int:  # noqa: ANN001 - a PyNomad.PyNomadEvalPoint
            _write(send_fd, {"x": [int(round(eval_point.get_coord(i))) for i in range(n)]})
            value = json.loads(receive.readline())["value"]
            if value is None:
                return 0
            eval_point.setBBO(repr(value).encode("ascii"))
            return 1

        PyNomad.optimize(blackbox, [float(b) for b in run["x0"]], [0.0] * n, [1.0] * n, run["params"])
        _write(send_fd, {"done": True})


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), int(sys.argv[2]))
