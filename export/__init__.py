"""Turn fine-tuned BERT-family checkpoints into validated, optimized ONNX model-repository entries."""
