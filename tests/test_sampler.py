"""Tests for trt_llm.runtime.sampling.sampler.

The distribution tests compare against an independent oracle: transformers' own
logits warpers (the ones generate() uses) followed by softmax.
"""

import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams, log_softmax_topn, token_logprob

torch.set_num_threads(1)

GREEDY = SamplingParams(temperature=0.0)
PLAIN = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)  # no filtering at all


def close(a, b):
    return np.allclose(a, b, rtol=1e-5, atol=1e-5)


def rand_logits(*shape, seed=0, scale=2.0):
    """float32 numpy logits (the sampler's input), drawn with torch's generator as the fixtures always were."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).numpy()


# -- greedy and logit bias ---------------------------------------------------


def test_greedy_is_argmax():
    logits = rand_logits(4, 1000)
    out = Sampler([GREEDY] * 4, [0] * 4).sample(logits)
    assert out.dtype == np.int64 and out.shape == (4,)
    assert np.array_equal(out, torch.from_numpy(logits).argmax(-1).numpy())


def test_greedy_ties_go_to_the_lowest_index_as_torch_argmax():
    logits = np.zeros((3, 50), dtype=np.float32)
    logits[0, [7, 3, 40]] = 1.0
    logits[1, [49, 48]] = 2.0
    out = Sampler([GREEDY] * 3, [0] * 3).sample(logits)
    assert out.tolist() == torch.from_numpy(logits).argmax(-1).tolist() == [3, 48, 0]


def test_mixed_batch_greedy_rows_stay_argmax():
    logits = rand_logits(3, 1000)
    out = Sampler([GREEDY, PLAIN, GREEDY], [0, 1, 2]).sample(logits)
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()
    assert 0 <= int(out[1]) < 1000


@pytest.mark.parametrize("base", [GREEDY, SamplingParams(), PLAIN], ids=["greedy", "default", "plain"])
def test_bias_plus_100_forces_token(base):
    logits = rand_logits(8, 500, seed=1)
    forced = int(logits[0].argmin())
    p = SamplingParams(base.temperature, base.top_k, base.top_p, {forced: 100.0})
    sampler = Sampler([p] * 8, list(range(8)))
    for _ in range(5):
        assert (sampler.sample(logits) == forced).all()


@pytest.mark.parametrize("base", [GREEDY, SamplingParams(top_k=1)], ids=["greedy", "sample_top1"])
def test_bias_minus_100_bans_argmax(base):
    logits = rand_logits(8, 500, seed=2)
    top2 = torch.from_numpy(logits).topk(2, dim=-1).indices.numpy()
    # Each row bans its own argmax, so also checks that bias is per row.
    params = [SamplingParams(base.temperature, base.top_k, base.top_p, {int(top2[i, 0]): -100.0}) for i in range(8)]
    assert np.array_equal(Sampler(params, list(range(8))).sample(logits), top2[:, 1])


def test_bias_follows_rows_mapping_and_keeps_input():
    logits = np.zeros((2, 10), dtype=np.float32)
    params = [SamplingParams(temperature=0.0, logit_bias={3: 5.0}), SamplingParams(temperature=0.0, logit_bias={7: 5.0})]
    sampler = Sampler(params, [0, 0])
    assert sampler.sample(logits, rows=[1, 0]).tolist() == [7, 3]
    assert np.array_equal(logits, np.zeros((2, 10)))  # bias must not write into the engine's buffer


def test_bias_on_expanded_input_stays_per_row():
    # broadcast_to shares one buffer between rows; a bias written in place would leak.
    logits = np.broadcast_to(np.zeros((1, 10), dtype=np.float32), (2, 10))
    params = [SamplingParams(temperature=0.0, logit_bias={3: 5.0}), GREEDY]
    assert Sampler(params, [0, 0]).sample(logits).tolist() == [3, 0]


def test_bias_id_out_of_range():
    with pytest.raises(ValueError):
        Sampler([SamplingParams(logit_bias={10: 1.0})], [0]).sample(np.zeros((1, 10), dtype=np.float32))
    with pytest.raises(ValueError):
        SamplingParams(logit_bias={-1: 1.0})


@pytest.mark.parametrize(
    "kwargs", [dict(temperature=-0.1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)]
)
def test_invalid_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


# -- distribution against transformers' warpers --------------------------------

N_ROWS, N_CALLS = 1000, 20  # 20k samples per case, drawn as a batch of identical rows
VOCAB = 50
# chi-square critical value at significance 1e-4 (Wilson-Hilferty approximation,
# accurate to well under 1% for df >= 3). The test is deterministic (fixed seeds);
# alpha bounds the chance that this seed choice fails a correct sampler.
Z_1E4 = 3.719


def chi2_critical(df: int) -> float:
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + Z_1E4 * math.sqrt(a)) ** 3


def oracle_probs(logits: np.ndarray, p: SamplingParams) -> torch.Tensor:
    """Distribution of generate(do_sample=True) for one logits row [V]."""
    scores = torch.from_numpy(logits).clone()[None]
    if p.logit_bias:
        for tok, b in p.logit_bias.items():
            scores[0, tok] += b
    # Same order and skip rules as transformers' _get_logits_processor.
    if p.temperature != 1.0:
        scores = TemperatureLogitsWarper(float(p.temperature))(None, scores)
    if p.top_k:
        scores = TopKLogitsWarper(p.top_k)(None, scores)
    if p.top_p < 1.0:
        scores = TopPLogitsWarper(float(p.top_p))(None, scores)
    return torch.softmax(scores[0].double(), -1)


def assert_not_borderline(logits: np.ndarray, p: SamplingParams) -> None:
    """Fixture sanity: no token's top-p decision may hinge on float rounding,
    or sampler and oracle could legitimately disagree about one token."""
    if p.top_p >= 1.0:
        return
    q = oracle_probs(logits, SamplingParams(p.temperature, p.top_k, 1.0, p.logit_bias))
    cum = q.sort(descending=True).values.cumsum(0)
    assert (cum - p.top_p).abs().min() > 1e-4  # float32 rounding is ~1e-6


CASES = [
    pytest.param(SamplingParams(temperature=0.7, top_k=5, top_p=1.0), 10, id="t0.7-k5"),
    pytest.param(SamplingParams(temperature=1.3, top_k=0, top_p=0.8), 11, id="t1.3-p0.8"),
    pytest.param(SamplingParams(temperature=1.0, top_k=10, top_p=0.9), 12, id="k10-p0.9"),
    pytest.param(PLAIN, 13, id="t1-plain"),
    # bias on the seed-14 vector's 4th-best (10) and best (21) token; checks that bias
    # comes before temperature (it gets scaled by it)
    pytest.param(SamplingParams(temperature=0.8, top_k=8, top_p=0.95, logit_bias={10: 1.5, 21: -1.0}), 14, id="bias-t0.8-k8-p0.95"),
]


@pytest.mark.parametrize("params,seed", CASES)
def test_distribution_matches_transformers(params, seed):
    logits = rand_logits(VOCAB, seed=seed)
    assert_not_borderline(logits, params)
    expected_p = oracle_probs(logits, params)
    if params.logit_bias:  # fixture sanity: the biased tokens must matter
        assert all(expected_p[t] > 0.01 for t in params.logit_bias)

    sampler = Sampler([params] * N_ROWS, [seed * 100_000 + i for i in range(N_ROWS)])
    batch = np.broadcast_to(logits, (N_ROWS, VOCAB))
    draws = torch.from_numpy(np.concatenate([sampler.sample(batch) for _ in range(N_CALLS)]))
    n = draws.numel()
    counts = torch.bincount(draws, minlength=VOCAB).double()

    # Filtered-out tokens must never appear.
    assert counts[expected_p == 0].sum() == 0, "drew a token the oracle gives probability 0"

    # Chi-square goodness of fit; bins with expected count < 5 are pooled so the
    # chi-square approximation holds.
    expected = expected_p * n
    support = expected_p > 0
    big = support & (expected >= 5)
    small = support & ~big
    obs_bins, exp_bins = list(counts[big]), list(expected[big])
    if small.any():
        obs_bins.append(counts[small].sum())
        exp_bins.append(expected[small].sum())
    obs, exp = torch.stack(obs_bins), torch.stack(exp_bins)
    df = obs.numel() - 1
    assert df >= 3  # fixture sanity: a meaningful number of categories
    stat = float(((obs - exp) ** 2 / exp).sum())
    assert stat < chi2_critical(df), f"chi2={stat:.1f} df={df} critical={chi2_critical(df):.1f}"


# -- seeds and batch independence ------------------------------------------------


def draw_seq(sampler, logits_steps, rows=None):
    return np.stack([sampler.sample(x, rows) for x in logits_steps])


def test_same_seed_same_samples_different_seed_differs():
    p = SamplingParams(temperature=1.0, top_k=0, top_p=0.95)
    steps = [rand_logits(4, 100, seed=s) for s in range(40)]
    a = draw_seq(Sampler([p] * 4, [1, 2, 3, 4]), steps)
    b = draw_seq(Sampler([p] * 4, [1, 2, 3, 4]), steps)
    c = draw_seq(Sampler([p] * 4, [5, 6, 7, 8]), steps)
    assert np.array_equal(a, b)
    assert not np.array_equal(a[:, 0], c[:, 0])
    assert not np.array_equal(a[:, 0], a[:, 1])  # rows with different seeds differ too


def test_none_seed_is_recorded_and_reproducible():
    s = Sampler([PLAIN], [None])
    assert isinstance(s.seeds[0], int)
    steps = [rand_logits(1, 100, seed=i) for i in range(30)]
    assert np.array_equal(draw_seq(s, steps), draw_seq(Sampler([PLAIN], s.seeds), steps))


def test_row_independent_of_batch_and_rows_mapping():
    mine = SamplingParams(temperature=0.9, top_k=20, top_p=0.9)
    steps = [rand_logits(1, 300, seed=100 + t) for t in range(30)]
    alone = draw_seq(Sampler([mine], [42]), steps)[:, 0]

    # Same request as original row 1 of 3, next to greedy / biased / other rows.
    others = [SamplingParams(temperature=0.0, logit_bias={5: 1.0}), PLAIN]
    sampler = Sampler([others[0], mine, others[1]], [7, 42, 9])
    got = []
    for t, x in enumerate(steps):
        noise = rand_logits(2, 300, seed=500 + t)
        if t < 10:  # full batch, identity mapping
            logits, rows, pos = np.concatenate([noise[:1], x, noise[1:]]), None, 1
        elif t < 20:  # row 0 finished: our row moves to position 0
            logits, rows, pos = np.concatenate([x, noise[1:]]), [1, 2], 0
        else:  # only row 2 and ours left, in swapped order
            logits, rows, pos = np.concatenate([noise[1:], x]), [2, 1], 1
        got.append(sampler.sample(logits, rows)[pos])
    assert np.array_equal(np.stack(got), alone)


def test_rows_validation():
    s = Sampler([PLAIN, PLAIN], [0, 1])
    with pytest.raises(ValueError):
        s.sample(np.zeros((1, 10), dtype=np.float32))  # B != len(params) needs rows=
    with pytest.raises(ValueError):
        s.sample(np.zeros((1, 10), dtype=np.float32), rows=[0, 1])
    with pytest.raises(IndexError):
        s.sample(np.zeros((1, 10), dtype=np.float32), rows=[2])


# -- log-probabilities -------------------------------------------------------------


def test_log_softmax_topn_and_token_logprob():
    logits = rand_logits(3, 200, seed=3)
    ref = torch.log_softmax(torch.from_numpy(logits), -1)
    values, ids = log_softmax_topn(logits, 5)
    assert values.shape == ids.shape == (3, 5)
    assert values.dtype == np.float32 and ids.dtype == np.int64
    ref_top = ref.topk(5, dim=-1)
    assert np.abs(values - ref_top.values.numpy()).max() < 1e-6  # float32, as torch's log_softmax
    assert np.array_equal(ids, ref_top.indices.numpy())
    assert (values[:, :-1] >= values[:, 1:]).all()

    chosen = np.array([0, 17, 199])
    assert np.abs(token_logprob(logits, chosen) - ref[torch.arange(3), chosen].numpy()).max() < 1e-6
    assert log_softmax_topn(logits, 1000)[0].shape == (3, 200)  # n clipped to V


def test_logprobs_include_bias():
    logits = rand_logits(2, 50, seed=4)
    params = [SamplingParams(logit_bias={3: 4.0}), PLAIN]
    s = Sampler(params, [0, 1])
    biased = logits.copy()
    biased[0, 3] += 4.0
    ids = np.array([3, 3])
    assert close(s.token_logprob(logits, ids), token_logprob(logits, ids))
    assert close(s.token_logprob(logits, ids, include_bias=True), token_logprob(biased, ids))
    # with rows remapped, original row 0's bias lands on logits row 1
    swapped = s.log_softmax_topn(logits[::-1], 3, rows=[1, 0], include_bias=True)
    ref = log_softmax_topn(biased[::-1], 3)
    assert close(swapped[0], ref[0])
    assert np.array_equal(swapped[1], ref[1])


@pytest.mark.parametrize("temperature, top_k, top_p", [(1e-300, 0, 1.0), (1.0, 0, 1e-308), (1e-40, 5, 1e-300),
                                                       (1e-6, 0, 0.5)])
def test_extreme_settings_sample_the_best_token(temperature, top_k, top_p):
    """Found by fuzzing the server: a temperature that overflows float32 (or rounds to 0 there) and a
    top_p below float32's smallest number must give the greedy limit, not a NaN distribution."""
    logits = (torch.randn(3, 64, generator=torch.Generator().manual_seed(0)) * 10).numpy()
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    assert Sampler([params] * 3, [1, 2, 3]).sample(logits).tolist() == logits.argmax(-1).tolist()


