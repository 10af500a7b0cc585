"""Split learning: what the client and the server agree on.

The model is cut at one layer: the client (:mod:`client_sdk.split`) computes the layers below the cut
on its own inputs and sends the cut-layer activations (the "smashed data") up; the server
(:mod:`estimator.split`) computes the rest with the labels, and sends the gradient of the loss with
respect to the activations back down. :mod:`.wire` is the message format (a JSON header and raw
little-endian arrays, no pickle); :mod:`.dp` the DP on the activations (per-example clipping of the
activation norm plus Gaussian noise) and its accounting. Importing this package needs only numpy.
"""

from ldp_core.split.dp import SmashedDP
from ldp_core.split.wire import SPLIT_CONTENT_TYPE, SplitWireError, decode_message, encode_message

__all__ = ["SmashedDP", "SPLIT_CONTENT_TYPE", "SplitWireError", "decode_message", "encode_message"]
