"""The client half of split learning (:mod:`.client`): the layers below the cut, trained over HTTP
against a split-learning server (``ldp split serve``). Importing it needs only numpy."""

from client_sdk.split.client import BottomModel, SplitClient, SplitServerError

__all__ = ["BottomModel", "SplitClient", "SplitServerError"]
