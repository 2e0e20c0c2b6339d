"""The committed generated code is what protoc makes of inference.proto (python -m service.frontend.grpc.generate)."""

from __future__ import annotations

from service.frontend.grpc.generate import HERE, generated


def test_committed_generated_code_is_current() -> None:
    for name, text in generated().items():
        assert (HERE / name).read_text(encoding="utf-8") == text, "run: python -m service.frontend.grpc.generate"


def test_the_messages_live_in_a_pool_of_their_own_beside_tritonclients() -> None:
    import tritonclient.grpc.service_pb2 as triton

    from service.frontend.grpc import inference_pb2 as ours

    request = ours.ModelInferRequest(model_name="m", raw_input_contents=[b"\x01\x00\x00\x00a"])
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    theirs = triton.ModelInferRequest.FromString(request.SerializeToString())
    assert (
        theirs.model_name == "m"
        and theirs.inputs[0].shape == [1]
        and theirs.raw_input_contents == [b"\x01\x00\x00\x00a"]
    )
