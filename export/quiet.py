"""Third-party libraries told to keep quiet: the export's own lines are what a user reads. Its own module so that
any export tool (the CLI, `python -m export.embedding_check`, the benchmarks) can call it without importing the CLI."""

from __future__ import annotations

import os
import warnings


def quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
