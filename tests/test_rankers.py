"""Training-free head rankers (paper B.3): hand-built attention, NumPy oracles, a real model, the CLI."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from bosch_eval.masks.head_mask import HeadRanking, ModelShape, ceil_count
from bosch_eval.models.model_check import resolve_model
from bosch_eval.runtime.errors import ModelError, SettingsError
from bosch_eval.search import rankers
from bosch_eval.search.cli.rank import add_rank_parser
from bosch_eval.search.rankers import RANKERS
from bosch_eval.search.rankers import reference as ref
from bosch_eval.search.rankers.apl import APL
from bosch_eval.search.rankers.base import Ranker, calibration_ids
from bosch_eval.search.rankers.blocks import AttentionBlock, query_blocks
from bosch_eval.search.rankers.capture import capture_attention
from bosch_eval.search.rankers.driver import RankingCompute, RankingInputs, compute_ranking, group_means, make_ranker
from bosch_eval.search.rankers.mass import DCAM, Fisher
from bosch_eval.search.rankers.proxy import Proxy
from bosch_eval.search.rankers.qada import QAdA
from bosch_eval.search.rankers.razor import Razor, repeated_probes
from tests.helpers import doc_example

TOL = 1e-6
MORE_LOCAL = {
    "dcam": "higher", "apl": "higher", "proxy": "lower", "qada": "higher", "razor": "lower", "fisher": "higher"
}  # fmt: skip


def feed(ranker: Ranker, logits: np.ndarray, dprobs: np.ndarray | None = None, block_size: int = 5) -> None:
    """Stream one sequence's full ``[H, T, T]`` logits (and dL/dP) into ``ranker`` in query blocks."""
    logits_t = torch.as_tensor(logits, dtype=torch.float64)
    length = logits_t.shape[1]
    logits_t = logits_t.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    probs = torch.softmax(logits_t, dim=-1)
    grads = None if dprobs is None else torch.as_tensor(dprobs, dtype=torch.float64)
    for t0 in range(ranker.first_row(length), length, block_size):
        t1 = min(length, t0 + block_size)
        block_grads = None if grads is None else grads[:, t0:t1, :t1]
        ranker.update(0, AttentionBlock(t0, logits_t[:, t0:t1, :t1], probs[:, t0:t1, :t1], block_grads))


# --- hand-built heads: T = 64 tokens, window W = 8, a 16-token block repeated 4 times -------------------
T, W, K = 64, 8, 16
ROWS = np.arange(T)
LAG = ROWS[:, None] - ROWS[None, :]


def spike(column: np.ndarray, height: float = 12.0) -> np.ndarray:
    """Logits 0 except ``height`` at key ``column[t]`` of each row where that key is causal."""
    logits = np.zeros((T, T))
    ok = (column >= 0) & (column <= ROWS)
    logits[ROWS[ok], column[ok]] = height
    return logits


HEADS = {
    "local": -1.5 * LAG,  # mass decays with lag: ~all of it at lag < W
    "uniform": np.zeros((T, T)),
    "needle": spike(np.full(T, 5)),  # a far fact at position 5
    "sink": spike(np.zeros(T, dtype=int)),  # the first token
    "echo": spike(ROWS - K),  # the previous occurrence of the current token
    "induction": spike(ROWS - K + 1),  # the token that followed it
    "before": spike(ROWS - K - 1),  # Eq. 20 as printed (m − 1 − K): the token before it
}
NAMES = list(HEADS)
LOGITS = np.stack([HEADS[name] for name in NAMES])  # [H, T, T]


def hand_scores(ranker: Ranker) -> dict[str, float]:
    feed(ranker, LOGITS)
    return dict(zip(NAMES, ranker.head_scores()[0].tolist(), strict=True))


def uniform_in_window() -> float:
    """Mean over rows of the in-window share of a uniform row, min(W, t+1)/(t+1)."""
    return float(np.mean(np.minimum(W, ROWS + 1) / (ROWS + 1)))


