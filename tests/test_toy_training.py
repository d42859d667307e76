"""The toy model's corpus and trainer: deterministic documents, answer marking, and a
two-step training run that writes a loadable checkpoint."""

from __future__ import annotations

import json
import random

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from bosch_eval.models.random_model import train_tokenizer
from bosch_eval.toy.corpus import DocumentMaker
from bosch_eval.toy.train import encode, main


def text(pieces):
    return "".join(piece for piece, _ in pieces)


def test_documents_are_deterministic_for_a_seed():
    mix = {"short_recall": 1, "recall": 1, "ruler": 1, "niah_single_1": 1, "calib": 1, "prose": 1}
    first = [text(DocumentMaker(random.Random(3)).document(200, mix)) for _ in range(4)]
    again = [text(DocumentMaker(random.Random(3)).document(200, mix)) for _ in range(4)]
    other = [text(DocumentMaker(random.Random(4)).document(200, mix)) for _ in range(4)]
    assert first == again and first != other


def test_ruler_documents_end_with_question_prefix_and_answer():
    maker = DocumentMaker(random.Random(0))
    for _ in range(20):
        pieces = maker.ruler(300)
        question, (answer, is_answer) = pieces[0][0], pieces[1]
        assert is_answer and answer.strip() in question  # the needle holds the answer
        assert question.endswith("mentioned in the provided text is")
        assert "What is the special magic" in question and question.count("One of the special magic") >= 1


def test_encode_marks_exactly_the_answer_tokens():
    tokenizer = train_tokenizer()
    pieces = [("alpha: 123\nalpha?", False), (" 123", True), ("\n", False)]
    ids, answer = encode(tokenizer, pieces, max_tokens=1000)
    marked = tokenizer.decode([i for i, a in zip(ids, answer, strict=True) if a])
    assert marked.strip() == "123" and not answer[0]


@pytest.mark.slow  # a whole toy training run ending in its held-out evaluation
def test_two_training_steps_write_a_loadable_checkpoint(tmp_path):
    main(["--out", str(tmp_path), "--steps", "2", "--hidden", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2",
          "--head-dim", "16", "--vocab", "400", "--start-len", "48", "--max-len", "64", "--batch-tokens", "128",
          "--eval-every", "1000"])  # fmt: skip
    config = AutoModelForCausalLM.from_pretrained(tmp_path).config
    assert (config.num_key_value_heads, config.head_dim) == (2, 16)  # 4 heads of 16 on a 32-wide model
    assert len(AutoTokenizer.from_pretrained(tmp_path)) == 400
    summary = json.loads((tmp_path / "training.json").read_text())
    assert summary["wall_time_s"] > 0 and "ruler_acc@512" in summary["final"]


@pytest.mark.slow  # two or three toy training runs, each ending in its held-out evaluation
def test_resume_after_an_interruption_ends_with_the_same_weights(tmp_path, monkeypatch):
    import pytest
    import torch
    from safetensors.torch import load_file

    import bosch_eval.toy.train as train

    tiny = ["--steps", "4", "--eval-every", "2", "--hidden", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2",
            "--vocab", "400", "--start-len", "48", "--max-len", "64", "--batch-tokens", "128", "--curriculum-steps", "3"]  # fmt: skip
    main(["--out", str(tmp_path / "whole"), *tiny])

    save_state = train.save_state

    def killed_after_first_checkpoint(*args, **kwargs):
        save_state(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "save_state", killed_after_first_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        main(["--out", str(tmp_path / "resumed"), *tiny])
    monkeypatch.setattr(train, "save_state", save_state)
    main(["--out", str(tmp_path / "resumed"), *tiny, "--resume"])

    whole, resumed = (load_file(tmp_path / run / "model.safetensors") for run in ("whole", "resumed"))
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)
    steps = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "train_log.jsonl").read_text().splitlines()]
    assert steps == [0, 3]


@pytest.mark.slow  # two or three toy training runs, each ending in its held-out evaluation
def test_stop_after_keeps_the_schedule_of_the_whole_run(tmp_path, monkeypatch):
    """toy-l's weights are its run's state at step 2500 of 6000: --stop-after N must give the
    weights a --steps run had after N steps (same schedule), not a shorter schedule's."""
    import pytest
    import torch
    from safetensors.torch import load_file

    import bosch_eval.toy.train as train

    tiny = ["--steps", "4", "--eval-every", "2", "--hidden", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2",
            "--vocab", "400", "--start-len", "48", "--max-len", "64", "--batch-tokens", "128", "--curriculum-steps", "3"]  # fmt: skip
    save_state = train.save_state

    def killed_after_first_checkpoint(*args, **kwargs):
        save_state(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "save_state", killed_after_first_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        main(["--out", str(tmp_path / "whole"), *tiny])
    monkeypatch.setattr(train, "save_state", save_state)
    at_step_2 = torch.load(tmp_path / "whole" / "train_state.pt", weights_only=False)
    assert at_step_2["next_step"] == 2

    main(["--out", str(tmp_path / "cut"), *tiny, "--stop-after", "2"])
    cut = load_file(tmp_path / "cut" / "model.safetensors")
    assert all(torch.equal(cut[name], at_step_2["model"][name]) for name in cut)  # tied lm_head is not saved
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "bad"), *tiny, "--stop-after", "5"])


