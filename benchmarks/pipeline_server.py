"""What a user would write by hand: FastAPI around transformers.pipeline("text-classification"), PyTorch fp32.

    python -m benchmarks.pipeline_server CHECKPOINT --port 8001
Request body: {"inputs": [texts...]}; answer: {"results": [[{label, score}]...]}.
"""

from __future__ import annotations

import argparse

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import pipeline


class Body(BaseModel):
    inputs: list[str]


def build(checkpoint: str) -> FastAPI:
    classifier = pipeline("text-classification", model=checkpoint, model_kwargs={"dtype": torch.float32})
    app = FastAPI()

    @app.post("/classify")
    def classify(body: Body) -> dict:  # a plain def: FastAPI runs it in its thread pool
        return {"results": [[r] for r in classifier(body.inputs)]}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    uvicorn.run(build(args.checkpoint), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
