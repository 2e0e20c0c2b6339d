"""bertcore.messages: one line of an exception, with where the repository sits on disk taken out."""

from __future__ import annotations

from bertcore.messages import one_line


def test_a_hidden_folder_leaves_the_path_below_it_relative() -> None:
    """A truncated ONNX file's load error read "Load model from /broken/model.fp32.onnx failed", an absolute path
    that is nowhere: the repository's own path taken out, what is below it reads as relative to it."""
    error = RuntimeError("Load model from /srv/models/broken/model.fp32.onnx failed: Protobuf parsing failed")
    assert one_line(error, hide="/srv/models") == (
        "RuntimeError: Load model from broken/model.fp32.onnx failed: Protobuf parsing failed"
    )
    assert one_line(error, hide="/srv/models/") == one_line(error, hide="/srv/models")
    assert one_line(RuntimeError("cannot read /srv/models"), hide="/srv/models") == "RuntimeError: cannot read"
