"""Training data for ``bosch-eval train``: sources, packing into fixed-length sequences,
and a stream that resumes at the very token where it stopped."""

from __future__ import annotations

import json

import pytest
import torch

from bosch_eval.models.random_model import train_tokenizer
from bosch_eval.runtime.errors import SettingsError
from bosch_eval.train.data import PackedSequences, open_source

DOCS = ["the quick brown fox", "a needle in the haystack: 7 3 1", "what colour is the box", "red green blue"]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


def reference_stream(tokenizer, docs: list[str], total: int) -> list[int]:
    """Documents + EOS, one after another, as many epochs as it takes."""
    ids: list[int] = []
    while len(ids) < total:
        for doc in docs:
            ids += tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return ids[:total]


class TestSources:
    def test_jsonl_files_in_order_then_start_over(self, tokenizer, tmp_path):
        (tmp_path / "a.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in DOCS[:2]))
        (tmp_path / "b.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in DOCS[2:]))
        stream = PackedSequences(open_source(str(tmp_path), 7, 0, text_field="body"), tokenizer, 7)
        batch = stream.next_batch(9)
        assert batch.shape == (9, 7)
        assert batch.flatten().tolist() == reference_stream(tokenizer, DOCS, 63)
        assert stream.source.epoch >= 1

    def test_a_text_file_is_one_document(self, tokenizer, tmp_path):
        (tmp_path / "doc.txt").write_text("line one\nline two\n")
        stream = PackedSequences(open_source(str(tmp_path / "doc.txt"), 5, 0), tokenizer, 5)
        assert stream.next_batch(2).flatten().tolist() == reference_stream(tokenizer, ["line one\nline two\n"], 10)

    def test_a_saved_dataset_directory(self, tokenizer, tmp_path):
        import datasets

        datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(tmp_path / "ds"))
        stream = PackedSequences(open_source(str(tmp_path / "ds"), 6, 0), tokenizer, 6)
        assert stream.next_batch(3).flatten().tolist() == reference_stream(tokenizer, DOCS, 18)

    def test_toy_documents_are_seeded(self, tokenizer):
        first, again, other = (
            PackedSequences(open_source("toy", 64, seed), tokenizer, 64).next_batch(2) for seed in (0, 0, 1)
        )
        assert torch.equal(first, again) and not torch.equal(first, other)

    def test_bad_sources_are_named(self, tmp_path):
        (tmp_path / "empty").mkdir()
        (tmp_path / "x.jsonl").write_text(json.dumps({"body": "a"}) + "\n")
        with pytest.raises(SettingsError, match="--data nowhere: expected 'toy', 'hf:NAME"):
            open_source("nowhere", 8, 0)
        with pytest.raises(SettingsError, match="a directory with no .txt or .jsonl files"):
            open_source(str(tmp_path / "empty"), 8, 0)
        with pytest.raises(
            SettingsError, match=r"no field 'text' in its records \(fields: \['body'\]\); pass --text-field"
        ):
            open_source(str(tmp_path / "x.jsonl"), 8, 0)


@pytest.mark.parametrize("spec", ["toy", "jsonl"])
def test_state_dict_resumes_at_the_same_token(tokenizer, tmp_path, spec):
    if spec == "jsonl":
        (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
        spec = str(tmp_path / "d.jsonl")
    whole = PackedSequences(open_source(spec, 11, 0), tokenizer, 11)
    expected = [whole.next_batch(3) for _ in range(4)]
    first = PackedSequences(open_source(spec, 11, 0), tokenizer, 11)
    got = [first.next_batch(3) for _ in range(2)]
    state = json.loads(json.dumps(first.state_dict()))  # plain data, as a checkpoint holds it
    resumed = PackedSequences(open_source(spec, 11, 0), tokenizer, 11)
    resumed.load_state_dict(state)
    got += [resumed.next_batch(3) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.slow
def test_an_unreachable_hub_dataset_is_an_error_naming_data():
    """No hub here: the offline switch makes the failure immediate and deterministic."""
    import os
    import subprocess
    import sys

    code = (
        "from bosch_eval.train.data import open_source\n"
        "from bosch_eval.runtime.errors import SettingsError\n"
        "try:\n    open_source('hf:nobody/no-such-dataset', 16, 0)\nexcept SettingsError as err:\n    print(err)\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert (
        "--data hf:nobody/no-such-dataset: could not load Hugging Face dataset 'nobody/no-such-dataset' split 'train'"
        in result.stdout
    )
