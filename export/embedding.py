"""Sentence embeddings: a sentence-transformers directory, or a base (`*Model`) checkpoint with --pooling, as one
PyTorch module whose output is one vector per input (the encoder, the pooling, Dense layers, L2 normalization),
which the export traces into the ONNX graph like any task model.

A sentence-transformers directory is read from its own files, without sentence-transformers itself (the export
image does not install it): `modules.json` lists the modules in order; the supported ones are Transformer (the
encoder: its `sentence_bert_config.json` gives max_seq_length and do_lower_case), Pooling (`1_Pooling/config.json`:
one of POOLING_MODES), Dense (in/out features, bias, a torch activation, weights in the module's folder) and
Normalize. Anything else (a Router, a CNN, static embeddings, weighted-mean or last-token pooling, ...) is refused
with one line naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertcore.messages import one_line
from bertcore.model_config import POOLING_MODES
from export.errors import ExportError

MODULES_FILE = "modules.json"
# sentence-transformers' activations a Dense module may name (its config's activation_function), as torch modules.
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "Identity": nn.Identity,
    "Tanh": nn.Tanh,
    "ReLU": nn.ReLU,
    "GELU": nn.GELU,
    "Sigmoid": nn.Sigmoid,
    "SiLU": nn.SiLU,
}
DENSE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class DenseLayer:
    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None
    activation: str  # a key of ACTIVATIONS
    residual: torch.Tensor | None = None  # use_residual with in != out: the residual's projection [out, in]
    use_residual: bool = False
    path: str = ""  # the module's folder, for messages


@dataclass
class EmbeddingHead:
    """What follows the encoder: pooling, Dense layers, normalization; and what the directory says about use."""

    pooling: str
    normalize: bool
    dense: list[DenseLayer] = field(default_factory=list)
    transformer_path: str = ""  # the encoder's folder inside a sentence-transformers directory
    directory: str | None = None  # the sentence-transformers directory itself (the encoder may be in a sub-folder)
    max_seq_length: int | None = None
    do_lower_case: bool = False
    sentence_transformers: bool = False  # read from a sentence-transformers directory (else from --pooling)
    similarity: str = "cosine"
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    def dimension(self, hidden_size: int) -> int:
        return int(self.dense[-1].weight.shape[0]) if self.dense else hidden_size

    def spec(self, hidden_size: int) -> dict[str, Any]:
        """model.json's `embedding` section (bertcore.model_config.EmbeddingSpec)."""
        return {
            "pooling": self.pooling,
            "normalize": self.normalize,
            "dimension": self.dimension(hidden_size),
            "dense_layers": len(self.dense),
            "similarity": self.similarity,
            "prompts": self.prompts,
            "default_prompt_name": self.default_prompt_name,
            "source": "sentence-transformers" if self.sentence_transformers else "--pooling",
        }


def is_sentence_transformers(directory: Path | None) -> bool:
    return directory is not None and (directory / MODULES_FILE).is_file()


def head_from_options(pooling: str | None, normalize: bool) -> EmbeddingHead:
    """A base checkpoint exported with --task embedding --pooling MODE [--normalize]."""
    if pooling is None:
        raise ExportError(
            "--task embedding on a base checkpoint needs --pooling mean|cls|max (and --normalize for unit vectors); "
            "a sentence-transformers directory (modules.json) says its own pooling"
        )
    if pooling not in POOLING_MODES:
        raise ExportError(f"--pooling {pooling!r} is not one of {', '.join(POOLING_MODES)}")
    return EmbeddingHead(pooling=pooling, normalize=normalize)


def read_sentence_transformers(directory: Path) -> EmbeddingHead:
    """The modules of a sentence-transformers directory, checked; ExportError naming what is not supported."""
    modules = _json(directory / MODULES_FILE)
    if not isinstance(modules, list) or not modules or not all(isinstance(m, dict) for m in modules):
        raise ExportError(f"{directory / MODULES_FILE} is not a list of modules")
    kinds = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
    shown = " -> ".join(kinds)
    if kinds[0] != "Transformer":
        raise ExportError(f"{directory}: the first module is {modules[0].get('type')!r}, not a Transformer ({shown})")
    head = EmbeddingHead(pooling="", normalize=False, sentence_transformers=True, directory=str(directory.resolve()))
    head.transformer_path = str(modules[0].get("path") or "")
    _read_transformer(directory / head.transformer_path, head)
    pooled = False
    for module, kind in zip(modules[1:], kinds[1:], strict=True):
        path = directory / str(module.get("path") or "")
        if not str(module.get("type", "")).startswith("sentence_transformers."):
            raise ExportError(f"{directory}: module {module.get('type')!r} is not a sentence-transformers module")
        if kind == "Pooling" and not pooled:
            head.pooling = _read_pooling(path)
            pooled = True
        elif kind == "Dense" and pooled and not head.normalize:
            head.dense.append(_read_dense(path))
        elif kind == "Normalize" and pooled and not head.normalize:
            _check_sentence_embedding(path, "Normalize")
            head.normalize = True
        else:
            raise ExportError(
                f"{directory}: module {module.get('type')!r} is not supported here ({shown}); supported: Transformer, "
                "then Pooling, then any Dense, then an optional Normalize"
            )
    if not pooled:
        raise ExportError(f"{directory}: no Pooling module ({shown}): one vector per input needs one")
    _read_model_config(directory, head)
    return head


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"could not read {path}: {one_line(exc)}") from exc