class TestHandBuilt:
    def test_dcam_prefers_the_local_head(self) -> None:
        s = hand_scores(DCAM(1, len(NAMES), W))
        assert s["local"] > 0.99
        assert s["uniform"] == pytest.approx(uniform_in_window(), abs=1e-12)
        far = [s[name] for name in ("needle", "sink", "echo", "induction", "before")]
        assert s["local"] > s["uniform"] > max(far)

    def test_apl_reads_the_peak_lag_of_the_last_row(self) -> None:
        s = hand_scores(APL(1, len(NAMES), W))
        assert s["local"] == 1.0  # peak at lag 0
        # needle lag 58, sink lag 63, induction lag 15 ≥ W, uniform ties → first key: all global.
        assert all(s[name] == 0.0 for name in NAMES if name != "local")

    def test_apl_takes_the_median_over_examples(self) -> None:
        ranker = APL(1, 1, W)
        for lag in (2, 4, 20):  # median peak lag 4 → s = 1 − 4/8
            feed(ranker, spike(ROWS - lag)[None])
        assert ranker.head_scores()[0, 0].item() == pytest.approx(0.5)

    def test_proxy_concentrated_heads_need_fewer_blocks(self) -> None:
        proxies = tuple(NAMES.index(name) for name in ("local", "needle", "sink"))
        s = hand_scores(Proxy(1, len(NAMES), W, block=4, gamma=0.9, proxy_heads=proxies))
        # Short rows have few blocks (n_B = 1 for t < 4), which lifts every mean; the gap stays wide.
        assert max(s["local"], s["needle"], s["sink"]) < 0.5 < 0.9 < s["uniform"]
        # Direction: smaller = more local, so the diffuse head is the last to become SWA.
        ranking = HeadRanking(((s["local"], s["uniform"]),), Proxy.more_local, "proxy", 2)
        assert ranking.to_mask(0.5).bits == ((0, 1),)

    def test_proxy_a_head_that_disagrees_with_the_proxy_pays(self) -> None:
        s = hand_scores(Proxy(1, len(NAMES), W, block=4, gamma=0.9, proxy_heads=(NAMES.index("local"),)))
        # Ranked by the local proxy, the needle's block comes last: the needle head needs nearly all.
        assert s["local"] < 0.3 < 0.8 < s["needle"]

    def test_qada_estimates_the_local_share(self) -> None:
        s = hand_scores(QAdA(1, len(NAMES), W, buffer=8))
        assert s["local"] > 0.95
        # Uniform logits: A_local = W, Â_global = |F|·e⁰ = t − W + 1, so π̂ = W/(t+1) exactly.
        assert s["uniform"] == pytest.approx(uniform_in_window(), abs=1e-12)
        assert s["local"] > max(s[name] for name in NAMES if name != "local")

    def test_razor_flags_echo_and_induction_heads(self) -> None:
        s = hand_scores(_razor(len(NAMES)))
        top_two = sorted(NAMES, key=s.__getitem__)[-2:]
        assert set(top_two) == {"echo", "induction"}
        assert s["before"] < s["induction"]  # the induction source is m − K + 1, not Eq. 20's m − 1 − K
        ranking = HeadRanking((tuple(s[n] for n in NAMES),), Razor.more_local, "razor", len(NAMES))
        full = {name for name, bit in zip(NAMES, ranking.to_mask(5 / 7).bits[0], strict=True) if bit}
        assert full == {"echo", "induction"}  # more_local="lower": retrieval heads stay full

    def test_fisher_weights_mass_by_its_gradient(self) -> None:
        logits = np.stack([np.zeros((T, T)), np.zeros((T, T)), HEADS["local"], np.zeros((T, T))])
        near = (LAG >= 0) & (LAG < W)
        dprobs = np.stack([near, (LAG >= W), np.ones((T, T)), np.ones((T, T))]).astype(float)
        ranker = Fisher(1, 4, W)
        feed(ranker, logits, dprobs)
        s = ranker.head_scores()[0].tolist()
        assert s[0] == pytest.approx(1.0) and s[1] == pytest.approx(0.0)  # same attention, gradient near vs far
        assert s[2] > 0.99
        # Uniform attention, dL/dP = 1: Φ = 1/(t+1)² per key.
        expected = np.sum(np.minimum(W, ROWS + 1) / (ROWS + 1) ** 2) / np.sum(1 / (ROWS + 1))
        assert s[3] == pytest.approx(expected, abs=1e-12)

    def test_fisher_without_gradient_scores_one(self) -> None:
        ranker = Fisher(1, 1, W)
        feed(ranker, np.zeros((1, T, T)), np.zeros((1, T, T)))
        assert ranker.head_scores()[0, 0].item() == 1.0

    # QAdA with a buffer of 8 keys: over the default 128 the local head's logits fall linearly
    # with lag, far from Gaussian, and ½·var (∝ B²) swamps the estimate.
    @pytest.mark.parametrize("method, options", [("dcam", {}), ("apl", {}), ("qada", {"buffer": 8}), ("fisher", {})])
    def test_the_local_head_turns_swa_first(self, method: str, options: dict) -> None:
        ranker = make_ranker(method, ModelShape(1, len(NAMES), len(NAMES)), W, options)
        feed(ranker, LOGITS, np.ones_like(LOGITS) if ranker.needs_grad else None)
        scores = tuple(ranker.head_scores()[0].tolist())
        mask = HeadRanking((scores,), ranker.more_local, method, len(NAMES)).to_mask(1 / len(NAMES))
        assert mask.bits[0][NAMES.index("local")] == 0


