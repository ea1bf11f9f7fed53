"""`ScenarioOrder` and `GroupedForward`: a tick's client networks over agents laid out scenario by scenario.

Each scenario has its own client network (`edgetwin.imitation.split.SplitNetwork`), and a world's
agents come in any scenario order. The tick used to gather each scenario's per-agent inputs
(``agent_x[idx]``, ``(n_s, S+A)``), run its network into fresh arrays, and scatter the means back
(``y[idx] = mu``): at 10,000 agents the gathers and the scatter took ~0.5 ms of a ~8 ms tick, as
much as a GEMM. Here the caller lays the per-agent inputs out scenario by scenario once (the fused
tick writes them there directly, `edgetwin.twin.fused.FusedTick.legal_actions`), every layer of
every scenario writes a contiguous row block of a few work arrays kept from tick to tick (torch's
``mm`` / ``addmm`` with ``out=``, numpy's activations in place), and the tick reads the means back
in row order in a pass it makes anyway (`FusedTick.outputs`).

What moves in the bits: nothing against `SplitNetwork.forward` of each scenario's rows: the same
torch calls (``linear`` without a bias is ``mm``, with one ``addmm``) on the same values, the first
layer's parts added by the same kernel, the same numpy activations (tests/test_fused_tick.py
compares them byte for byte). One exception, on purpose: torch's CPU GEMM takes another kernel for
1-3 rows, whose sums round differently (measured: every row count of 1-3 differs in the last bits
from the same rows inside a larger batch, 4-39 do not), so a scenario block of fewer than
`MIN_ROWS` rows is computed padded to `MIN_ROWS` rows (its last row repeated) and the padding
dropped. Before this, `Simulation.respond` of one agent (the per-agent environment's step) gave
other bits than the same agent in a whole tick; now a row's numbers depend on its own inputs only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th

from edgetwin.imitation.split import SplitNetwork, _add_parts

__all__ = ["MIN_ROWS", "GroupedForward", "ScenarioOrder"]

#: the fewest rows a GEMM here runs on (fewer are padded): torch's CPU GEMM rounds 1-3 rows
#: differently from the same rows in a larger batch (see the module docstring)
MIN_ROWS = 8


@dataclass(frozen=True)
class ScenarioOrder:
    """The rows of one call laid out scenario by scenario.

    Attributes:
        groups: ``[(scenario id, rows (n_s,) int64 in the call's row order)]``, increasing id.
        perm: ``(n,)`` int64, the rows in scenario order (the groups' rows one after the other).
        pos: ``(n,)`` int64, where each row sits in that order (``perm[pos[i]] == i``).
        bounds: per group ``(start, stop)`` of its block in that order.
    """

    groups: list[tuple[int, np.ndarray]]
    perm: np.ndarray
    pos: np.ndarray
    bounds: list[tuple[int, int]]

    @staticmethod
    def of(groups: list[tuple[int, np.ndarray]], n: int) -> ScenarioOrder:
        """The order of ``groups`` (which partition ``0..n-1``)."""
        perm = np.concatenate([idx for _, idx in groups]).astype(np.int64) if groups else np.zeros(0, np.int64)
        pos = np.empty(n, np.int64)
        pos[perm] = np.arange(n, dtype=np.int64)
        stops = np.cumsum([len(idx) for _, idx in groups]).tolist()
        starts = [0, *stops[:-1]] if stops else []
        return ScenarioOrder(groups, perm, pos, list(zip(starts, stops, strict=True)))


class GroupedForward:
    """The client networks of a tick's scenarios into work arrays kept from call to call.

    `run` returns an array that the next call with the same ``slot`` overwrites: a caller that keeps
    the means copies them (the fused tick reads them into its own row-order array in the same pass
    as the noise).
    """

    def __init__(self) -> None:
        #: (kind, key, width) -> (base tensor, {n: its first n rows})
        self._work: dict[tuple[str, int, int], tuple[th.Tensor, dict[int, th.Tensor]]] = {}
        #: the views each block's layers write, by (slot, n, start, stop, widths), for this generation
        self._dests: dict[tuple[Any, ...], list[th.Tensor]] = {}
        #: per slot the last call's plan (`_plan`): its key, its blocks' calls, the output array
        self._plans: dict[int, tuple[tuple[Any, ...], list[tuple[Any, ...]], np.ndarray]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Without the plans: their numpy views of the torch work arrays would be separate arrays in
        a copy or a pickle (the torch views among the work arrays stay views); a copy plans anew."""
        return {**self.__dict__, "_plans": {}}

    def _array(self, kind: str, key: int, n: int, width: int) -> th.Tensor:
        """A kept ``(n, width)`` float32 work tensor (fresh arrays of ~2.5 MB at 10,000 agents cost
        their allocation and page faults every tick); the same view object for the same ``n``."""
        hit = self._work.get((kind, key, width))
        if hit is None or hit[0].shape[0] < n:
            hit = self._work[(kind, key, width)] = (th.empty((n, width), dtype=th.float32), {})
            self._dests.clear()  # views of the old arrays
            self._plans.clear()
        view = hit[1].get(n)
        if view is None:
            if len(hit[1]) > 64:
                hit[1].clear()
            view = hit[1][n] = hit[0][:n]
        return view

    def run(
        self,
        nets: list[SplitNetwork],
        order: ScenarioOrder,
        agent_x: np.ndarray,
        profile_h: list[np.ndarray],
        site_x: np.ndarray,
        sites: np.ndarray,
        slot: int = 0,
    ) -> np.ndarray:
        """``(n, out)`` float32 means of every row, in scenario order (``order.perm``); call under
        ``torch.no_grad``.

        Args:
            nets: per group of ``order``, its scenario's network.
            agent_x: ``(n, S+A)`` float32 C-contiguous per-agent inputs in scenario order.
            profile_h: per group ``(n_s, H)`` float32 its rows' `SplitNetwork.profile_part`.
            site_x: ``(n_sites, W)`` every site's inputs (`World.client_site_inputs`); each
                scenario's `SplitNetwork.site_part` of them is computed here.
            sites: ``(n,)`` int64 each row's site, in scenario order.
            slot: which output array (a caller that keeps several results at once uses several).

        A tick calls this with the same arrays (the fused tick's kept inputs, the episode's profile
        parts, the tick's sites) every time: the calls it makes are then planned once (`_plan`:
        every view, transpose and contiguous copy made, ~60 us a tick at 1,000 agents) and replayed.
        """
        site_t = th.from_numpy(np.ascontiguousarray(site_x, np.float32))
        plan = self._planned(nets, order, agent_x, profile_h, sites, slot, site_t.shape)
        if plan is None:
            return self._run_unplanned(nets, order, agent_x, profile_h, site_t, sites, slot)
        for x, wa_t, h, hn, hp, ws_t, sh, shn, st, ops in plan[1]:
            th.mm(site_t, ws_t, out=sh)  # `SplitNetwork.site_part` (``linear`` without a bias is ``mm``)
            th.mm(x, wa_t, out=h)
            _add_parts(hn, hp, shn, st)
            for act, src, w_t, b, dst in ops:
                if act is not None:
                    act(src)  # in place: the array is the tensor's memory
                elif b is None:
                    th.mm(src, w_t, out=dst)
                else:
                    th.addmm(b, src, w_t, out=dst)
        res: np.ndarray = plan[2]
        return res

    def _planned(
        self, nets: list[SplitNetwork], order: ScenarioOrder, agent_x: np.ndarray, profile_h: list[np.ndarray],
        sites: np.ndarray, slot: int, site_shape: tuple[int, ...],
    ) -> tuple[tuple[Any, ...], list[tuple[Any, ...]], np.ndarray] | None:
        """The kept plan of this call (built when the call's arrays, networks, their layers or the
        first layer's weights changed: the objects compared by identity, the first layer's versions
        and the site inputs' shape by value), or None where a block is padded (fewer than
        `MIN_ROWS` rows) or there is no row."""
        same = (order, agent_x, sites, *profile_h, *nets, *(layer for net in nets for layer in net.layers))
        key = (same, tuple(net.version() for net in nets), site_shape)
        hit = self._plans.get(slot)
        if hit is not None and key[1:] == hit[0][1:] and len(hit[0][0]) == len(same) and all(
            a is b for a, b in zip(hit[0][0], same, strict=True)
        ):
            return hit
        if not order.bounds or any(0 < stop - start < MIN_ROWS for start, stop in order.bounds):
            return None
        if sum(stop > start for start, stop in order.bounds) == 0:
            return None
        hit = self._plans[slot] = self._plan(key, nets, order, agent_x, profile_h, sites, slot, site_shape[0])
        return hit

    def _plan(
        self, key: tuple[Any, ...], nets: list[SplitNetwork], order: ScenarioOrder, agent_x: np.ndarray,
        profile_h: list[np.ndarray], sites: np.ndarray, slot: int, n_sites: int,
    ) -> tuple[tuple[Any, ...], list[tuple[Any, ...]], np.ndarray]:
        """Per block ``(x, Wa^T, h, h as numpy, profile part, Ws^T, site part, as numpy, sites,
        [(activation, its array, None, None, None) | (None, input, W^T, bias, output)])``: the
        calls of `_block` with every argument made."""
        n = len(agent_x)
        x_all = th.from_numpy(agent_x)
        blocks: list[tuple[Any, ...]] = []
        out: th.Tensor | None = None
        for g, start, stop, net, widths in self._nonempty(nets, order):
            dest = self._dest(slot, n, start, stop, widths)
            out = self._array("out", slot, n, widths[-1])
            _, _, wa, ws = net.blocks()
            sh = th.empty((n_sites, ws.shape[0]), dtype=th.float32)
            ops: list[tuple[Any, ...]] = []
            h, k = dest[0], 0
            for layer in net.layers[1:]:
                if callable(layer):
                    ops.append((layer, h.numpy(), None, None, None))
                    continue
                k += 1
                ops.append((None, h, layer[0].t(), layer[1], dest[k]))
                h = dest[k]
            blocks.append((x_all[start:stop], wa.t(), dest[0], dest[0].numpy(),
                           np.ascontiguousarray(profile_h[g], np.float32), ws.t(), sh, sh.numpy(),
                           np.ascontiguousarray(sites[start:stop], np.int64), ops))
        assert out is not None
        return key, blocks, out.numpy()

    def _run_unplanned(
        self, nets: list[SplitNetwork], order: ScenarioOrder, agent_x: np.ndarray, profile_h: list[np.ndarray],
        site_t: th.Tensor, sites: np.ndarray, slot: int,
    ) -> np.ndarray:
        """`run` block by block without a plan (a block of fewer than `MIN_ROWS` rows: padded)."""
        n = len(agent_x)
        x_all = th.from_numpy(agent_x)
        out: th.Tensor | None = None
        for g, start, stop, net, widths in self._nonempty(nets, order):
            if out is None:
                out = self._array("out", slot, n, widths[-1])
            rows = stop - start
            x, hp, st = x_all[start:stop], profile_h[g], sites[start:stop]
            site_h = th.nn.functional.linear(site_t, net.blocks()[3]).numpy()  # `SplitNetwork.site_part`
            if rows >= MIN_ROWS:
                self._block(net, x, hp, site_h, st, self._dest(slot, n, start, stop, widths))
            else:  # torch's small-GEMM kernel rounds otherwise: MIN_ROWS rows (the last repeated), keep the first
                keep = np.minimum(np.arange(MIN_ROWS), rows - 1)
                h = self._block(net, x[th.from_numpy(keep)], hp[keep], site_h, st[keep],
                                [th.empty((MIN_ROWS, width), dtype=th.float32) for width in widths])
                out[start:stop] = h[:rows]
        if out is None:
            return np.zeros((n, 0), np.float32)
        res: np.ndarray = out.numpy()
        return res

    def _dest(self, slot: int, n: int, start: int, stop: int, widths: list[int]) -> list[th.Tensor]:
        """Where each linear layer of the block ``[start, stop)`` writes: its rows of the kept hidden
        arrays, the last into slot ``slot``'s output (kept: a tick makes the same views every time)."""
        key = (slot, n, start, stop, tuple(widths))
        hit = self._dests.get(key)
        if hit is None:
            if len(self._dests) > 64:  # row subsets of many sizes (a what-if's): keep it bounded
                self._dests.clear()
            views = [self._array("h", k, n, width)[start:stop] for k, width in enumerate(widths[:-1])]
            out = self._array("out", slot, n, widths[-1])
            hit = self._dests[key] = [*views, out[start:stop]]
        return hit

    def _nonempty(
        self, nets: list[SplitNetwork], order: ScenarioOrder
    ) -> list[tuple[int, int, int, SplitNetwork, list[int]]]:
        """``[(group, start, stop, its network, its layers' widths)]`` of the groups with rows."""
        return [(g, start, stop, nets[g], self._widths(nets[g]))
                for g, (start, stop) in enumerate(order.bounds) if stop > start]

    @staticmethod
    def _widths(net: SplitNetwork) -> list[int]:
        """The output width of each linear layer of ``net``, the first included."""
        return [net.layers[0][0].shape[0]] + [layer[0].shape[0] for layer in net.layers[1:] if not callable(layer)]

    @staticmethod
    def _block(
        net: SplitNetwork, x: th.Tensor, hp: np.ndarray, site_h: np.ndarray, sites: np.ndarray, dest: list[th.Tensor]
    ) -> th.Tensor:
        """`SplitNetwork.forward` of one block of rows, linear layer ``k`` written into ``dest[k]``
        (``(rows, width)`` float32); returns the last."""
        _, _, wa, _ = net.blocks()
        h = dest[0]
        th.mm(x, wa.t(), out=h)
        _add_parts(h.numpy(), np.ascontiguousarray(hp, np.float32), np.ascontiguousarray(site_h, np.float32),
                   np.ascontiguousarray(sites, np.int64))
        k = 0
        for layer in net.layers[1:]:
            if callable(layer):
                layer(h.numpy())  # in place: the array is the tensor's memory
                continue
            k += 1
            w, b = layer
            if b is None:
                th.mm(h, w.t(), out=dest[k])
            else:
                th.addmm(b, h, w.t(), out=dest[k])
            h = dest[k]
        return h