def _json_object(path: Path) -> dict[str, Any]:
    config = _json(path)
    if not isinstance(config, dict):
        raise ExportError(f"{path} is not a JSON object (it is a {type(config).__name__})")
    return config


def _read_transformer(path: Path, head: EmbeddingHead) -> None:
    config_path = path / "sentence_bert_config.json"
    config = _json_object(config_path) if config_path.is_file() else {}
    task = config.get("transformer_task", "feature-extraction")
    if task != "feature-extraction":
        raise ExportError(f"{config_path}: transformer_task {task!r} is not supported (feature-extraction is)")
    output = config.get("module_output_name", "token_embeddings")
    if output != "token_embeddings":
        raise ExportError(f"{config_path}: module_output_name {output!r}: the pooling needs token_embeddings")
    length = config.get("max_seq_length")
    if length is not None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ExportError(f"{config_path}: max_seq_length {length!r} is not a positive whole number of tokens")
        head.max_seq_length = length
    head.do_lower_case = bool(config.get("do_lower_case", False))


def _read_pooling(path: Path) -> str:
    config = _json_object(path / "config.json")
    modes = config.get("pooling_mode")
    if modes is None:  # the legacy form: one boolean per mode, concatenated in this order where several are set
        legacy = {
            "pooling_mode_cls_token": "cls",
            "pooling_mode_max_tokens": "max",
            "pooling_mode_mean_tokens": "mean",
            "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
            "pooling_mode_weightedmean_tokens": "weightedmean",
            "pooling_mode_lasttoken": "lasttoken",
        }
        modes = [mode for key, mode in legacy.items() if config.get(key)] or ["mean"]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1:
        raise ExportError(f"{path}: pooling modes {modes} concatenated: one mode is supported ({POOLING_MODES})")
    if modes[0] not in POOLING_MODES:
        raise ExportError(f"{path}: pooling mode {modes[0]!r} is not supported; {', '.join(POOLING_MODES)} are")
    if config.get("include_prompt", True) is False:
        raise ExportError(f"{path}: include_prompt false (prompt tokens left out of the pooling) is not supported")
    return str(modes[0])


def _check_sentence_embedding(path: Path, kind: str) -> dict[str, Any]:
    config = _json_object(path / "config.json") if (path / "config.json").is_file() else {}
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, "sentence_embedding") != "sentence_embedding":
            raise ExportError(f"{path}: a {kind} on {config[key]!r}: only one on the sentence embedding is supported")
    return dict(config)


def _read_dense(path: Path) -> DenseLayer:
    config = _check_sentence_embedding(path, "Dense")
    activation = str(config.get("activation_function") or "torch.nn.modules.activation.Tanh")
    name = activation.rsplit(".", 1)[-1]
    if not activation.startswith("torch.") or name not in ACTIVATIONS:
        raise ExportError(f"{path}: Dense activation {activation!r} is not supported; {', '.join(ACTIVATIONS)} are")
    weights = _dense_weights(path)
    try:
        weight = weights["linear.weight"].float()
        bias = weights["linear.bias"].float() if config.get("bias", True) else None
        use_residual = bool(config.get("use_residual", False))
        residual = weights["residual.weight"].float() if use_residual and weight.shape[0] != weight.shape[1] else None
    except KeyError as exc:
        raise ExportError(f"{path}: the Dense weights lack {exc}") from exc
    sizes = [config.get("out_features", weight.shape[0]), config.get("in_features", weight.shape[1])]
    if not all(isinstance(size, int) and not isinstance(size, bool) for size in sizes):
        raise ExportError(f"{path / 'config.json'}: in_features and out_features must be whole numbers, not {sizes}")
    expected = (sizes[0], sizes[1])
    if tuple(weight.shape) != expected or weight.dim() != 2:
        raise ExportError(f"{path}: Dense weight is {tuple(weight.shape)}, its config says {expected}")
    for part, tensor in (("bias", bias), ("residual.weight", residual)):
        wanted = (expected[0],) if part == "bias" else expected
        if tensor is not None and tuple(tensor.shape) != wanted:
            raise ExportError(f"{path}: Dense {part} is {tuple(tensor.shape)}, its config says {wanted}")
    return DenseLayer(weight, bias, name, residual, use_residual, str(path))


