"""Importing tensortap (or its CLI) imports neither tensortap.tensorboard's exporter nor TensorBoard."""

from __future__ import annotations

import subprocess
import sys


def test_import_tensortap_does_not_import_tensorboard():
    code = (
        "import sys, tensortap, tensortap.cli.main; tensortap.cli.main.build_parser();"
        "print(','.join(m for m in ('tensorboard', 'tensorboardX', 'google.protobuf', 'tensortap.tensorboard.export',"
        "'tensortap.tensorboard.convert') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_exporter_needs_no_tensorboard_or_protobuf():
    code = (
        "import sys, tensortap.tensorboard.export, tensortap.tensorboard.convert;"
        "print(','.join(m for m in ('tensorboard', 'google.protobuf') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
