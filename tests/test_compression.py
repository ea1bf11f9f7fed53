"""Top-k with error feedback, int8 quantisation and their composition; bytes on the wire."""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.federation.compression import (
    EncodedUpdate,
    Int8Quantizer,
    TopKSparsifier,
    UpdateCodec,
    dense_nbytes,
)


def test_topk_keeps_ten_percent_of_the_largest():
    x = np.random.default_rng(0).normal(size=10_000).astype(np.float32)
    sp = TopKSparsifier(0.1)
    enc = sp.encode(x)
    out = sp.decode(enc)
    kept = np.flatnonzero(out)
    assert kept.size == 1000
    # exactly the largest magnitudes, with their exact values
    assert np.abs(x[kept]).min() >= np.abs(np.delete(x, kept)).max()
    np.testing.assert_array_equal(out[kept], x[kept])
    # at 10 % density the bitmap (D/8) beats int32 indices (0.4 D)
    assert "bitmap" in enc.tensors and enc.encoded_nbytes < 0.55 * dense_nbytes(x.size)


def test_topk_uses_index_list_when_very_sparse():
    x = np.random.default_rng(1).normal(size=10_000).astype(np.float32)
    enc = TopKSparsifier(0.001).encode(x)
    assert "indices" in enc.tensors
    np.testing.assert_array_equal(np.flatnonzero(TopKSparsifier(0.001).decode(enc)), np.sort(enc.tensors["indices"]))


@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e3])
def test_int8_round_trip_error_bounded_by_half_scale(scale):
    x = (np.random.default_rng(2).standard_t(3, size=5000) * scale).astype(np.float32)
    q = Int8Quantizer()
    enc = q.encode(x)
    err = np.abs(q.decode(enc).astype(np.float64) - x.astype(np.float64))
    s = enc.meta["scale"]
    assert s == pytest.approx((x.max() - x.min()) / 255.0, rel=1e-6)
    assert err.max() <= s / 2 * (1 + 1e-5) + 1e-7 * np.abs(x).max()
    assert enc.tensors["q"].dtype == np.int8 and enc.encoded_nbytes < x.nbytes / 3.5


def test_int8_constant_vector_is_exact():
    x = np.full(100, 3.25, np.float32)
    q = Int8Quantizer()
    np.testing.assert_array_equal(q.decode(q.encode(x)), x)


def test_error_feedback_sum_of_sent_tracks_sum_of_true():
    rng = np.random.default_rng(3)
    d, steps = 2000, 200
    codec = UpdateCodec(topk=0.1, quantize_bits=8, error_feedback=True)
    plain = UpdateCodec(topk=0.1, quantize_bits=8, error_feedback=False)
    mean = rng.normal(size=d).astype(np.float32) * 0.1
    true_sum = np.zeros(d)
    sent_sum = np.zeros(d)
    plain_sum = np.zeros(d)
    rel = []
    for _ in range(steps):
        g = (mean + rng.normal(size=d) * 0.05).astype(np.float32)
        true_sum += g
        sent_sum += UpdateCodec.decode(codec.encode("site-0", g))
        plain_sum += UpdateCodec.decode(plain.encode("site-0", g))
        rel.append(np.linalg.norm(sent_sum - true_sum) / np.linalg.norm(true_sum))
    # the gap is exactly the residual kept for the client...
    np.testing.assert_allclose(true_sum - sent_sum, codec.residual("site-0"), atol=1e-3)
    # ...it stays bounded, so the relative error shrinks like 1/T; without feedback it does not
    assert rel[-1] < 0.1 and rel[-1] < rel[19] / 3
    assert np.linalg.norm(plain_sum - true_sum) / np.linalg.norm(true_sum) > 0.5


def test_residuals_are_per_client():
    codec = UpdateCodec(topk=0.5, quantize_bits=None)
    codec.encode("a", np.array([1.0, 0.1], np.float32))
    codec.encode("b", np.array([0.2, 3.0], np.float32))
    np.testing.assert_allclose(codec.residual("a"), [0.0, 0.1], atol=1e-7)
    np.testing.assert_allclose(codec.residual("b"), [0.2, 0.0], atol=1e-7)


def test_composition_bytes_and_decode():
    x = np.random.default_rng(4).normal(size=100_000).astype(np.float32)
    both = UpdateCodec(0.1, 8, error_feedback=False).encode("c", x)
    topk = UpdateCodec(0.1, None, error_feedback=False).encode("c", x)
    q8 = UpdateCodec(None, 8, error_feedback=False).encode("c", x)
    dense = dense_nbytes(x.size)
    # int8 values (k bytes) + bitmap (D/8): ~0.225 D bytes vs 4 D
    assert both.encoded_nbytes < 0.06 * dense
    assert both.encoded_nbytes < topk.encoded_nbytes < dense
    assert q8.encoded_nbytes < 0.26 * dense
    y = UpdateCodec.decode(both)
    assert np.count_nonzero(y) == 10_000


def test_bad_inputs_refused():
    with pytest.raises(InputError):
        TopKSparsifier(0.0)
    with pytest.raises(InputError):
        UpdateCodec(quantize_bits=4)
    with pytest.raises(InputError, match="NaN"):
        UpdateCodec().encode("a", np.array([np.nan], np.float32))
    with pytest.raises(InputError):
        UpdateCodec.decode(EncodedUpdate({"values": np.zeros(3, np.float32)}, {"size": 5}))
