"""``bosch-eval train``: the loop against a hand-written reference, resume after a kill,
the checkpoint through the ``bosch`` adapter, YaRN on the trained config, and the errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bosch_eval.cli import main
from bosch_eval.runtime.errors import MaskError, SettingsError
from bosch_eval.train import trainer
from bosch_eval.train.trainer import TrainSettings, latest_state, train
from tests.helpers import MASK_SOURCE, settings_for


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def reference_weights(settings: TrainSettings) -> dict[str, torch.Tensor]:
    """The obvious loop: same data, AdamW, schedule, accumulation and clipping, no Accelerate."""
    from transformers import get_scheduler

    from bosch_eval.train.data import PackedSequences, open_source

    model, tokenizer, _ = trainer.load_model(settings, torch.device("cpu"))
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.95)
    )
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=1, num_training_steps=settings.steps)
    stream = PackedSequences(open_source("toy", settings.seq_len, settings.seed), tokenizer, settings.seq_len)
    accumulation = settings.batch_size // settings.micro_batch_size
    for _ in range(settings.steps):
        batch = stream.next_batch(settings.batch_size)
        for chunk in batch.split(settings.micro_batch_size):
            (model(input_ids=chunk, labels=chunk).loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


class TestTrainingLoop:
    def test_matches_a_plain_torch_loop(self, tiny_model_dir, tmp_path):
        settings = settings_for(tiny_model_dir)
        out = train(settings, tmp_path / "run", progress_bar=False)
        got, expected = weights(out), reference_weights(settings)
        original = load_file(tiny_model_dir / "model.safetensors")
        assert any(not torch.equal(got[name], original[name]) for name in got)  # it trained
        for name in got:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)

    def test_log_has_loss_and_throughput_per_step(self, tiny_model_dir, tmp_path):
        out = train(settings_for(tiny_model_dir, steps=2), tmp_path / "run", progress_bar=False)
        records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [1, 2] and all(r["tokens_per_s"] > 0 and r["loss"] > 0 for r in records)
        assert records[-1]["tokens"] == 2 * 4 * 48
        summary = json.loads((out / "training.json").read_text())
        assert summary["settings"]["mask_source"] == MASK_SOURCE and summary["versions"]["accelerate"]

    @pytest.mark.parametrize("backend", ["blocked", "sdpa"])
    def test_bf16_autocast_trains_fp32_weights(self, tiny_model_dir, tmp_path, backend):
        """Accelerate's mixed precision (bf16 autocast, as on GPU) through the hybrid kernels."""
        from accelerate.state import AcceleratorState

        runs = {}
        for precision in ("no", "bf16"):
            # Accelerate keeps one state per process; its own tests reset it to change precision.
            AcceleratorState._reset_state()
            runs[precision] = train(settings_for(tiny_model_dir, steps=2, mixed_precision=precision, attn_backend=backend),
                                    tmp_path / precision, progress_bar=False)  # fmt: skip
        AcceleratorState._reset_state()
        losses = {
            p: [r["loss"] for r in json.loads((out / "training.json").read_text())["history"]]
            for p, out in runs.items()
        }
        assert losses["bf16"] != losses["no"] and losses["bf16"] == pytest.approx(losses["no"], abs=2e-2)
        assert all(t.dtype == torch.float32 for t in weights(runs["bf16"]).values())


class TestTheModelIsGivenBack:
    """The run hybridizes its model for the run only (issue 55): finished or failed, the model
    leaves with the attention it was loaded with, no mask in its config and no hybrid handle."""

    @staticmethod
    def watch_loads(monkeypatch) -> list:
        handles = []
        load_model = trainer.load_model

        def watched(settings, device):
            model, tokenizer, hybrid = load_model(settings, device)
            handles.append(hybrid)
            return model, tokenizer, hybrid

        monkeypatch.setattr(trainer, "load_model", watched)
        return handles

    @staticmethod
    def assert_as_loaded(model, path) -> None:
        from transformers import AutoModelForCausalLM

        from bosch_eval.attention.hybrid_attention import hybrid_state

        plain = AutoModelForCausalLM.from_pretrained(path)
        assert model.config._attn_implementation == plain.config._attn_implementation
        assert not hasattr(model.config, "bosch_mask")
        with pytest.raises(RuntimeError, match="is not hybridized"):
            hybrid_state(model)

    def test_after_a_finished_run(self, tiny_model_dir, tmp_path, monkeypatch):
        handles = self.watch_loads(monkeypatch)
        out = train(settings_for(tiny_model_dir, steps=1), tmp_path / "run", progress_bar=False)
        assert "bosch_mask" in json.loads((out / "config.json").read_text())  # saved while hybridized
        (hybrid,) = handles
        assert hybrid.restored
        self.assert_as_loaded(hybrid.model, tiny_model_dir)

    def test_after_a_run_that_fails(self, tiny_model_dir, tmp_path, monkeypatch):
        handles = self.watch_loads(monkeypatch)
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "other.txt").write_text("not a run")
        with pytest.raises(SettingsError, match="not empty"):
            train(settings_for(tiny_model_dir, steps=1), tmp_path / "run", progress_bar=False)
        (hybrid,) = handles
        self.assert_as_loaded(hybrid.model, tiny_model_dir)


