"""Plot of one PSI query (matplotlib, Agg backend)."""

from __future__ import annotations

from typing import Any


def plot_query(result: dict[str, Any], path: str) -> None:
    """Bytes each way against the client's items in plain, and the share of items in common."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(
        ["client items (plain)", "request", "answer"],
        [result["plaintext_bytes"], result["request_bytes"], result["answer_bytes"]],
    )
    a.set_ylabel("bytes")
    n, k = result["client_items"], result["intersection_size"]
    b.bar(["in common", "client only"], [k, n - k])
    b.set_ylabel("client items")
    fig.suptitle(f"PSI ({result['mode']} mode): {k:,} of {n:,} in common, {result['seconds']:.2f} s")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
