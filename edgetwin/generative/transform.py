"""Mixed-type profile columns <-> the real-valued space the population models learn in.

Every model of this package (GAN-SMMSG, GAN, WGAN-GP, GMM) learns on the same transformed
features, so that comparisons between them are about the model, not the preprocessing:

* ``continuous`` and ``heavy_tailed`` columns -> one real dimension each, by a quantile map to a
  standard normal (default, ``method="quantile"``; the same map as sklearn's
  ``QuantileTransformer(output_distribution="normal")``, kept as two arrays so a saved model is
  plain ``.npz``). The inverse map only produces values inside the observed range, which also
  respects the spec's bounds. ``method="standard"`` instead standardises continuous columns and
  puts heavy-tailed ones in `log_space` first; generated values are clipped to the bounds.
* ``discrete``, ``categorical`` and ``binary`` columns -> a one-hot block over the allowed values
  (the GAN generators emit logits there and sample with Gumbel-softmax), or, for the GMM, one
  standardised numeric code that is snapped to the nearest allowed value on the way back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

from edgetwin.contract.errors import InputError
from edgetwin.contract.metrics import log_offset, log_space
from edgetwin.contract.spec import Feature, TwinSpec

Method = Literal["quantile", "standard"]
N_QUANTILES = 1000
#: Quantile-normal outputs are kept inside +-5.2 sd (u in [1e-7, 1 - 1e-7]), like sklearn's.
_U_CLIP = 1e-7
#: the quantile levels of every column's map, made once (read-only): ``np.linspace`` per column and
#: call was a fifth of decoding a few hundred generated rows
_REFERENCES = np.linspace(0.0, 1.0, N_QUANTILES)
_REFERENCES.flags.writeable = False


@dataclass
class ColumnCodec:
    """How one profile column is encoded.

    Attributes:
        feature: the spec feature.
        width: number of dimensions in the one-hot ("net") encoding.
        values: allowed values (``(K,)``) of a discrete column, else None.
        quantiles: ``(N_QUANTILES,)`` data quantiles at `references` (quantile method).
        mean, std: standardisation of the (log-space for heavy-tailed) values, and of the numeric
            code of a discrete column (used by the GMM encoding).
        low, offset: the `log_space` parameters of a heavy-tailed column (standard method).
    """

    feature: Feature
    width: int
    values: np.ndarray | None = None
    quantiles: np.ndarray | None = None
    mean: float = 0.0
    std: float = 1.0
    low: float = 0.0
    offset: float = 1.0

    @property
    def is_discrete(self) -> bool:
        return self.values is not None


def _check_values(x: np.ndarray, f: Feature, index: pd.Index) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{int(bad.sum())} missing or non-finite values; expected numbers",
            f"row {index[i]}: column {f.name}",
        )


@dataclass
class ProfileTransformer:
    """Fits per-column encodings on a profile table and maps rows both ways.

    Attributes:
        spec: the twin spec; its ``profile.*`` features are the columns, in spec order.
        method: ``"quantile"`` or ``"standard"`` (see the module docstring).
        codecs: one `ColumnCodec` per profile column, after `fit`.
    """

    spec: TwinSpec
    method: Method = "quantile"
    codecs: list[ColumnCodec] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        return self.spec.names("profile")

    @property
    def references(self) -> np.ndarray:
        """``(N_QUANTILES,)`` the quantile levels ``linspace(0, 1)`` (one read-only array)."""
        return _REFERENCES

    @property
    def net_dim(self) -> int:
        """Width of the one-hot encoding (`transform`)."""
        return sum(c.width for c in self.codecs)

    @property
    def spans(self) -> list[tuple[int, int, ColumnCodec]]:
        """``(start, end, codec)`` of each column in the one-hot encoding."""
        out, i = [], 0
        for c in self.codecs:
            out.append((i, i + c.width, c))
            i += c.width
        return out

    # ---------------------------------------------------------------------------------- fit
    def fit(self, df: pd.DataFrame) -> ProfileTransformer:
        if self.method not in ("quantile", "standard"):
            raise InputError(
                f"transform must be 'quantile' or 'standard', got {self.method!r}", "--transform"
            )
        feats = self.spec.by_role("profile")
        if not feats:
            raise InputError("the spec has no profile.* features to learn", "spec")
        self.codecs = []
        for f in feats:
            if f.name not in df:
                raise InputError(f"profile column {f.name!r} is missing", "profiles")
            x = df[f.name].to_numpy(np.float64)
            _check_values(x, f, df.index)
            allowed = f.allowed_values()
            if allowed is not None:
                vals = np.asarray(sorted(allowed), dtype=np.float64)
                ok = np.isclose(x[:, None], vals[None, :], rtol=0, atol=1e-9).any(axis=1)
                if not ok.all():
                    i = int(np.flatnonzero(~ok)[0])
                    raise InputError(
                        f"value {x[i]!r} is not one of the allowed values {vals.tolist()}",
                        f"row {df.index[i]}: column {f.name}",
                    )
                sd = float(x.std())
                self.codecs.append(
                    ColumnCodec(
                        f, width=len(vals), values=vals, mean=float(x.mean()), std=sd if sd > 0 else 1.0
                    )
                )
                continue
            codec = ColumnCodec(f, width=1)
            if self.method == "quantile":
                codec.quantiles = np.quantile(x, self.references)
            else:
                if f.kind == "heavy_tailed":
                    codec.low, codec.offset = log_offset(x, f.low)
                y = log_space(x, codec.low, codec.offset) if f.kind == "heavy_tailed" else x
                sd = float(y.std())
                codec.mean, codec.std = float(y.mean()), sd if sd > 0 else 1.0
            self.codecs.append(codec)
        return self

    # ------------------------------------------------------------------------- continuous maps
    def _forward_cont(
        self, c: ColumnCodec, x: np.ndarray, rng: np.random.Generator | None = None
    ) -> np.ndarray:
        if c.quantiles is not None:
            q, r = c.quantiles, self.references
            # A value repeated many times (a point mass: a bound, an integer count) spans a range
            # [u_lo, u_hi] of quantile levels. Without rng it maps to the middle, as sklearn does;
            # with rng (training) it is dequantised, spread uniformly over its range, so the
            # models see a smooth normal marginal instead of a spike, and the inverse map sends
            # the whole range back to the point mass.
            u_hi = np.interp(x, q, r)
            u_lo = -np.interp(-x, -q[::-1], -r[::-1])
            w = 0.5 if rng is None else rng.random(len(x))
            u = u_lo + w * (u_hi - u_lo)
            return ndtri(np.clip(u, _U_CLIP, 1 - _U_CLIP))
        y = log_space(x, c.low, c.offset) if c.feature.kind == "heavy_tailed" else x
        return (y - c.mean) / c.std

    def _inverse_cont(self, c: ColumnCodec, z: np.ndarray) -> np.ndarray:
        f = c.feature
        if c.quantiles is not None:
            x = np.interp(ndtr(z), self.references, c.quantiles)
        else:
            y = z * c.std + c.mean
            if f.kind == "heavy_tailed":  # inverse of log_space
                r = y - np.log(c.offset)
                x = c.low + np.sign(r) * np.expm1(np.abs(r)) * c.offset
            else:
                x = y
        lo = -np.inf if f.low is None else f.low
        hi = np.inf if f.high is None else f.high
        return np.clip(x, lo, hi)

    # ------------------------------------------------------------------------- one-hot encoding
    def transform(self, df: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        """Profile rows -> ``(N, net_dim)`` float32: normal scores and one-hot blocks.

        With ``rng``, point masses of continuous columns are dequantised (see `_forward_cont`).
        """
        blocks = []
        for c in self.codecs:
            x = df[c.feature.name].to_numpy(np.float64)
            if c.values is not None:
                idx = _nearest(c.values, x)
                blocks.append(np.eye(c.width, dtype=np.float32)[idx])
            else:
                blocks.append(self._forward_cont(c, x, rng).astype(np.float32)[:, None])
        return np.concatenate(blocks, axis=1)

    def inverse(self, z: np.ndarray) -> pd.DataFrame:
        """``(N, net_dim)`` -> profile rows; a one-hot block decodes to its argmax's value."""
        return self._frame(self.inverse_array(z))

    def inverse_array(self, z: np.ndarray) -> np.ndarray:
        """`inverse` as a float64 array ``(N, n_columns)`` in `columns`' order (the same values).

        Why an array: a twin's episode reset decodes a few hundred generated profiles several
        times, and a DataFrame built column by column cost more than the decoding (pandas 3's
        per-column insertion and index checks: ~60 % of a reset before, issue 47).
        """
        out = np.empty((len(z), len(self.codecs)))
        for j, (s, e, c) in enumerate(self.spans):
            if c.values is not None:
                out[:, j] = c.values[np.argmax(z[:, s:e], axis=1)]
            else:
                out[:, j] = self._inverse_cont(c, z[:, s].astype(np.float64))
        return out

    def _frame(self, x: np.ndarray) -> pd.DataFrame:
        """Profile rows ``(N, n_columns)`` as a DataFrame of float64 columns named `columns`."""
        return pd.DataFrame({c.feature.name: x[:, j] for j, c in enumerate(self.codecs)})

    # ------------------------------------------------------------------------- code encoding
    def transform_codes(self, df: pd.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        """Profile rows -> ``(N, n_columns)``: normal scores, discrete values standardised (GMM).

        With ``rng``, point masses of continuous columns are dequantised (see `_forward_cont`).
        """
        cols = []
        for c in self.codecs:
            x = df[c.feature.name].to_numpy(np.float64)
            cols.append((x - c.mean) / c.std if c.values is not None else self._forward_cont(c, x, rng))
        return np.stack(cols, axis=1)

    def inverse_codes(self, z: np.ndarray) -> pd.DataFrame:
        """Inverse of `transform_codes`; discrete columns snap to the nearest allowed value."""
        return self._frame(self.inverse_codes_array(z))

    def inverse_codes_array(self, z: np.ndarray) -> np.ndarray:
        """`inverse_codes` as a float64 array ``(N, n_columns)`` in `columns`' order (see `inverse_array`)."""
        out = np.empty((len(z), len(self.codecs)))
        for j, c in enumerate(self.codecs):
            if c.values is not None:
                out[:, j] = c.values[_nearest(c.values, z[:, j] * c.std + c.mean)]
            else:
                out[:, j] = self._inverse_cont(c, z[:, j].astype(np.float64))
        return out

    # ---------------------------------------------------------------------------- persistence
    def state(self) -> dict[str, np.ndarray]:
        """Arrays for ``np.savez`` (the spec and method are saved by the model)."""
        st: dict[str, np.ndarray] = {}
        for c in self.codecs:
            st[f"{c.feature.name}|ms"] = np.array([c.mean, c.std, c.low, c.offset])
            if c.quantiles is not None:
                st[f"{c.feature.name}|q"] = c.quantiles
        return st

    @classmethod
    def from_state(cls, spec: TwinSpec, method: Method, st: dict[str, np.ndarray]) -> ProfileTransformer:
        tr = cls(spec=spec, method=method)
        for f in spec.by_role("profile"):
            mean, std, low, offset = (float(v) for v in st[f"{f.name}|ms"])
            allowed = f.allowed_values()
            if allowed is not None:
                vals = np.asarray(sorted(allowed), dtype=np.float64)
                tr.codecs.append(ColumnCodec(f, width=len(vals), values=vals, mean=mean, std=std))
            else:
                q = st.get(f"{f.name}|q")
                tr.codecs.append(
                    ColumnCodec(
                        f,
                        width=1,
                        quantiles=None if q is None else np.asarray(q),
                        mean=mean,
                        std=std,
                        low=low,
                        offset=offset,
                    )
                )
        return tr


def _nearest(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index of the nearest of the sorted ``values`` for each of ``x``."""
    mids = (values[1:] + values[:-1]) / 2.0
    return np.searchsorted(mids, x)
