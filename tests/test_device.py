"""The one device choice: a device that exists when none is given, said once; a clear error
for one that does not exist, from every command (search, compare, bench, rank, lm_eval)."""

from __future__ import annotations

import logging
import re
from unittest import mock

import pytest

from bosch_eval.cli import main
from bosch_eval.runtime import device as device_module
from bosch_eval.runtime.device import default_device, pick_device
from bosch_eval.runtime.errors import DeviceError

NO_CUDA = "this torch (test) was built without CUDA"


@pytest.fixture
def no_cuda():
    """A machine where CUDA cannot be used, whatever this one has."""
    with (
        mock.patch.object(device_module, "_cuda_problem", return_value=NO_CUDA),
        mock.patch("torch.cuda.is_available", return_value=False),
    ):
        device_module._say_picked.cache_clear()
        yield
    device_module._say_picked.cache_clear()


class TestPickDevice:
    def test_none_and_auto_pick_the_cpu_without_cuda_and_say_so_once(self, no_cuda, caplog):
        with caplog.at_level(logging.WARNING, logger="bosch_eval"):
            assert pick_device(None) == "cpu" and pick_device("auto") == "cpu" and default_device() == "cpu"
        said = [r.getMessage() for r in caplog.records if "no device given" in r.getMessage()]
        assert said == [f"bosch-eval: no device given; running on cpu ({NO_CUDA})"]

    def test_none_picks_cuda_where_torch_sees_it(self):
        with mock.patch.object(device_module, "_cuda_problem", return_value=None):
            assert pick_device(None) == "cuda"

    def test_cuda_without_cuda_names_the_setting_and_the_way_out(self, no_cuda):
        with pytest.raises(DeviceError, match=re.escape(f"--device 'cuda': {NO_CUDA}; use --device cpu, or give none")):
            pick_device("cuda", "--device")

    def test_a_gpu_index_past_the_count(self):
        with (
            mock.patch.object(device_module, "_cuda_problem", return_value=None),
            mock.patch("torch.cuda.device_count", return_value=1),
        ):
            with pytest.raises(DeviceError, match=r"device 'cuda:3': torch sees 1 CUDA device\(s\) \(cuda:0..cuda:0\)"):
                pick_device("cuda:3")

    def test_not_a_device_name(self):
        with pytest.raises(DeviceError, match=r"device 'gpu0': not a device name .*expected cpu, cuda, cuda:N or auto"):
            pick_device("gpu0")

    def test_cpu_is_returned_as_given(self):
        assert pick_device("cpu") == "cpu"


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--model", "random:attn-heavy", "--lengths", "64", "--device", "cuda", "--out", "OUT"],
        ["search", "--model", "toy", "--ratio", "0.5", "--device", "cuda", "--out", "OUT"],
        ["rank", "--method", "apl", "--model", "toy", "--device", "cuda", "--out", "OUT/r.json"],
        ["compare", "--model", "toy", "--model-args", "device=cuda", "--tasks", "bosch_niah_calib", "--entry", "original=",
         "--limit", "1", "--out", "OUT"],
    ],
    ids=["bench", "search", "rank", "compare"],
)  # fmt: skip
def test_every_command_refuses_cuda_without_it_in_one_line(no_cuda, tmp_path, capsys, argv):
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"bosch-eval: error: {'--device' if argv[0] != 'compare' else 'device'} 'cuda': {NO_CUDA}" in err
    assert "Traceback" not in err and "AssertionError" not in err


class TestSlowCpuBfloat16:
    """bf16 on a CPU without native bf16 instructions is said to be slow; nothing else is."""

    @staticmethod
    def cpu_with(native: bool):  # noqa: ANN205
        return mock.patch.multiple(
            "torch.cpu",
            _is_amx_tile_supported=mock.Mock(return_value=False),
            _is_avx512_bf16_supported=mock.Mock(return_value=native),
        )

    def test_bf16_on_a_cpu_without_amx_or_avx512_bf16_is_named_with_the_faster_dtype(self):
        import torch

        with self.cpu_with(native=False):
            problem = device_module.slow_cpu_bfloat16(torch.bfloat16, "cpu")
        assert problem is not None and "without AMX or AVX512-BF16" in problem and "dtype=float32 is faster" in problem

    def test_native_bf16_float32_and_gpus_are_not_warned_about(self):
        import torch

        with self.cpu_with(native=True):
            assert device_module.slow_cpu_bfloat16(torch.bfloat16, "cpu") is None
        with self.cpu_with(native=False):
            assert device_module.slow_cpu_bfloat16(torch.float32, "cpu") is None
            assert device_module.slow_cpu_bfloat16(torch.bfloat16, "cuda:0") is None

    def test_the_adapter_warns_once_when_it_loads_bf16_on_such_a_cpu(self, tiny_model_dir, caplog):
        from bosch_eval.model_adapters.bosch import BoschLM

        device_module.warn_slow_cpu_bfloat16.cache_clear()
        with self.cpu_with(native=False), caplog.at_level(logging.WARNING, logger="bosch_eval"):
            BoschLM(pretrained=str(tiny_model_dir), device="cpu", dtype="bfloat16", mask="full")
            BoschLM(pretrained=str(tiny_model_dir), device="cpu", dtype="bfloat16", mask="full")
        assert caplog.text.count("without AMX or AVX512-BF16") == 1
