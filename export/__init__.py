"""Turn fine-tuned BERT-family checkpoints into validated, optimized ONNX model-repository entries."""

import bertcore.no_telemetry  # noqa: F401  (before any onnxruntime import: it calls home unless told not to)
