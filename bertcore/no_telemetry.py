"""Keep onnxruntime from calling home. Its Linux and macOS wheels since 1.31 send usage telemetry to Microsoft
(1DS): at the first session a process looks up mobile.events.data.microsoft.com, and it keeps an event cache under
~/.cache/Microsoft/DeveloperTools (2.3 MB after a day of tests here), or warns at every start where it cannot
write one (a container's user without a home). A model server must not call out of an operator's network on its
own, so every package here that loads onnxruntime imports this module first: ORT_DISABLE_TELEMETRY=1, onnxruntime's
own opt-out, read once when onnxruntime starts. ORT_DISABLE_TELEMETRY=0 in the environment turns it back on."""

from __future__ import annotations

import os

TELEMETRY_VARIABLE = "ORT_DISABLE_TELEMETRY"

os.environ.setdefault(TELEMETRY_VARIABLE, "1")
