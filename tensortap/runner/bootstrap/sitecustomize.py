"""Put on PYTHONPATH by `tensortap run`: attaches tensortap to frameworks as the training script imports
them, so the script needs no tensortap code. Does nothing unless TENSORTAP_AUTO=1."""

import os

if os.environ.get("TENSORTAP_AUTO") == "1":
    try:
        from tensortap.runner.autohook import install

        install()
    except Exception as _e:  # noqa: BLE001 - never break the training script
        import sys

        print(f"tensortap: automatic capture is off ({type(_e).__name__}: {_e})", file=sys.stderr)

# Chain to a sitecustomize further down the path, if the environment has one.
try:
    import importlib.machinery as _m
    import sys as _sys

    _here = os.path.dirname(os.path.abspath(__file__))
    _rest = [p for p in _sys.path if os.path.abspath(p or ".") != _here]
    _spec = _m.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.origin and os.path.dirname(os.path.abspath(_spec.origin)) != _here:
        import importlib.util as _u

        _mod = _u.module_from_spec(_spec)
        _spec.loader.exec_module(_mod)
except Exception:  # noqa: BLE001
    pass
