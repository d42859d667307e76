"""Training text, tokenized and packed into fixed-length sequences.

Sources (``--data``):

* ``toy``: the bundled toy corpus generator (``bosch_eval.toy.corpus``; retrieval and
  local text in the mix the toy model finished its training on), an endless stream
  seeded apart from the toy's own training documents;
* a ``.txt`` file (one document per file), a ``.jsonl`` file (one document per line, in
  the ``--text-field`` field), or a directory of them (sorted by name);
* a directory written by ``datasets``' ``save_to_disk``;
* ``hf:NAME[:CONFIG]``: a Hugging Face dataset (needs the hub or its local cache).

Every document is tokenized without special tokens and followed by EOS; the token stream
is cut into sequences of exactly ``seq_len`` tokens (documents run across sequence
boundaries, as in packed pretraining); a finite source starts over when exhausted. The
stream's position is a small ``state_dict`` so a resumed run reads on from the very token
where the killed one stopped.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from bosch_eval.runtime.errors import ModelError, SettingsError
from bosch_eval.toy.corpus import TRAIN_SEED_BASE, DocumentMaker

# The toy model's final training mix (bosch_eval.toy.train.curriculum at full progress).
TOY_MIX = {"short_recall": 0.15, "recall": 0.2, "niah_single_1": 0.15, "ruler": 0.4, "calib": 0.25, "prose": 0.05}
TOY_SEED_OFFSET = 1_000_000  # continual-pretraining documents never replay the toy's own training seeds


class DocumentSource(Protocol):
    """An endless, resumable iterator over document texts."""

    def texts(self) -> Iterator[str]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ToySource:
    """Toy corpus documents of ``seq_len / 4 … seq_len`` tokens, from one seeded RNG."""

    def __init__(self, seq_len: int, seed: int) -> None:
        self.seq_len = seq_len
        self.maker = DocumentMaker(random.Random(TRAIN_SEED_BASE + TOY_SEED_OFFSET + seed))

    def texts(self) -> Iterator[str]:
        while True:
            length = self.maker.rng.randint(min(self.seq_len, max(32, self.seq_len // 4)), self.seq_len)
            yield "".join(text for text, _ in self.maker.document(length, TOY_MIX))

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.maker.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]  # tuples, also when the state went through JSON
        self.maker.rng.setstate((version, tuple(internal), gauss))


class DatasetSource:
    """Records of a ``datasets.Dataset`` in order, epoch after epoch; position = (epoch, index)."""

    def __init__(self, dataset: Any, text_field: str, name: str) -> None:
        if text_field not in dataset.column_names:
            raise SettingsError(
                f"--data {name}: no field {text_field!r} in its records (fields: {dataset.column_names}); pass --text-field"
            )
        if len(dataset) == 0:
            raise SettingsError(f"--data {name}: holds no documents")
        self.dataset, self.text_field = dataset, text_field
        self.epoch, self.index = 0, 0

    def texts(self) -> Iterator[str]:
        while True:
            record = self.dataset[self.index]
            self.index += 1
            if self.index == len(self.dataset):
                self.epoch, self.index = self.epoch + 1, 0
            yield str(record[self.text_field])

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]


def _text_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.suffix in (".txt", ".jsonl")) if path.is_dir() else [path]
    if not files:
        raise SettingsError(
            f"--data {path}: a directory with no .txt or .jsonl files (nor a datasets save_to_disk directory)"
        )
    kinds = {p.suffix for p in files}
    if not kinds <= {".txt", ".jsonl"} or len(kinds) != 1:
        raise SettingsError(f"--data {path}: expected .txt or .jsonl files of one kind, got {sorted(kinds)}")
    return files


def open_source(spec: str, seq_len: int, seed: int, text_field: str = "text", split: str = "train") -> DocumentSource:
    """The :class:`DocumentSource` named by ``spec`` (see the module docstring).

    Raises:
        SettingsError: naming ``--data`` and what was expected, for a missing path, an empty or
            mixed directory, a missing text field, or an unreachable hub dataset.
    """
    import datasets

    if spec == "toy":
        return ToySource(seq_len, seed)
    if spec.startswith("hf:"):
        name, _, config = spec.removeprefix("hf:").partition(":")
        try:
            dataset = datasets.load_dataset(name, config or None, split=split)
        except Exception as err:  # hub unreachable, unknown name or split: report, do not fall back
            raise SettingsError(
                f"--data {spec}: could not load Hugging Face dataset {name!r} split {split!r}: {err}"
            ) from err
        return DatasetSource(dataset, text_field, spec)
    path = Path(spec)
    if not path.exists():
        raise SettingsError(f"--data {spec}: expected 'toy', 'hf:NAME[:CONFIG]', or an existing file or directory")
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "state.json").is_file()):
        return DatasetSource(datasets.load_from_disk(str(path)), text_field, spec)
    files = _text_files(path)
    if files[0].suffix == ".jsonl":
        dataset = datasets.load_dataset("json", data_files=[str(f) for f in files], split="train")
    else:  # a plain text file is one document
        dataset = datasets.load_dataset("text", data_files=[str(f) for f in files], sample_by="document", split="train")
        text_field = "text"
    return DatasetSource(dataset, text_field, spec)


class PackedSequences:
    """Fixed-length token sequences cut from a document stream; resumable via ``state_dict``.

    Args:
        source: where the documents come from.
        tokenizer: the model's tokenizer (must have an EOS token: it separates documents).
        seq_len: tokens per sequence.
    """

    def __init__(self, source: DocumentSource, tokenizer: Any, seq_len: int) -> None:
        if tokenizer.eos_token_id is None:
            raise ModelError("tokenizer: has no eos_token; packing needs it to separate documents")
        self.source, self.tokenizer, self.seq_len = source, tokenizer, seq_len
        self.buffer: list[int] = []  # tokens read but not yet handed out
        self.documents = 0
        self._texts = source.texts()

    def next_batch(self, rows: int) -> torch.Tensor:
        """The next ``rows`` sequences, ``[rows, seq_len]`` token ids."""
        needed = rows * self.seq_len
        while len(self.buffer) < needed:
            ids = self.tokenizer(next(self._texts), add_special_tokens=False)["input_ids"]
            self.buffer.extend([*ids, self.tokenizer.eos_token_id])
            self.documents += 1
        batch, self.buffer = self.buffer[:needed], self.buffer[needed:]
        return torch.tensor(batch, dtype=torch.long).view(rows, self.seq_len)

    # Accelerate's register_for_checkpointing saves and restores these with the run.
    def state_dict(self) -> dict[str, Any]:
        return {"source": self.source.state_dict(), "buffer": list(self.buffer), "documents": self.documents}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state["source"])
        self.buffer, self.documents = list(state["buffer"]), state["documents"]
        self._texts = self.source.texts()
