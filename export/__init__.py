"""Turn fine-tuned BERT-family checkpoints into validated, optimized ONNX model-repository entries."""

__version__ = "0.1.0"
