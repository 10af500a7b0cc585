"""The secure-aggregation path as a linear aggregator, run in one process.

:class:`SimulatedSecureSum` computes the plain (unweighted) sum of the round's
updates the way a deployment would: every update is quantized
(:class:`client_sdk.fl.secagg.Quantizer`), masked by a
:class:`client_sdk.fl.secagg.SecAggClient`, summed and unmasked by a
:class:`estimator.fl.secagg_server.SecAggServer`; a fraction of clients drops
out after masking. It is linear, so the DP wrappers can sit on top
(``FixedClippingDP(SimulatedSecureSum(...))``): they clip before it, which is
what devices do before masking, and add the noise to the unmasked sum.

For simulations and tests only: it draws every client's secrets from the
round's seeded generator.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from client_sdk.fl.client import ClientUpdate
from client_sdk.fl.errors import FLError
from client_sdk.fl.secagg import Quantizer, SecAggClient
from estimator.fl.aggregators import AggregateResult, RoundContext
from estimator.fl.secagg_server import SecAggServer, make_config

__all__ = ["SimulatedSecureSum"]


@dataclasses.dataclass
class SimulatedSecureSum:
    """Σ Δᵢ over the clients that did not drop, through SecAgg+; values are clipped
    to [−clip_range, clip_range] per coordinate by the quantizer (use the L2 clip
    norm C: a vector of norm ≤ C has every coordinate in [−C, C])."""

    clip_range: float
    max_clients: int
    dropout_rate: float = 0.0
    degree: int | None = None
    linear: bool = dataclasses.field(default=True, init=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout_rate < 1.0:
            raise FLError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        self.quantizer = Quantizer.for_clients(self.max_clients, self.clip_range)

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        n = len(updates)
        if n == 0:
            return AggregateResult(np.zeros(ctx.num_params), 0.0, 0, {"secagg_dropped": 0})
        if n < 3 or n > self.max_clients:
            raise FLError(f"secure aggregation here needs 3..{self.max_clients} clients, got {n}")
        rng = ctx.rng
        cfg = make_config(ctx.round, n, ctx.num_params, rng, None if self.degree is None else min(self.degree, n - 1))
        clients = {u: SecAggClient(u, cfg, rng.bytes) for u in range(1, n + 1)}
        server = SecAggServer(cfg)
        routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
        inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items()})
        drops = set((np.flatnonzero(rng.random(n) < self.dropout_rate) + 1).tolist())
        for u, c in clients.items():
            y = c.masked_input(self.quantizer.quantize(updates[u - 1].delta, rng), inbox.get(u, {}))
            if u not in drops:
                server.receive_masked(u, y)
        surv, dropped = server.unmask_request()
        total = server.finish({u: clients[u].unmask(surv, dropped) for u in surv})
        m = len(surv)
        s = self.quantizer.decode_sum(total)
        return AggregateResult(s / max(m, 1), float(m), m, {"secagg_dropped": len(dropped)})
