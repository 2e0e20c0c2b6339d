"""The one map from the domain errors (`service.errors`, each with its HTTP status) to gRPC status codes.

The domain errors carry the HTTP status the REST API answers; gRPC answers the code that means the same to a gRPC
client: 429 and 413 are RESOURCE_EXHAUSTED (as grpc itself answers a message over the size limit), 504 is
DEADLINE_EXCEEDED, 503 UNAVAILABLE (a client may retry), 400 and 422 INVALID_ARGUMENT."""

from __future__ import annotations

import grpc

from service.errors import CLIENT_CLOSED, ServiceError

CODE_OF_STATUS = {
    200: grpc.StatusCode.OK,
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    CLIENT_CLOSED: grpc.StatusCode.CANCELLED,  # the client cancelled
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def code_of(error: ServiceError) -> grpc.StatusCode:
    return code_for_status(error.status_code)


def code_for_status(status: int) -> grpc.StatusCode:
    """The code of an answer's HTTP-equivalent status (200: OK; 499: the client cancelled)."""
    return CODE_OF_STATUS.get(status, grpc.StatusCode.UNKNOWN)
