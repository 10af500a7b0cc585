"""The server half of split learning (:mod:`.server`: the layers above the cut, the labels' loss and
the HTTP app of ``ldp split serve``) and the activation-inversion attack a curious server runs on the
smashed data it receives (:mod:`.attack`). docs/SPLIT.md."""
