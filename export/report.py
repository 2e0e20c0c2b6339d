"""The summary the CLI prints after an export."""

from __future__ import annotations

from typing import Any

from export.pipeline import ExportResult


def summary(result: ExportResult) -> str:
    config = result.config
    labels = config["labels"]
    head = config["task"] + (f" ({config['problem_type']})" if config["problem_type"] else "")
    if labels is not None:
        head += f", {len(labels)} labels: {', '.join(labels[:8])}{' ...' if len(labels) > 8 else ''}"
    encoder = config["encoder"]
    lines = [
        f"exported {config['source']['checkpoint']} -> {result.entry}" + ("  [demo]" if config["demo"] else ""),
        f"  architecture  {config['architecture']} ({encoder['layers']} layers, hidden {encoder['hidden_size']}, "
        f"{encoder['heads']} heads; stored {config['source'].get('stored_dtype') or 'unknown'}, exported from fp32)",
        f"  task          {head}",
        f"  inputs        {', '.join(config['inputs'])} -> {', '.join(config['outputs'])}; "
        f"max length {config['max_length']}; opset {config['export']['opset']}",
    ]
    for variant, entry in config["variants"].items():
        operators = ", ".join(f"{op} {n}" for op, n in entry["fused_operators"].items()) or "none"
        lines.append(f"  {variant:<5} {_size(entry['size_bytes']):>9}  {_validation(entry['validation'])}")
        lines.append(f"  {'':<5} {'':>9}  fused: {operators}")
    lines.append(f"  done in {result.seconds:.1f} s")
    return "\n".join(lines)


def _validation(report: dict[str, Any]) -> str:
    if not report["validated"]:
        return f"not validated: {report['reason']}"
    tolerance = f" (tolerance {report['tolerance']:g})" if report["tolerance"] is not None else ""
    text = (
        f"{report['provider']}, {len(report['cases'])} shapes: max |diff| {report['max_abs_diff']:.2e}{tolerance}, "
        f"{report['agreement_of']} agree {100 * report['agreement']:.1f}%"
    )
    return text


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"