def check_dense_shapes(head: EmbeddingHead, hidden_size: int) -> None:
    """Before tracing: each Dense takes what comes before it (the pooled hidden size, then the previous Dense's)."""
    width = hidden_size
    for index, layer in enumerate(head.dense):
        out_features, in_features = (int(size) for size in layer.weight.shape)
        if in_features != width:
            before = "the model's hidden size" if index == 0 else "the out_features of the Dense before it"
            raise ExportError(
                f"{Path(layer.path) / 'config.json'}: Dense in_features {in_features} does not match {before} "
                f"({width}): this module does not belong to this encoder"
            )
        if layer.use_residual and layer.residual is None and in_features != out_features:
            raise ExportError(f"{layer.path}: use_residual with in {in_features} != out {out_features} needs weights")
        width = out_features


def _dense_weights(path: Path) -> dict[str, torch.Tensor]:
    for name in DENSE_WEIGHTS:
        file = path / name
        if not file.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return dict(load_file(str(file)))
            return dict(torch.load(str(file), map_location="cpu", weights_only=True))
        except Exception as exc:
            raise ExportError(f"could not read the Dense weights {file}: {one_line(exc)}") from exc
    raise ExportError(f"{path}: a Dense module with no weights ({' or '.join(DENSE_WEIGHTS)})")


def _read_model_config(directory: Path, head: EmbeddingHead) -> None:
    path = directory / "config_sentence_transformers.json"
    if not path.is_file():
        return
    config = _json_object(path)
    head.similarity = str(config.get("similarity_fn_name") or "cosine")
    prompts = config.get("prompts") or {}
    if isinstance(prompts, dict):
        head.prompts = {str(k): str(v) for k, v in prompts.items()}
    default = config.get("default_prompt_name")
    head.default_prompt_name = str(default) if default else None


class SentenceEncoder(nn.Module):
    """encoder -> pooling -> Dense layers -> L2 normalization; called as the task models are (keyword inputs,
    return_dict), it answers {"sentence_embedding": [batch, dimension]}. Pooling as sentence-transformers pools
    (Pooling._forward_padded): mean over real tokens (count clamped at 1e-9), sum / sqrt(count), max over real
    tokens, or the first real token (left padding included)."""

    def __init__(self, encoder: nn.Module, head: EmbeddingHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.config = encoder.config  # what the export reads of a model (vocab_size)
        self.pooling = head.pooling
        self.normalize = head.normalize
        self.dense = nn.ModuleList(Dense(layer) for layer in head.dense)

    def forward(self, attention_mask: torch.Tensor, return_dict: bool = True, **inputs: torch.Tensor) -> dict:
        states = self.encoder(attention_mask=attention_mask, **inputs, return_dict=True)[0]
        vector = pool(states, attention_mask, self.pooling)
        for layer in self.dense:
            vector = layer(vector)
        if self.normalize:
            vector = nn.functional.normalize(vector, p=2.0, dim=-1)
        return {"sentence_embedding": vector}


class Dense(nn.Module):
    """sentence-transformers' Dense: activation(linear(x)), plus x (or its projection) where use_residual."""

    def __init__(self, layer: DenseLayer) -> None:
        super().__init__()
        out_features, in_features = (int(size) for size in layer.weight.shape)
        self.linear = nn.Linear(in_features, out_features, bias=layer.bias is not None)
        self.activation = ACTIVATIONS[layer.activation]()
        self.use_residual = layer.use_residual
        self.residual = nn.Linear(in_features, out_features, bias=False) if layer.residual is not None else None
        with torch.no_grad():
            self.linear.weight.copy_(layer.weight)
            if layer.bias is not None:
                self.linear.bias.copy_(layer.bias)
            if self.residual is not None and layer.residual is not None:
                self.residual.weight.copy_(layer.residual)

    def forward(self, vector: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.linear(vector))
        if self.use_residual:
            out = out + (self.residual(vector) if self.residual is not None else vector)
        return out


def pool(states: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """One vector per row of token states [batch, sequence, hidden], over the tokens the mask marks real."""
    if mode == "cls":
        first = attention_mask.to(torch.int32).argmax(dim=1)  # the first real token, wherever the padding is
        index = first.to(torch.int64).unsqueeze(-1).unsqueeze(1).expand(-1, 1, states.shape[-1])
        return torch.gather(states, 1, index).squeeze(1)
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    if mode == "max":
        return states.masked_fill(mask == 0, float("-inf")).max(dim=1).values
    # a running sum, read at the last position: a sum over the sequence in one order whatever the batch's padded
    # length (onnxruntime's ReduceSum sums in blocks that move with that length: a row's vector moved ~1e-7 with the
    # batch it was in; the padding adds exact zeros after its last token)
    total = torch.cumsum(states * mask, dim=1)[:, -1]
    count = torch.clamp(mask.sum(dim=1), min=1e-9)
    return total / (count if mode == "mean" else torch.sqrt(count))
