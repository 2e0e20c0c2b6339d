"""The engine side of the server: ONNX Runtime sessions, shape buckets, CUDA graphs and batching per model.

`core.EngineCore` owns them; it runs inside the server process or, in process mode, alone in an engine process
(`server`, `python -m service.engine`) that front-end processes reach through `service.wire.frames`.
"""
