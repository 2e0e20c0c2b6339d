"""bertcore.messages: one line of an exception, with where the repository sits on disk taken out."""

from __future__ import annotations

from bertcore.messages import article, one_line


def test_a_hidden_folder_leaves_the_path_below_it_relative() -> None:
    """A truncated ONNX file's load error read "Load model from /broken/model.fp32.onnx failed", an absolute path
    that is nowhere: the repository's own path taken out, what is below it reads as relative to it."""
    error = RuntimeError("Load model from /srv/models/broken/model.fp32.onnx failed: Protobuf parsing failed")
    assert one_line(error, hide="/srv/models") == (
        "RuntimeError: Load model from broken/model.fp32.onnx failed: Protobuf parsing failed"
    )
    assert one_line(error, hide="/srv/models/") == one_line(error, hide="/srv/models")
    assert one_line(RuntimeError("cannot read /srv/models"), hide="/srv/models") == "RuntimeError: cannot read"


def test_a_relative_folder_is_taken_out_only_where_a_path_begins() -> None:
    """`--repository .` took every "." out of the line ("junk/modeljson"); a relative name is taken out only before
    a "/" (a bare "models" may be a word of the message), and nowhere inside a longer path or name."""
    error = FileNotFoundError("[Errno 2] No such file or directory: 'junk/model.json'")
    assert one_line(error, hide=".") == "FileNotFoundError: [Errno 2] No such file or directory: 'junk/model.json'"
    assert one_line(FileNotFoundError("no file './junk/model.json'"), hide=".") == (
        "FileNotFoundError: no file 'junk/model.json'"
    )
    error = ValueError("no models here: models/junk/x.onnx, not other-models/x or /srv/models2/x")
    assert one_line(error, hide="models") == (
        "ValueError: no models here: junk/x.onnx, not other-models/x or /srv/models2/x"
    )
    assert one_line(RuntimeError("cannot read /srv/models2/x"), hide="/srv/models") == (
        "RuntimeError: cannot read /srv/models2/x"
    )


def test_a_class_name_takes_the_article_it_is_read_with() -> None:
    said = {name: article(name) for name in ("ElectraForTokenClassification", "AlbertModel", "XLNetModel")}
    said |= {name: article(name) for name in ("BertForMaskedLM", "RobertaModel", "DistilBertModel")}
    assert said == {
        "ElectraForTokenClassification": "an",
        "AlbertModel": "an",
        "XLNetModel": "an",
        "BertForMaskedLM": "a",
        "RobertaModel": "a",
        "DistilBertModel": "a",
    }