def test_extreme_temperature_on_negative_logits_samples_the_best_token():
    """Every logit negative: a temperature that rounds to 0 in float32 makes the whole row -inf, which
    is the same limit (the best token), not a row without weights."""
    logits = -np.abs(rand_logits(2, 64, seed=5, scale=10.0)) - 1.0
    params = SamplingParams(temperature=1e-300, top_k=0, top_p=1.0)
    assert Sampler([params] * 2, [1, 2]).sample(logits).tolist() == logits.argmax(-1).tolist()


# -- the seeded stream (numpy's PCG64, one uniform per sampled token) ---------------------------


def test_seeded_draws_are_one_pcg64_uniform_per_token_through_the_cdf():
    """An independent reference: request seed s draws u_t = Generator(PCG64(s)).random() at its t-th
    sampled token and takes the token where the float64 cumulative distribution passes u_t."""
    steps = [rand_logits(1, 100, seed=300 + t) for t in range(40)]
    got = draw_seq(Sampler([PLAIN], [2024]), steps)[:, 0]
    uniforms = np.random.Generator(np.random.PCG64(2024)).random(len(steps))
    want = []
    for x, u in zip(steps, uniforms):
        p = np.exp(x[0].astype(np.float64) - x[0].max())
        cdf = np.cumsum(p / p.sum())
        want.append(int(np.searchsorted(cdf, u, side="right")))
    assert got.tolist() == want


