"""The data an XGBoost hook predicts on: a DMatrix, or what smdebug accepted in its place."""

from __future__ import annotations

import os
from typing import Any

from tensortap.exceptions import InvalidConfiguration

__all__ = ["as_dmatrix"]

FILE_FORMATS = ("csv", "libsvm")


def as_dmatrix(data: Any, what: str) -> Any:
    """`data` as an `xgboost.DMatrix` (None stays None).

    Accepted: a DMatrix (QuantileDMatrix included); `(path, "csv")` (the label in the first column, as
    SageMaker's XGBoost reads it) or `(path, "libsvm")`, a local file; `(X, y)`, arrays (or anything
    `xgboost.DMatrix` takes) with their labels.
    """
    if data is None:
        return None
    import xgboost as xgb

    if isinstance(data, xgb.DMatrix):
        return data
    if isinstance(data, tuple) and len(data) == 2:
        first, second = data
        if isinstance(second, str):
            if second not in FILE_FORMATS:
                raise InvalidConfiguration(
                    f"{what}=({first!r}, {second!r}): the file format must be 'csv' or 'libsvm'")
            if not isinstance(first, str | os.PathLike) or not os.path.isfile(first):
                raise InvalidConfiguration(f"{what}=({first!r}, {second!r}): {first!r} is not a local file")
            path = os.fspath(first)
            uri = f"{path}?format=csv&label_column=0" if second == "csv" else f"{path}?format=libsvm"
            return xgb.DMatrix(uri)
        try:
            return xgb.DMatrix(first, label=second)
        except Exception as e:  # noqa: BLE001 - reported as a configuration error naming the value
            raise InvalidConfiguration(f"{what}: cannot make a DMatrix of (X, y): {e}") from e
    raise InvalidConfiguration(
        f"{what}={type(data).__name__}: give an xgboost.DMatrix, (path, 'csv'|'libsvm') or (X, y)")
