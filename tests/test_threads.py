"""``bosch_eval.runtime.threads``: one thread less than the usable cores, the user's variables win,
and ``bosch-eval`` applies it before torch loads (issue 40: 55 min with one thread per core
beside a busy process, 5 min with one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from bosch_eval.runtime import threads
from bosch_eval.runtime.threads import THREAD_VARIABLES, apply_thread_policy, cgroup_cpu_limit, decide


class TestDecide:
    @pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 1), (4, 3), (16, 15)])
    def test_one_core_is_left_for_other_work(self, cores: int, expected: int) -> None:
        assert decide({}, cores=cores).threads == expected

    @pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "MKL_NUM_THREADS"])
    def test_the_users_count_wins(self, name: str) -> None:
        policy = decide({name: "6"}, cores=2)
        assert policy.threads == 6 and name in policy.reason

    @pytest.mark.parametrize("value", ["", "0", "many"])
    def test_a_count_that_is_not_one_is_ignored(self, value: str) -> None:
        assert decide({"OMP_NUM_THREADS": value}, cores=4).threads == 3

    def test_usable_cores_follow_the_affinity_and_the_quota(self) -> None:
        with mock.patch.object(threads.os, "sched_getaffinity", return_value={0, 1, 2, 3, 4, 5}), \
                mock.patch.object(threads, "cgroup_cpu_limit", return_value=None):  # fmt: skip
            assert threads.usable_cores() == 6
        with mock.patch.object(threads.os, "sched_getaffinity", return_value={0, 1, 2, 3, 4, 5}), \
                mock.patch.object(threads, "cgroup_cpu_limit", return_value=2):  # fmt: skip
            assert threads.usable_cores() == 2


class TestCgroup:
    def write(self, root: Path, files: dict[str, str]) -> None:
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)

    @pytest.mark.parametrize(
        ("cpu_max", "expected"), [("150000 100000\n", 2), ("100000 100000\n", 1), ("max 100000\n", None)]
    )
    def test_cgroup_v2(self, tmp_path: Path, cpu_max: str, expected: int | None) -> None:
        self.write(tmp_path, {"proc": "0::/job/step\n", "fs/job/step/cpu.max": cpu_max})
        assert cgroup_cpu_limit(tmp_path / "fs", tmp_path / "proc") == expected

    @pytest.mark.parametrize(("quota", "expected"), [("250000", 3), ("-1", None)])
    def test_cgroup_v1(self, tmp_path: Path, quota: str, expected: int | None) -> None:
        self.write(tmp_path, {
            "proc": "4:memory:/x\n2:cpu,cpuacct:/slurm/job\n0::/\n",
            "fs/cpu,cpuacct/slurm/job/cpu.cfs_quota_us": quota, "fs/cpu,cpuacct/slurm/job/cpu.cfs_period_us": "100000",
        })  # fmt: skip
        assert cgroup_cpu_limit(tmp_path / "fs", tmp_path / "proc") == expected

    def test_nothing_readable_is_no_quota(self, tmp_path: Path) -> None:
        assert cgroup_cpu_limit(tmp_path / "fs", tmp_path / "missing") is None


class TestApply:
    def test_sets_what_the_user_left_unset(self) -> None:
        environ = {"MKL_NUM_THREADS": "5"}
        with mock.patch.object(threads, "usable_cores", return_value=2):
            policy = apply_thread_policy(environ)
        assert policy.threads == 5  # MKL_NUM_THREADS counts as the user's choice
        assert environ == {
            "MKL_NUM_THREADS": "5", "OMP_NUM_THREADS": "5", "OPENBLAS_NUM_THREADS": "5", "RAYON_NUM_THREADS": "5",
            "TOKENIZERS_PARALLELISM": "true",
        }  # fmt: skip

    def test_one_thread_turns_tokenizers_parallelism_off(self) -> None:
        environ: dict[str, str] = {}
        with mock.patch.object(threads, "usable_cores", return_value=2):
            apply_thread_policy(environ)
        assert {name: environ[name] for name in THREAD_VARIABLES} == dict.fromkeys(THREAD_VARIABLES, "1")
        assert environ["TOKENIZERS_PARALLELISM"] == "false"

    def test_sets_a_loaded_torch_directly(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``lm_eval --model bosch``: lm-eval has imported torch before the adapter exists."""
        import torch

        before = torch.get_num_threads()
        for name in (*THREAD_VARIABLES, "TOKENIZERS_PARALLELISM"):
            monkeypatch.delenv(name, raising=False)
        try:
            with mock.patch.object(threads, "usable_cores", return_value=3):
                apply_thread_policy()
            assert torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
        finally:
            torch.set_num_threads(before)


CHILD = """
import os, sys
os.sched_getaffinity = lambda pid: {0, 1}  # two usable cores, as on the machine of issue 40
from bosch_eval.cli import main
assert "torch" not in sys.modules
assert main(["toy-model", "--path"]) == 0
import torch
print("THREADS", torch.get_num_threads(), os.environ["OMP_NUM_THREADS"])
"""


@pytest.mark.slow
@pytest.mark.skipif(
    (os.cpu_count() or 1) < 2, reason="torch runs at most one thread per core: one core shows no difference"
)
@pytest.mark.parametrize(("user", "expected"), [(None, "1 1"), ("2", "2 2")])
def test_the_cli_sets_the_count_before_torch_loads(user: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (*THREAD_VARIABLES, "TOKENIZERS_PARALLELISM")}
    if user is not None:
        env["OMP_NUM_THREADS"] = user
    quota = threads.cgroup_cpu_limit()  # the child reads this machine's cgroup
    if quota is not None and quota < 2:
        pytest.skip(f"a cgroup CPU quota of {quota} core caps the child's count")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"THREADS {expected}" in out.stdout