@pytest.mark.slow  # two or three toy training runs, each ending in its held-out evaluation
def test_init_from_starts_at_the_checkpoints_weights(tmp_path, capsys):
    import pytest
    import torch
    from safetensors.torch import load_file

    tiny = ["--hidden", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--vocab", "400", "--start-len", "48",
            "--max-len", "64", "--batch-tokens", "128", "--eval-every", "1000"]  # fmt: skip
    main(["--out", str(tmp_path / "first"), "--steps", "2", *tiny])
    main(
        ["--out", str(tmp_path / "second"), "--steps", "1", "--lr", "0", "--init-from", str(tmp_path / "first"), *tiny]
    )
    first, second = (load_file(tmp_path / run / "model.safetensors") for run in ("first", "second"))
    assert all(torch.equal(first[name], second[name]) for name in first)  # lr 0: the stage starts where the first ended

    wider = [*tiny[:1], "64", *tiny[2:]]
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "bad"), "--steps", "1", "--init-from", str(tmp_path / "first"), *wider])
    assert "--init-from" in capsys.readouterr().err


def test_calib_documents_use_the_calibration_template_and_hold_their_answer():
    from bosch_eval.tasks.niah import calibration

    maker = DocumentMaker(random.Random(0))
    for _ in range(20):
        (prompt, _), (answer, is_answer), _ = maker.calib(300)
        key = prompt.rsplit("The vault code of ", 1)[1].removesuffix(" is")
        assert is_answer and prompt.startswith(calibration.INSTRUCTION)
        assert calibration.NEEDLE.format(key=key, value=answer.strip()) in prompt
        assert prompt.endswith(calibration.QUERY.format(key=key))


def test_keyed_documents_answer_the_asked_names_values_in_order_among_distractors():
    import re

    from bosch_eval.tasks.niah import retrieval_calib
    from bosch_eval.toy.corpus import _KEYED_EXCLUDED

    name = r"[A-Z][a-z]+ [A-Z][a-z]+"
    maker = DocumentMaker(random.Random(0))
    kinds = set()
    for _ in range(60):
        (prompt, _), (answer, is_answer), _ = maker.keyed(300)
        text, question = prompt.rsplit("\n", 2)[0], prompt.split("\n", 1)[1]
        asked = re.search(name, question).group()
        values = re.split(r" and |, ", answer.strip())
        # the answer is every value of the asked name's records, in the order they appear
        records = [sentence for sentence in re.split(r"(?<=\.) ", text) if asked in sentence]
        assert is_answer and [re.search(r"\d+", record).group() for record in records] == values
        assert len(re.findall(r"\d+", text)) > len(values)  # other numbers: copying the only one fails
        names = {match for match in re.findall(name, text) if not match.startswith("The ")}
        kinds.add("multivalue" if len(values) > 1 else "multikey" if len(names) > 1 else "single")
        assert not {part.lower() for match in names for part in match.split()} & _KEYED_EXCLUDED
        assert (
            "Question:" not in prompt and "Answer:" not in prompt and not any("ermit" in record for record in records)
        )
        assert not any(
            needle.split("{value}")[0].replace("{key}", "") in text for needle in retrieval_calib.NEEDLES[1:]
        )
    assert kinds == {"single", "multikey", "multivalue"}


def test_mix_replaces_phase_two_and_names_unknown_kinds(tmp_path, capsys):
    import argparse

    from bosch_eval.toy.train import curriculum

    args = argparse.Namespace(curriculum_steps=3, start_len=48, max_len=64, mix={"keyed": 1.0})
    assert curriculum(0, args)[1] == {"short_recall": 1.0} and curriculum(2, args)[1] == {"keyed": 1.0}
    for bad, expected in (
        ('{"keyd": 1}', "unknown: ['keyd']"),
        ('{"keyed": -1}', "non-negative"),
        ('["keyed"]', "JSON object"),
    ):
        with pytest.raises(SystemExit):
            main(["--out", str(tmp_path), "--mix", bad])
        assert expected in capsys.readouterr().err
