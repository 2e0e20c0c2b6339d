"""The summary the CLI prints after an export."""

from __future__ import annotations

from typing import Any

from bertcore.messages import cut
from export.pipeline import ExportResult


def summary(result: ExportResult) -> str:
    config = result.config
    labels = config["labels"]
    head = config["task"] + (f" ({config['problem_type']})" if config["problem_type"] else "")
    if labels is not None:
        head += f", {len(labels)} labels: {', '.join(labels[:8])}{' ...' if len(labels) > 8 else ''}"
    embedding = config.get("embedding")
    if embedding:
        dense = f", {embedding['dense_layers']} Dense" if embedding["dense_layers"] else ""
        normalized = ", normalized" if embedding["normalize"] else ""
        head += f" ({embedding['pooling']} pooling{dense}{normalized}): {embedding['dimension']} dimensions"
    encoder = config["encoder"]
    lines = [
        f"exported {config['source']['checkpoint']} -> {result.entry}" + ("  [demo]" if config["demo"] else ""),
        f"  architecture  {config['architecture']} ({encoder['layers']} layers, hidden {encoder['hidden_size']}, "
        f"{encoder['heads']} heads; stored {config['source'].get('stored_dtype') or 'unknown'}, exported from fp32)",
        f"  task          {head}",
        f"  inputs        {', '.join(config['inputs'])} -> {', '.join(config['outputs'])}; "
        f"max length {config['max_length']}; opset {config['export']['opset']}",
    ]
    fusion = config.get("attention_fusion") or {}
    if fusion.get("reason"):  # a family onnxruntime's optimizer cannot fuse: why its attention runs slower
        lines.append(
            f"  attention     unfused ({fusion['fused_layers']} of {fusion['layers']} layers fused): {fusion['reason']}"
        )
    for variant, entry in config["variants"].items():
        operators = ", ".join(f"{op} {n}" for op, n in entry["fused_operators"].items()) or "none"
        lines.append(f"  {variant:<12} {_size(entry['size_bytes']):>9}  {_validation(entry['validation'])}")
        lines.append(f"  {'':<12} {'':>9}  fused: {operators}")
        accuracy = entry.get("accuracy", {})
        if accuracy.get("measured"):
            lines.append(f"  {'':<12} {'':>9}  {_accuracy(accuracy)}")
        elif config.get("evaluation"):
            lines.append(f"  {'':<12} {'':>9}  on eval data: not measured ({accuracy.get('reason')})")
    evaluation = config.get("evaluation")
    if evaluation:
        lines.append(
            f"  measured on   {evaluation['data']} ({evaluation['examples']} examples, {evaluation['format']}); "
            f"budget {evaluation['budget_points']:g} points of {evaluation['metric']}"
        )
        if evaluation.get("header") is not None:
            cells = " | ".join(cut(cell, 40) for cell in evaluation["header"])
            lines.append(f"  {'':<12}  line 1 read as the file's header and skipped: {cells}")
    for entry in config.get("refused_variants", {}).values():
        lines.append(f"  {entry['reason']}")
    lines.append(f"  cpu default   {config['default_variant']['cpu']}")
    lines.append(f"  done in {result.seconds:.1f} s")
    return "\n".join(lines)


def _validation(report: dict[str, Any]) -> str:
    if not report["validated"]:
        return f"not validated: {report['reason']}"
    tolerance = f" (tolerance {report['tolerance']:g})" if report["tolerance"] is not None else ""
    text = f"{report['provider']}, {len(report['cases'])} shapes: max |diff| {report['max_abs_diff']:.2e}{tolerance}"
    against = report.get("embedding_reference")
    if not against:  # an embedding's measure is its cosine with the reference, below: an int8 variant's vectors
        # are all under the share's 0.999 and read "agree 0.0%", as if it had failed, beside a cosine of 0.99
        share = f"{100 * report['agreement']:.1f}%"
        if report.get("compared") is not None:  # a share of 9 rows reads otherwise as if of hundreds
            share = f"{report['agreed']} of {report['compared']} ({share})"
        text += f", {report['agreement_of']} agree {share}"
    if report.get("batch_invariance_max_abs_diff") is not None:
        text += f"; alone vs batched max |diff| {report['batch_invariance_max_abs_diff']:.1e}"
    if against:
        bound = f" (bound {against['bound']:g})" if against["bound"] is not None else ""
        text += (
            f"; cosine with {against['reference']} >= {against['min_cosine']:.6f}{bound} on {against['texts']} texts"
        )
    return text


def _accuracy(record: dict[str, Any]) -> str:
    scores = ", ".join(f"{name} {value:.2f}" for name, value in record["scores"].items())
    return (
        f"on eval data: {scores}; loss {record['loss_points']:+.2f} points, "
        f"{record['agreement_of']} agree with fp32 {100 * record['agreement']:.2f}%"
    )


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"