class Killed(Exception):
    """Stands for a kill of the training process."""


def run_killed_after_state(settings: TrainSettings, out: Path, monkeypatch, save_every: int, kill_at_step: int) -> None:
    """Train into ``out`` and stop as a kill would, right after the state of ``kill_at_step`` is written."""
    save_state = trainer._save_state

    def killed(accelerator, out, step, keep):
        save_state(accelerator, out, step, keep)
        if step == kill_at_step:
            raise Killed

    monkeypatch.setattr(trainer, "_save_state", killed)
    with pytest.raises(Killed):
        train(settings, out, save_every=save_every, progress_bar=False)
    monkeypatch.setattr(trainer, "_save_state", save_state)


class TestResume:
    def test_kill_after_a_state_then_resume_ends_with_the_same_weights(self, tiny_model_dir, tmp_path, monkeypatch):
        settings = settings_for(tiny_model_dir, steps=5)
        whole = train(settings, tmp_path / "whole", save_every=2, progress_bar=False)

        run_killed_after_state(settings, tmp_path / "resumed", monkeypatch, save_every=2, kill_at_step=4)
        assert latest_state(tmp_path / "resumed").name == "step-00000004"
        with (tmp_path / "resumed" / "train_log.jsonl").open("a") as log:
            log.write('{"step": 5, "loss": 9.9}\n')  # as logged by a run killed after the state at step 4
        assert not (tmp_path / "resumed" / "model.safetensors").exists()
        resumed = train(settings, tmp_path / "resumed", resume=True, save_every=2, progress_bar=False)

        a, b = weights(whole), weights(resumed)
        assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
        steps = [json.loads(line)["step"] for line in (resumed / "train_log.jsonl").read_text().splitlines()]
        assert steps == [1, 2, 3, 4, 5]
        losses = [
            [record["loss"] for record in json.loads((run / "training.json").read_text())["history"]]
            for run in (whole, resumed)
        ]
        assert losses[0] == losses[1]

    def test_resume_from_an_earlier_state_with_the_stream_mid_document(self, tiny_model_dir, tmp_path, monkeypatch):
        """The first state (step 2) is the one resumed; the packed stream holds a partial document there."""
        settings = settings_for(tiny_model_dir, steps=3, seq_len=40)
        whole = train(settings, tmp_path / "whole", progress_bar=False)
        run_killed_after_state(settings, tmp_path / "resumed", monkeypatch, save_every=2, kill_at_step=2)
        stream_state = torch.load(latest_state(tmp_path / "resumed") / "custom_checkpoint_1.pkl", weights_only=False)
        assert stream_state["buffer"]  # tokens of a document cut at the sequence boundary
        resumed = train(settings, tmp_path / "resumed", resume=True, save_every=2, progress_bar=False)
        a, b = weights(whole), weights(resumed)
        assert all(torch.equal(a[name], b[name]) for name in a)

    def test_resume_on_the_toy_model_with_tied_embeddings(self, tmp_path, monkeypatch):
        """The toy ties lm_head to the embeddings; Accelerate's state drops the shared copy."""
        settings = replace(settings_for(Path("."), steps=3, seq_len=64, batch_size=2, micro_batch_size=1),
                           model="toy", mask_source="layers=intr,ratio=0.5")  # fmt: skip
        whole = train(settings, tmp_path / "whole", progress_bar=False)
        run_killed_after_state(settings, tmp_path / "resumed", monkeypatch, save_every=1, kill_at_step=1)
        resumed = train(settings, tmp_path / "resumed", resume=True, save_every=1, progress_bar=False)
        a, b = weights(whole), weights(resumed)
        assert all(torch.equal(a[name], b[name]) for name in a)
        assert json.loads((resumed / "config.json").read_text())["bosch_mask"]["window"] == 32  # the toy's default W

    def test_an_interrupted_save_is_not_resumed_from(self, tmp_path):
        (tmp_path / "state" / "step-00000002").mkdir(parents=True)
        (tmp_path / "state" / "step-00000004.tmp").mkdir()
        assert latest_state(tmp_path).name == "step-00000002"

    def test_old_states_are_pruned(self, tiny_model_dir, tmp_path):
        out = train(
            settings_for(tiny_model_dir, steps=4, batch_size=2),
            tmp_path / "run",
            save_every=1,
            keep_states=2,
            progress_bar=False,
        )
        assert sorted(p.name for p in (out / "state").iterdir()) == ["step-00000002", "step-00000003"]


