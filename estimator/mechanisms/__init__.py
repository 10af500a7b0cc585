"""The server side of the numeric, repeated and heavy-hitter mechanisms (frequency oracles: :mod:`estimator.oracles`)."""