def test_seeded_tokens_are_pinned():
    """The numbers a seed gives (changed once, 2026-12-03, when the sampler moved from torch's
    generators to numpy's PCG64): a change here changes every seeded output of every user."""
    steps = [rand_logits(2, 100, seed=200 + t) for t in range(12)]
    s = Sampler([PLAIN, SamplingParams(temperature=0.8, top_k=20, top_p=0.9)], [1234, 99])
    assert draw_seq(s, steps).T.tolist() == [[91, 81, 80, 29, 51, 13, 25, 39, 82, 36, 58, 79],
                                             [27, 97, 58, 19, 93, 60, 46, 2, 25, 90, 88, 97]]


def test_top_k_and_top_p_ties_go_to_the_lower_id_whatever_the_batch():
    """Tokens tied at the cut of top-k keep the lower ids (a stable full sort's order), so a row's
    candidates never depend on its batch-mates or on the partition's choice."""
    from trt_llm.runtime.sampling.sampler import _topk

    row = np.zeros(200, dtype=np.float32)
    row[[150, 20]] = 3.0
    values, ids = _topk(np.stack([row, row[::-1].copy()]), 5)
    assert ids[0].tolist() == [20, 150, 0, 1, 2]
    assert ids[1].tolist() == [49, 179, 0, 1, 2]
    assert values[0].tolist() == [3.0, 3.0, 0.0, 0.0, 0.0]
    full = np.argsort(-row, kind="stable")[:5]
    assert ids[0].tolist() == full.tolist()