class TestCheckpoint:
    def test_lm_eval_adapter_loads_the_trained_model_with_its_mask(self, tiny_model_dir, tmp_path):
        from bosch_eval.attention.hybrid_attention import hybrid_state
        from bosch_eval.model_adapters.bosch import BoschLM

        settings = settings_for(tiny_model_dir, steps=2)
        out = train(settings, tmp_path / "run", export_every=1, progress_bar=False)
        model, _, hybrid = trainer.load_model(settings, torch.device("cpu"))
        mask = hybrid.mask
        lm = BoschLM(pretrained=str(out), device="cpu")
        assert lm.head_mask.bits == mask.bits and 0 < mask.swa_ratio < 1 and lm.hybrid.window == 8
        ids = torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(0))
        trained = weights(out)
        model.load_state_dict(trained, strict=False)
        model.tie_weights()
        with torch.no_grad():  # the adapter's model is the trained hybrid: same logits as the loop's model
            torch.testing.assert_close(lm.model(ids).logits, model.eval()(ids).logits)
        assert hybrid_state(lm.model).mask.bits == mask.bits
        exported = tmp_path / "run" / "step-00000001"
        assert BoschLM(pretrained=str(exported), device="cpu").head_mask.bits == mask.bits
        assert not torch.equal(
            weights(exported)["model.layers.0.self_attn.q_proj.weight"],
            trained["model.layers.0.self_attn.q_proj.weight"],
        )

    def test_a_hybrid_checkpoint_trains_on_with_its_saved_mask(self, tiny_model_dir, tmp_path):
        first = train(settings_for(tiny_model_dir, steps=1), tmp_path / "first", progress_bar=False)
        second = train(settings_for(first, mask_source=None, steps=1), tmp_path / "second", progress_bar=False)
        assert (
            json.loads((second / "config.json").read_text())["bosch_mask"]
            == json.loads((first / "config.json").read_text())["bosch_mask"]
        )
        with pytest.raises(MaskError, match="differs from the mask saved in"):
            train(
                settings_for(first, mask_source="layers=intr,ratio=0.5,window=8", steps=1),
                tmp_path / "third",
                progress_bar=False,
            )


class TestYarn:
    def test_training_with_yarn_writes_the_scaled_config(self, tiny_model_dir, tmp_path):
        from bosch_eval.model_adapters.bosch import BoschLM

        out = train(
            settings_for(tiny_model_dir, steps=1, rope_scaling="yarn", rope_factor=2.0),
            tmp_path / "run",
            progress_bar=False,
        )
        config = json.loads((out / "config.json").read_text())
        assert config["rope_parameters"] == {
            "rope_theta": 10000.0,
            "rope_type": "yarn",
            "factor": 2.0,
            "original_max_position_embeddings": 512,
        }
        assert config["max_position_embeddings"] == 1024
        lm = BoschLM(pretrained=str(out), device="cpu")
        assert lm.model.model.rotary_emb.rope_type == "yarn" and lm.max_length == 1024


class TestErrors:
    def test_cli_runs_and_names_bad_input(self, tiny_model_dir, tmp_path, capsys):
        base = [
            "train",
            "--model",
            str(tiny_model_dir),
            "--data",
            "toy",
            "--seq-len",
            "32",
            "--batch-size",
            "2",
            "--no-progress-bar",
        ]
        assert main([*base, "--mask-source", MASK_SOURCE, "--steps", "1", "--out", str(tmp_path / "ok")]) == 0
        assert (tmp_path / "ok" / "model.safetensors").is_file()
        cases = [
            (["--mask-source", MASK_SOURCE, "--steps", "1", "--out", str(tmp_path / "ok")], "not empty; pass --resume"),
            (
                ["--mask-source", MASK_SOURCE, "--steps", "2", "--out", str(tmp_path / "ok"), "--resume"],
                "field 'steps' was 1, this run has 2",
            ),
            (
                ["--mask-source", MASK_SOURCE, "--steps", "1", "--out", str(tmp_path / "none"), "--resume"],
                "nothing to resume",
            ),
            (
                ["--mask-source", "layers=bme,ratio=0.5,windw=8", "--steps", "1", "--out", str(tmp_path / "a")],
                "unknown keys ['windw']",
            ),
            (["--steps", "1", "--out", str(tmp_path / "b")], "not a hybrid checkpoint"),
            (
                ["--mask-source", MASK_SOURCE, "--steps", "1", "--micro-batch-size", "3", "--out", str(tmp_path / "c")],
                "not a multiple of",
            ),
            (
                ["--mask-source", MASK_SOURCE, "--steps", "1", "--rope-factor", "2", "--out", str(tmp_path / "d")],
                "--rope-factor: only used with",
            ),
            (
                ["--mask-source", MASK_SOURCE, "--steps", "0", "--out", str(tmp_path / "e")],
                "--steps: expected a positive integer",
            ),
        ]
        for extra, message in cases:
            assert main([*base, *extra]) == 2, extra
            assert message in capsys.readouterr().err.replace("\n", " ")
        assert not (tmp_path / "a").exists()  # a bad mask source is refused before the run directory is made
        with pytest.raises(SettingsError, match="--data nowhere.jsonl: expected 'toy'"):
            train(settings_for(tiny_model_dir, data="nowhere.jsonl"), tmp_path / "f", progress_bar=False)
