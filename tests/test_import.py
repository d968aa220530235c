"""`import tensortap` stays light: no ML framework, boto3, pandas or web stack."""

import subprocess
import sys


def test_import_pulls_in_no_framework():
    code = (
        "import sys, tensortap, tensortap.trials, tensortap.analysis.utils, tensortap.exceptions, tensortap.modes;"
        "heavy = [m for m in ('torch','tensorflow','keras','xgboost','mxnet','boto3','botocore','pandas',"
        "'matplotlib','plotly','flask','jax','pyarrow','dask','duckdb','polars') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_public_names():
    import tensortap
    from tensortap import exceptions, modes

    for name in ("Hook", "SaveConfig", "SaveConfigMode", "ReductionConfig", "Collection", "CollectionManager",
                 "StepState", "modes"):
        assert hasattr(tensortap, name), name
    assert modes.TRAIN is modes.ModeKeys.TRAIN and modes.GLOBAL.value == 4
    for name in ("TensorUnavailableForStep", "TensorUnavailable", "StepUnavailable", "StepNotYetAvailable",
                 "NoMoreData", "RuleEvaluationConditionMet", "MissingCollectionFiles", "IndexReaderException"):
        assert issubclass(getattr(exceptions, name), exceptions.TensorTapError)
    from tensortap.analysis.utils import no_refresh, refresh  # noqa: F401
    from tensortap.trials import create_trial  # noqa: F401
