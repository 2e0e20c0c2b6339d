"""What the export and the server share, below both: the repository entry's `model.json` (`model_config`), the
tokenizer (`tokenization`), the tasks' pre- and post-processing (`tasks`), the rows handed to the engine (`rows`),
one-line error reasons (`messages`) and the version. It imports neither `export` nor `service`."""
