"""The PyTorch adapter is optional: importing the SDK never imports torch, and without
torch the adapter says how to install it. (Its numerical tests need torch and run in
their own venv: scripts/test-torch, tests_torch/.)"""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
sys.modules["torch"] = None  # as if PyTorch were not installed, even where it is
import client_sdk, client_sdk.fl, client_sdk.fl.torch_adapter as ta, client_sdk.fl.torch_dpsgd as td
import client_sdk.fl.device, client_sdk.fl.torch_device as tdev
assert "torch" not in {m for m in sys.modules if sys.modules[m] is not None}, "torch imported"
try:
    ta.TorchModel(object(), "binary")
except client_sdk.fl.ModelError as e:
    print(e)
else:
    raise SystemExit("no error without torch")
try:
    td.add_lora(object(), 2, None)
except client_sdk.fl.ModelError as e:
    print(e)
else:
    raise SystemExit("add_lora: no error without torch")
try:
    tdev.TorchDeviceModel.for_task_model({"kind": "logistic", "n_features": 2})
except client_sdk.fl.ModelError as e:
    print(e)
else:
    raise SystemExit("TorchDeviceModel: no error without torch")
"""


def test_adapter_imports_without_torch_and_explains_the_extra() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout
    # TorchModel, add_lora (torch_dpsgd) and TorchDeviceModel (torch_device; FLDevice imports none of them)
    assert out.count("pip install 'ldp-telemetry[torch]'") == 3
