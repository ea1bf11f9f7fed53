"""`SplitNetwork`: a client network's mean on a world's tick, its first layer split by what each
input column varies with.

A client model's inputs (`edgetwin.imitation.steps.client_features`, ``X (N, in)``) are three
blocks, in this column order:

* ``[0, P)`` z(profile): one row per agent, constant over an episode;
* ``[P, P+S+A)`` z(state) as the models see it and z(action): one row per agent and tick;
* ``[P+S+A, in)`` site means of z(state), the lagged site means, the log site size, the site means
  of z(profile) and the time of day: one row per *site* and tick (`World.client_site_inputs`).

So the first layer ``X W^T + b`` is ``(zp Wp^T + b) + [zs, za] Wa^T + (site row) Ws^T``: the
profile part is computed once per episode and agent, the site part once per site and tick (a few
hundred rows at a twin's 10,000 agents), and only the ``S+A`` per-agent columns go through a
GEMM every tick. At 10,000 agents that is a 16-wide GEMM instead of a 70-wide one, and the
70-wide input is never assembled.

What changes in the numbers: the same inputs, the same weights, the first layer's dot products
summed in three parts (float32) instead of one GEMM's order, so a hidden unit can differ by a few
ulps (~1e-7 relative) from `numpy_forward` of the assembled input; the layers after it are
`numpy_forward`'s. A row's bits depend on its own inputs only (torch's GEMM gives a row the same
bits whatever the other rows, and the parts are added row by row), so a tick of every agent and
`Simulation.respond` on a subset agree to the bit. Deterministic: the same inputs give the same bits.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch as th

__all__ = ["SplitNetwork"]


@numba.njit(fastmath=False, cache=True, nogil=True, boundscheck=False)
def _add_parts(h: np.ndarray, profile_h: np.ndarray, site_h: np.ndarray, sites: np.ndarray) -> None:
    """In place ``h[i] = (h[i] + profile_h[i]) + site_h[sites[i]]`` (float32, row by row): numpy's
    ``h += profile_h; h += site_h[sites]`` to the bit in one pass, without gathering an ``(n, H)``
    copy of the site rows (fastmath off: the same two roundings in the same order)."""
    n, k = h.shape
    for i in range(n):
        r = sites[i]
        for j in range(k):
            h[i, j] = (h[i, j] + profile_h[i, j]) + site_h[r, j]


class SplitNetwork:
    """A plain MLP's layers (`GaussianModel.numpy_layers`) with the first layer's weight split into
    its profile, per-agent and per-site column blocks.

    Args:
        layers: ``[(weight, bias) | in-place numpy activation, ...]``, the first a linear layer of
            width ``in`` = ``n_profile + n_agent + n_site``.
        n_profile, n_agent: the widths of the profile block and of the per-agent block (``S+A``).

    The blocks are contiguous copies of the weight's columns, refreshed when the weight changes in
    place (torch's version counter), so a model trained or loaded in place is seen.
    """

    def __init__(self, layers: list[Any], n_profile: int, n_agent: int) -> None:
        self.layers = layers
        self.n_profile = n_profile
        self.n_agent = n_agent
        self._blocks: tuple[tuple[int, int], th.Tensor, th.Tensor, th.Tensor, th.Tensor] | None = None

    @staticmethod
    def of(layers: list[Any] | None, n_profile: int, n_agent: int, n_in: int) -> SplitNetwork | None:
        """A `SplitNetwork` of ``layers`` when its first layer is a linear layer over ``n_in``
        inputs (the client inputs), else None."""
        if not layers or callable(layers[0]) or layers[0][0].shape[1] != n_in or n_profile + n_agent > n_in:
            return None
        return SplitNetwork(layers, n_profile, n_agent)

    def version(self) -> tuple[int, int]:
        """Changes when the first layer's weight or bias is modified in place."""
        w, b = self.layers[0]
        return (w._version, -1 if b is None else b._version)

    def blocks(self) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """``(profile weight (H, P), bias (H,), agent weight (H, S+A), site weight (H, W))``."""
        w, b = self.layers[0]
        v = self.version()
        if self._blocks is None or self._blocks[0] != v:
            p, a = self.n_profile, self.n_agent
            with th.no_grad():
                bias = th.zeros(w.shape[0]) if b is None else b.detach().clone()
                self._blocks = (
                    v,
                    w[:, :p].detach().contiguous().clone(),
                    bias,
                    w[:, p : p + a].detach().contiguous().clone(),
                    w[:, p + a :].detach().contiguous().clone(),
                )
        return self._blocks[1:]

    def profile_part(self, zp: np.ndarray) -> np.ndarray:
        """``(n, H)`` float32 ``zp Wp^T + b`` of z(profile) ``(n, P)`` (kept by the caller for an
        episode); call under ``torch.no_grad``."""
        wp, b, _, _ = self.blocks()
        x = th.as_tensor(np.ascontiguousarray(zp, dtype=np.float32).copy())
        out: np.ndarray = th.nn.functional.linear(x, wp, b).numpy()
        return out

    def site_part(self, site_x: np.ndarray) -> np.ndarray:
        """``(n_sites, H)`` float32 ``site_x Ws^T`` of the per-site inputs ``(n_sites, W)``."""
        _, _, _, ws = self.blocks()
        x = th.as_tensor(np.ascontiguousarray(site_x, dtype=np.float32).copy())
        out: np.ndarray = th.nn.functional.linear(x, ws).numpy()
        return out

    def forward(
        self, agent_x: np.ndarray, profile_h: np.ndarray, site_h: np.ndarray, sites: np.ndarray | None = None
    ) -> np.ndarray:
        """``(n, out)`` float32 mean (a fresh array) of ``n`` agents; call under ``torch.no_grad``.

        Args:
            agent_x: ``(n, S+A)`` float32 the per-agent inputs (a fresh array: torch may share it).
            profile_h: ``(n, H)`` their `profile_part` rows; site_h: ``(n, H)`` their sites'
                `site_part` rows, or with ``sites (n,)`` given, ``(n_sites, H)`` every site's row
                (added row by row from there: the same bits, no gathered copy).
        """
        _, _, wa, _ = self.blocks()
        h = th.nn.functional.linear(th.as_tensor(agent_x), wa)
        hn = h.numpy()
        if sites is not None:
            _add_parts(hn, np.ascontiguousarray(profile_h, np.float32), np.ascontiguousarray(site_h, np.float32),
                       np.ascontiguousarray(sites, np.int64))
        else:
            hn += profile_h
            hn += site_h
        for layer in self.layers[1:]:
            if callable(layer):
                layer(h.numpy())  # in place: the array is the tensor's memory
            else:
                h = th.nn.functional.linear(h, layer[0], layer[1])
        out: np.ndarray = h.numpy()
        return out