def _razor(heads: int) -> Razor:
    ranker = Razor(1, heads, W)
    ranker.period = K  # what sequences() sets for a 4·K-token probe
    return ranker


# --- formulas against the direct NumPy computation, random inputs -------------------------------------
H, G, D = 4, 2, 8


def random_layer(length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "q": rng.normal(size=(H, length, D)) * 1.5,
        "k": rng.normal(size=(G, length, D)) * 1.5,
        "v": rng.normal(size=(G, length, D)),
        "do": rng.normal(size=(H, length, D)),
    }


def stream(ranker: Ranker, layers: list[dict[str, np.ndarray]], tau: float, block_size: int) -> np.ndarray:
    for layer in layers:
        q, k, v, do = (torch.from_numpy(layer[key]) for key in ("q", "k", "v", "do"))
        start = ranker.first_row(q.shape[1])
        for block in query_blocks(q, k, tau, block_size, start=start, value=v, grad_out=do, dtype=torch.float64):
            ranker.update(0, block)
    return ranker.head_scores()[0].numpy()


class TestFormulas:
    TAU = 1 / np.sqrt(D)

    def sequences(self, method: str) -> list[dict[str, np.ndarray]]:
        lengths = (36, 36) if method == "razor" else (37, 29)
        return [random_layer(length, seed) for seed, length in enumerate(lengths, start=11)]

    def maps(self, layers: list[dict[str, np.ndarray]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        pairs = [ref.attention_maps(x["q"], x["k"], self.TAU, x["v"], x["do"]) for x in layers]
        return [p for p, _ in pairs], [g for _, g in pairs]

    @pytest.mark.parametrize("block_size", [1, 5, 64])
    @pytest.mark.parametrize(
        "method, options",
        [
            ("dcam", {}),
            ("apl", {}),
            ("proxy", {"block": 4, "gamma": 0.8, "proxy_heads": (1, 2)}),
            ("qada", {"buffer": 4}),
            ("razor", {}),
            ("fisher", {}),
        ],
    )
    def test_streaming_matches_the_formula(self, method: str, options: dict, block_size: int) -> None:
        window = 6
        layers = self.sequences(method)
        ranker = make_ranker(method, ModelShape(1, H, G), window, options)
        if method == "razor":
            ranker.period = 9
        got = stream(ranker, layers, self.TAU, block_size)
        probs, dprobs = self.maps(layers)
        expected = {
            "dcam": lambda: ref.dcam(probs, window),
            "apl": lambda: ref.apl(probs, window),
            "proxy": lambda: ref.proxy(probs, **options),
            "qada": lambda: ref.qada([x["q"] for x in layers], [x["k"] for x in layers], self.TAU, window, 4),
            "razor": lambda: ref.razor(*(x[None] for x in ref.razor_attention(probs, 9)))[0],
            "fisher": lambda: ref.fisher(probs, dprobs, window),
        }[method]()
        np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)

    def test_blocks_reassemble_the_full_map(self) -> None:
        x = random_layer(23, seed=3)
        full, dfull = ref.attention_maps(x["q"], x["k"], self.TAU, x["v"], x["do"])
        q, k, v, do = (torch.from_numpy(x[key]) for key in ("q", "k", "v", "do"))
        blocks = list(query_blocks(q, k, self.TAU, 7, value=v, grad_out=do, dtype=torch.float64))
        assert [b.start for b in blocks] == [0, 7, 14, 21]
        for b in blocks:
            assert b.probs.shape == (H, b.stop - b.start, b.stop)  # never more than Bq rows × T keys
            np.testing.assert_allclose(b.probs.numpy(), full[:, b.start : b.stop, : b.stop], atol=1e-12)
            np.testing.assert_allclose(b.dprobs.numpy(), dfull[:, b.start : b.stop, : b.stop], atol=1e-12)
            np.testing.assert_array_equal(b.lags().numpy(), (np.arange(b.start, b.stop)[:, None] - np.arange(b.stop)))


class TestGroups:
    def test_group_score_is_the_mean_of_its_query_heads(self) -> None:
        heads = torch.tensor([[1.0, 3.0, 10.0, 20.0, 0.0, 0.0, 5.0, 7.0]], dtype=torch.float64)
        torch.testing.assert_close(group_means(heads, 4), torch.tensor([[2.0, 15.0, 0.0, 6.0]], dtype=torch.float64))
        np.testing.assert_allclose(ref.group_mean(heads.numpy(), 2), [[8.5, 3.0]])

    def test_registry(self) -> None:
        assert {name: cls.more_local for name, cls in RANKERS.items()} == MORE_LOCAL

    def test_unknown_option_lists_the_valid_ones(self) -> None:
        with pytest.raises(
            SettingsError, match=r"unknown option\(s\) \['blok'\]; valid options are \['block', 'gamma'"
        ):
            make_ranker("proxy", ModelShape(1, 2, 1), 8, {"blok": 3})
        with pytest.raises(
            SettingsError, match=r"method: unknown ranker 'lapl', expected one of \['apl', 'dcam', .*did you mean 'apl'"
        ):
            make_ranker("lapl", ModelShape(1, 2, 1), 8)


# --- a real model: streaming through the capture vs the NumPy formulas on whole attention maps ---------
CALIB_LEN, EXAMPLES, WINDOW = 288, 2, 96


@pytest.fixture(scope="module")
def real(tiny_model_dir: Path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa").double().eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def eager_maps(model, ids: torch.Tensor) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every layer's ``[H, T, T]`` attention from transformers' eager path, and dL/dP by autograd.

    Eager takes its softmax in float32 even in a float64 model: agreement is ~1e-7.
    """
    model.set_attn_implementation("eager")
    try:
        out = model(ids[None], output_attentions=True, use_cache=False)
        maps = list(out.attentions)
        grads = torch.autograd.grad(F.cross_entropy(out.logits[0, :-1], ids[1:]), maps)
        return [m[0].detach().numpy() for m in maps], [g[0].numpy() for g in grads]
    finally:
        model.set_attn_implementation("sdpa")


def captured(model, ids: torch.Tensor, grads: bool) -> dict[int, list]:
    """Per layer ``[q, k, v, τ]`` (and ``dO``) of one sequence: a plain forward, and backward of the loss."""
    store: dict[int, list] = {}

    def forward(layer, module, q, k, v) -> None:
        store[layer] = [q.numpy(), k.numpy(), v.numpy(), module.scaling]

    def backward(layer, module, q, k, v, do) -> None:
        store[layer].append(do.numpy())

    with capture_attention(model, on_forward=forward, on_backward=backward if grads else None):
        with torch.set_grad_enabled(grads):
            out = model(ids[None], use_cache=False)
            if grads:
                F.cross_entropy(out.logits[0, :-1], ids[1:]).backward()
                model.zero_grad(set_to_none=True)
    return store


def oracle_head_scores(method: str, model, tokenizer) -> np.ndarray:
    """``[L, H]`` scores straight from the formulas on whole float64 attention maps."""
    shape = ModelShape.from_config(model.config)
    if method == "razor":
        sequences = repeated_probes(tokenizer, model.config.vocab_size, EXAMPLES, CALIB_LEN // 4, 0)
    else:
        sequences = calibration_ids(tokenizer, CALIB_LEN, EXAMPLES, 0, "bosch_niah_calib")
    runs = [captured(model, ids, grads=method == "fisher") for ids in sequences]
    rows = []
    for layer in range(shape.num_layers):
        layer_runs = [run[layer] for run in runs]
        maps = [ref.attention_maps(q, k, tau, v, *rest) for q, k, v, tau, *rest in layer_runs]
        probs = [p for p, _ in maps]
        if method == "razor":
            rows.append(ref.razor_attention(probs, CALIB_LEN // 4))
        elif method == "dcam":
            rows.append(ref.dcam(probs, WINDOW))
        elif method == "apl":
            rows.append(ref.apl(probs, WINDOW))
        elif method == "proxy":
            rows.append(ref.proxy(probs, 64, 0.9, (0,)))
        elif method == "fisher":
            rows.append(ref.fisher(probs, [g for _, g in maps], WINDOW))
        elif method == "qada":
            tau = layer_runs[0][3]
            rows.append(ref.qada([r[0] for r in layer_runs], [r[1] for r in layer_runs], tau, WINDOW, 128))
    if method == "razor":
        return ref.razor(np.stack([e for e, _ in rows]), np.stack([i for _, i in rows]))
    return np.stack(rows)


class TestRealModel:
    @pytest.mark.parametrize("method", sorted(MORE_LOCAL))
    def test_streaming_equals_direct(self, real, method: str) -> None:
        model, tokenizer = real
        ranking = compute_ranking(
            method,
            model,
            tokenizer,
            RankingInputs(WINDOW, EXAMPLES, CALIB_LEN),
            compute=RankingCompute(block_size=37, dtype=torch.float64),
        )
        expected = oracle_head_scores(method, model, tokenizer)
        np.testing.assert_allclose(np.array(ranking.provenance["head_scores"]), expected, atol=TOL, rtol=0)
        np.testing.assert_allclose(np.array(ranking.scores), ref.group_mean(expected, 4), atol=TOL, rtol=0)
        assert ranking.more_local == MORE_LOCAL[method]
        assert model.config._attn_implementation == "sdpa"  # restored

    def test_capture_sees_the_models_attention_and_its_gradient(self, real) -> None:
        model, tokenizer = real
        ids = calibration_ids(tokenizer, CALIB_LEN, 1, 0, "bosch_niah_calib")[0]
        maps, grads = eager_maps(model, ids)
        for layer, (q, k, v, tau, do) in captured(model, ids, grads=True).items():
            probs, dprobs = ref.attention_maps(q, k, tau, v, do)
            np.testing.assert_allclose(probs, maps[layer], atol=1e-6, rtol=0)
            np.testing.assert_allclose(dprobs, grads[layer] * np.tri(len(ids)), atol=1e-7, rtol=0)

    def test_capture_restores_the_model_after_an_error(self, real) -> None:
        model, _ = real

        def boom(*args) -> None:
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"), capture_attention(model, on_forward=boom):
            model(torch.tensor([[3, 4, 5]]), use_cache=False)
        assert model.config._attn_implementation == "sdpa"
        assert not any(hasattr(m, "bosch_rank_capture") for m in model.modules())

    def test_deterministic_for_a_seed(self, real) -> None:
        model, tokenizer = real

        def run(method: str, seed: int):
            return compute_ranking(method, model, tokenizer, RankingInputs(WINDOW, 1, CALIB_LEN, seed=seed)).scores

        assert run("dcam", 0) == run("dcam", 0)
        assert run("dcam", 0) != run("dcam", 1)
        assert run("razor", 3) == run("razor", 3)
        assert run("razor", 3) != run("razor", 4)


# --- bosch-eval rank ----------------------------------------------------------------------------------
def rank(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bosch-eval")
    add_rank_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["rank", *argv])
    args.argv = ["rank", *argv]
    args.run(args)
    return args


@pytest.fixture(scope="module")
def model_with_defaults(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ranked") / "model"
    shutil.copytree(tiny_model_dir, path)
    (path / "bosch_defaults.json").write_text(json.dumps({"window": WINDOW, "calib_len": CALIB_LEN}))
    return path


class TestRankCommand:
    @pytest.mark.parametrize("method", sorted(MORE_LOCAL))
    def test_writes_a_ranking_that_makes_masks(self, model_with_defaults: Path, tmp_path: Path, method: str) -> None:
        out = tmp_path / "ranking.json"
        rank(["--method", method, "--model", str(model_with_defaults), "--calib-examples", "2", "--out", str(out)])
        ranking = HeadRanking.load(out)
        assert (ranking.method, ranking.window, ranking.more_local) == (method, WINDOW, MORE_LOCAL[method])
        assert ranking.shape == ModelShape(3, 8, 4)
        provenance = ranking.provenance
        assert (provenance["calib_len"], provenance["calib_examples"], provenance["calib_seed"]) == (CALIB_LEN, 2, 0)
        assert provenance["wall_time_s"] > 0 and provenance["versions"]["torch"] == torch.__version__
        assert provenance["command"].startswith("bosch-eval rank --method " + method)
        for ratio in (0.25, 0.5, 0.75, 0.875):
            mask = ranking.to_mask(ratio)
            assert mask.num_swa_groups == ceil_count(ratio, 12) and mask.window == WINDOW

    def test_explicit_settings_win_and_options_reach_ranker(self, model_with_defaults: Path, tmp_path: Path) -> None:
        out = tmp_path / "proxy.json"
        rank(["--method", "proxy", "--model", str(model_with_defaults), "--window", "4", "--calib-examples", "1",
              "--seed", "2", "--proxy-block", "16", "--proxy-gamma", "0.5", "--proxy-heads", "1", "3",
              "--out", str(out)])  # fmt: skip
        ranking = HeadRanking.load(out)
        assert ranking.window == 4 and ranking.provenance["calib_seed"] == 2
        assert ranking.provenance["settings"] == {"block": 16, "gamma": 0.5, "proxy_heads": [1, 3]}

    def test_the_calibration_set_is_chosen_and_recorded(self, model_with_defaults: Path, tmp_path: Path) -> None:
        scores = {}
        for task in ("bosch_niah_calib", "bosch_retrieval_calib"):
            out = tmp_path / f"{task}.json"
            rank(["--method", "dcam", "--model", str(model_with_defaults), "--calib-examples", "1", "--calib-task", task,
                  "--out", str(out)])  # fmt: skip
            ranking = HeadRanking.load(out)
            assert ranking.provenance["calib_task"] == task
            scores[task] = ranking.scores
        assert scores["bosch_niah_calib"] != scores["bosch_retrieval_calib"]  # other texts, other statistics

    def test_model_args_load_through_lm_eval_with_the_same_result(
        self, model_with_defaults: Path, tmp_path: Path
    ) -> None:
        common = ["--method", "dcam", "--model", str(model_with_defaults), "--calib-examples", "1"]
        rank([*common, "--out", str(tmp_path / "plain.json")])
        rank([*common, "--model-args", "revision=main,trust_remote_code=False", "--out", str(tmp_path / "hflm.json")])
        plain, hflm = HeadRanking.load(tmp_path / "plain.json"), HeadRanking.load(tmp_path / "hflm.json")
        assert hflm.scores == plain.scores
        assert hflm.provenance["model_args"] == {"revision": "main", "trust_remote_code": "False"}
        with pytest.raises(SettingsError, match="--model-args: 'dtype' is set by --dtype"):
            rank([*common, "--model-args", "dtype=float16", "--out", str(tmp_path / "x.json")])
        with pytest.raises(SettingsError, match="model_arg 'attn_backend' is not one lm-eval's HFLM takes"):
            rank([*common, "--model-args", "attn_backend=sdpa", "--out", str(tmp_path / "x.json")])

    def test_errors_name_the_bad_setting(self, tiny_model_dir: Path, model_with_defaults: Path, tmp_path: Path) -> None:
        out = str(tmp_path / "r.json")
        with pytest.raises(SettingsError, match="pass --window W"):
            rank(["--method", "dcam", "--model", str(tiny_model_dir), "--calib-len", "288", "--out", out])
        with pytest.raises(SettingsError, match="--proxy-gamma applies to --method proxy, not dcam"):
            rank(["--method", "dcam", "--model", str(model_with_defaults), "--proxy-gamma", "0.5", "--out", out])
        with pytest.raises(SettingsError, match="--calib-len 100: .*raise the sequence length"):
            rank(["--method", "dcam", "--model", str(model_with_defaults), "--calib-len", "100", "--out", out])
        with pytest.raises(
            ModelError, match=r"--calib-len 1024: longer than model .* \(max_position_embeddings = 512\)"
        ):
            rank(["--method", "dcam", "--model", str(model_with_defaults), "--calib-len", "1024", "--out", out])

    def test_an_unknown_method_is_named_before_anything_loads(self, tmp_path: Path) -> None:
        with pytest.raises(
            SettingsError, match=r"--method: unknown ranker 'fishr', expected one of \[.*\] \(did you mean 'fisher'\?\)"
        ):
            rank(["--method", "fishr", "--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "r.json")])

    def test_a_new_ranker_is_one_new_file(
        self, real, model_with_defaults: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The "Add a ranker" example (docs/rankings.md), dropped as a new module into the rankers package
        (here: a second folder of the package's ``__path__``), runs through ``bosch-eval rank`` with
        the flag it declares and scores what it says: each head's mean attention lag, capped."""
        filename, source = doc_example("Add a ranker")
        plugins = tmp_path / "plugins"
        plugins.mkdir()
        (plugins / filename).write_text(source)
        module = f"{rankers.__name__}.{Path(filename).stem}"
        assert "mean-lag" not in RANKERS and module not in sys.modules
        monkeypatch.setattr(rankers, "__path__", [*rankers.__path__, str(plugins)])
        monkeypatch.setattr(RANKERS, "members", dict(RANKERS.members))  # the test's registration goes with it
        out = tmp_path / "ranking.json"
        try:
            rank(["--method", "mean-lag", "--model", str(model_with_defaults), "--calib-examples", "2",
                  "--compute-dtype", "float64", "--mean-lag-cap", "3", "--out", str(out)])  # fmt: skip
        finally:
            sys.modules.pop(module, None)
        ranking = HeadRanking.load(out)
        assert (ranking.method, ranking.more_local, ranking.window) == ("mean-lag", "lower", WINDOW)
        assert ranking.provenance["settings"] == {"cap": 3}
        model, tokenizer = real
        lag_sums, rows = np.zeros((3, 8)), 0
        # rank's default calibration set on a model of one's own (calibration_choice.md)
        for ids in calibration_ids(tokenizer, CALIB_LEN, 2, 0, "bosch_niah_calib_formats"):
            maps, _ = eager_maps(model, ids)
            lags = np.minimum(np.tril(np.arange(len(ids))[:, None] - np.arange(len(ids))[None, :]), 3)
            lag_sums += np.stack([(m * lags).sum(axis=(1, 2)) for m in maps])
            rows += len(ids)
        np.testing.assert_allclose(np.array(ranking.provenance["head_scores"]), lag_sums / rows, rtol=1e-4)

    def test_toy_resolves_to_the_bundled_checkpoint(self, tmp_path: Path) -> None:
        with (
            mock.patch.dict("bosch_eval.models.model_check.BUNDLED_MODELS", toy=tmp_path),
            pytest.raises(ModelError, match="model 'toy': .*missing"),
        ):
            resolve_model("toy")
        (tmp_path / "model.safetensors").write_bytes(b"")
        with mock.patch.dict("bosch_eval.models.model_check.BUNDLED_MODELS", toy=tmp_path):
            assert resolve_model("toy") == str(tmp_path)
        (tmp_path / "config.json").write_text("{}")
        assert resolve_model(str(tmp_path)) == str(tmp_path)  # an existing checkpoint directory, as given

    @pytest.mark.slow
    def test_parser_import_is_cheap(self) -> None:
        code = "import sys, bosch_eval.search.cli.rank; print('torch' in sys.modules)"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert result.stdout.strip() == "False"
