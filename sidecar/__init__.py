"""Streaming OOD moderation sidecar for retrieval-augmented generation services."""

import os as _os

__version__ = "0.1.0"

# onnxruntime (the default encoder backend; 1.32 here) collects usage telemetry on Linux
# unless ORT_DISABLE_TELEMETRY=1 is set before it initialises: a persistent device id and
# an event cache under ~/.cache/Microsoft, sent to Microsoft when the network allows. A
# moderation gate in front of health-care services should not phone home, so it is off
# unless the operator sets the variable explicitly (any value, e.g. 0, is kept).
_os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
