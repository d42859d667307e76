"""The prefix-activation cache on decoder layouts other than the bundled Qwen3's.

GPT-2 keeps its blocks in ``transformer.h`` (not ``model.layers``): the cache must reuse
its states exactly as for Qwen3, and a layout it cannot reuse must be declined with one
warning (the search then runs every layer), never a raw error.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from bosch_eval.attention.hybrid_spec import HybridSpec
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.caches.prefix_cache import PrefixActivations
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.models.random_model import random_model, save_random_checkpoint


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_checkpoint(tmp_path_factory.mktemp("tiny-gpt2"), family="gpt2")


def top_layer_masks(lm: BoschLM) -> list[HeadMask]:
    """Masks that differ only in the top layer (as a Stage-1 sub-problem's candidates)."""
    shape = lm.head_mask.shape
    below = [tuple([1] * shape.num_kv_heads)] * (shape.num_layers - 1)
    tops = [tuple(int(group != swa) for group in range(shape.num_kv_heads)) for swa in range(shape.num_kv_heads)]
    return [HeadMask((*below, top), shape.num_heads) for top in tops]


class TestGPT2:
    def test_states_are_reused_and_every_logit_is_unchanged(self, gpt2_dir: Path) -> None:
        lm = BoschLM(
            pretrained=str(gpt2_dir),
            device="cpu",
            batch_size=2,
            dtype="float32",
            layers="intr",
            ratio=0.0,
            window=2,
            prefix_cache_mb=16,
        )
        cache = lm.prefix_cache
        assert cache is not None and cache.declined is None
        input_ids = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(0))

        def logits(mask: HeadMask) -> torch.Tensor:
            lm.set_mask(mask)
            return cache.run(lambda ids: lm.model(ids).logits, input_ids, lm.hybrid.spec)

        masks = top_layer_masks(lm)
        plain = [logits(mask) for mask in masks]  # no promise yet: every layer runs
        cache.vary_from(len(cache.layers) - 1)
        cached = [logits(mask) for mask in masks]
        cache.vary_from(None)
        for expected, got in zip(plain, cached, strict=True):
            torch.testing.assert_close(got, expected, atol=0, rtol=0)
        assert cache.layers_skipped == (len(masks) - 1) * (len(cache.layers) - 1) * 2
        assert not torch.equal(plain[0], plain[1])  # the masks matter, so equal logits mean something

    def test_masks_that_differ_below_the_layer_reuse_states_only_for_the_same_rows(self, gpt2_dir: Path) -> None:
        """A tie-break's candidates differ below ℓ0 too: an entry is reused by a mask with the
        same rows below (also after other rows came between), never by one without."""
        lm = BoschLM(
            pretrained=str(gpt2_dir),
            device="cpu",
            batch_size=2,
            dtype="float32",
            layers="intr",
            ratio=0.0,
            window=2,
            prefix_cache_mb=16,
        )
        cache = lm.prefix_cache
        assert cache is not None
        input_ids = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(1))
        top = len(cache.layers) - 1
        full, first_swa = (1, 1, 1, 1), (0, 1, 1, 1)
        # (bottom row, top row): runs A A, B B, then A again.
        rows = [(full, full), (full, first_swa), (first_swa, full), (first_swa, first_swa), (full, (1, 0, 1, 1))]
        masks = [HeadMask((bottom, *[full] * (top - 1), upper), lm.head_mask.shape.num_heads) for bottom, upper in rows]

        def logits(mask: HeadMask) -> torch.Tensor:
            lm.set_mask(mask)
            return cache.run(lambda ids: lm.model(ids).logits, input_ids, lm.hybrid.spec)

        plain = [logits(mask) for mask in masks]
        cache.vary_from(top)
        cached = [logits(mask) for mask in masks]
        cache.vary_from(None)
        for expected, got in zip(plain, cached, strict=True):
            torch.testing.assert_close(got, expected, atol=0, rtol=0)
        assert cache.layers_skipped == 3 * top * 2  # the second of each run and A's return
        assert not torch.equal(plain[0], plain[2])  # the bottom row matters


class _TupleBlock(torch.nn.Module):
    """A decoder layer of the older transformers layout: it returns a tuple, not a tensor."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor]:
        return (hidden_states + self.linear(hidden_states),)


class _TupleDecoder(torch.nn.Module):
    def __init__(self, width: int = 8, layers: int = 3) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, width)
        self.layers = torch.nn.ModuleList(_TupleBlock(width) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer(hidden)[0]
        return hidden


class _Wrapper(torch.nn.Module):
    def __init__(self, decoder: torch.nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def get_decoder(self) -> torch.nn.Module:
        return self.decoder

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder(input_ids)


class TestDeclined:
    SPEC = HybridSpec(HeadMask(((1, 1), (1, 1), (1, 0)), 2), LocalWindow(2), "sdpa")

    def test_a_model_without_a_layer_list_runs_every_layer_and_says_so_once(self, caplog) -> None:
        model = _Wrapper(torch.nn.Linear(4, 4))
        with caplog.at_level(logging.WARNING, logger="bosch_eval.caches.prefix_cache"):
            cache = PrefixActivations(model, 1 << 20)
            cache.vary_from(2)
            outputs = [cache.run(lambda ids: ids * 2, torch.ones(1, 3), self.SPEC) for _ in range(3)]
        assert cache.declined is not None and "no decoder layer list" in cache.declined
        assert all(torch.equal(out, torch.full((1, 3), 2.0)) for out in outputs)
        assert caplog.text.count("prefix cache off") == 1 and "_Wrapper" in caplog.text

    def test_layers_that_return_tuples_are_declined_at_the_first_forward(self, caplog) -> None:
        torch.manual_seed(0)
        model = _Wrapper(_TupleDecoder())
        input_ids = torch.tensor([[1, 2, 3, 4]])
        expected = model(input_ids)
        cache = PrefixActivations(model, 1 << 20)
        assert cache.declined is None  # the layer list is found; the outputs tell the rest
        cache.vary_from(2)
        with caplog.at_level(logging.WARNING, logger="bosch_eval.caches.prefix_cache"):
            outputs = [cache.run(model, input_ids, self.SPEC) for _ in range(3)]
        assert all(torch.equal(out, expected) for out in outputs)
        assert cache.declined is not None and "tuple" in cache.declined and cache.layers_skipped == 0
        assert caplog.text.count("prefix cache off") == 1


def test_the_bundled_layout_is_not_declined() -> None:
    assert PrefixActivations(random_model("qwen3"), 1 << 20).declined is None
