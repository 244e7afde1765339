#!/usr/bin/env bash
# Everything that needs a GPU or NPU, in one call: scripts/accelerator_check.py (its docstring has the steps, budgets and
# options). PYTHON (default python3) runs it and, unless --python says otherwise, run.py.
#
#   scripts/accelerator_check.sh DEVICE OUTDIR [--tar FILE] [--fixtures DIR | --no-fixtures] [--quick]
#
# On the lent GPU: docs/hardware/cuda.md ("The accelerator check on a lent GPU") gives the device command.
cd "$(dirname "$0")/.." || exit 2
exec "${PYTHON:-python3}" scripts/accelerator_check.py "$@"
