"""Label / prediction helpers of Confusion and ClassImbalance."""

from __future__ import annotations

import numpy as np

__all__ = ["class_ids"]


def class_ids(labels: np.ndarray, predictions: np.ndarray, argmax: bool) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(label ids, predicted ids, number of classes if the predictions tell it) as int arrays of equal length.
    Predictions are reduced with argmax over the last axis when `argmax` is True or when they have one axis
    more than the labels (probability vectors). Raises ValueError when they cannot be paired."""
    y = np.asarray(labels)
    p = np.asarray(predictions)
    k = None
    if argmax or (p.ndim == y.ndim + 1 and p.ndim >= 1 and p.shape[-1] > 1):
        k = int(p.shape[-1]) if p.ndim else None
        p = np.argmax(p, axis=-1)
    y = y.reshape(-1)
    p = p.reshape(-1)
    if y.size != p.size:
        raise ValueError(f"{y.size} labels but {p.size} predictions")
    if y.dtype.kind == "f" and y.size and not np.all(np.isfinite(y)):
        raise ValueError("labels hold non-finite values")
    if y.dtype.kind == "f" and y.size and not np.all(y == np.rint(y)):
        raise ValueError("labels are not class ids (not whole numbers): a regression, not judged")
    return y.astype(np.int64), np.rint(p).astype(np.int64) if p.dtype.kind == "f" else p.astype(np.int64), k
