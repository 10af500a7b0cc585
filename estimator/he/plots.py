"""Plots of the HE studies (matplotlib, Agg backend)."""

from __future__ import annotations

from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_aggregate(result: dict[str, Any], path: str) -> None:
    """Test accuracy per round for the plaintext mean, SecAgg and threshold CKKS, and upload bytes."""
    plt = _pyplot()
    rows = result["per_round"]
    variance = result.get("stat") == "variance"
    fig, axes = plt.subplots(1, 3 if variance else 2, figsize=(15 if variance else 10, 4))
    a, b = axes[0], axes[1]
    if variance:
        c = axes[2]
        rounds = [r["round"] + 1 for r in rows]
        c.plot(rounds, [r["he"]["variance_max_abs_error"] for r in rows], marker="o", label="threshold CKKS")
        c.plot(rounds, [r["he"]["variance_bound"] for r in rows], linestyle="--", label="CKKS bound")
        c.plot(rounds, [r["secagg"]["variance_max_abs_error"] for r in rows], marker="s", label="SecAgg+")
        c.set_yscale("log")
        c.set_xlabel("round")
        c.set_ylabel("max |error| of the per-coordinate variance")
        c.legend()
    for m, label in (("plain", "plaintext mean"), ("secagg", "SecAgg+"), ("he", "threshold CKKS")):
        a.plot([r["round"] + 1 for r in rows], [r[f"accuracy_{m}"] for r in rows], marker="o", label=label)
    a.set_xlabel("round")
    a.set_ylabel("test accuracy")
    a.legend()
    sizes = [
        result["plaintext_bytes_per_client"],
        rows[-1]["secagg"]["upload_bytes_per_client"],
        rows[-1]["he"]["upload_bytes_per_client"],
    ]
    b.bar(["plaintext", "SecAgg+", "threshold CKKS"], sizes)
    b.set_yscale("log")
    b.set_ylabel("upload bytes per client per round")
    fig.suptitle(f"FedAvg, {result['clients']} clients, {result['parameters']} parameters")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_inference(result: dict[str, Any], path: str) -> None:
    """Bytes and time of one inference, plaintext against encrypted (log scale)."""
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(
        ["input float32", "input ciphertext", "result ciphertexts"],
        [
            result["input_plaintext_bytes_float32"],
            result["input_ciphertext_bytes"],
            result["result_ciphertext_bytes"],
        ],
    )
    a.set_yscale("log")
    a.set_ylabel("bytes")
    b.bar(["plaintext", "encrypted"], [result["plain_eval_s_median"], result["he_eval_s_median"]])
    b.set_yscale("log")
    b.set_ylabel("seconds per inference (server)")
    fig.suptitle(f"private inference, {result['model']}: {result['slowdown']:,.0f}× slower")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
