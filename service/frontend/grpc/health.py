"""grpc.health.v1.Health on --grpc-port (grpcio-health-checking's messages and stubs): what Kubernetes' native gRPC
probes (`grpc: {port: ...}`), grpc_health_probe and KServe's gRPC checks call.

- "" (the whole server) and "inference.GRPCInferenceService": SERVING while /readyz would say 200
  (`ServerState.readiness`), NOT_SERVING otherwise: loading, no model that can answer, the engine away, draining;
- "bertserve.Liveness": SERVING while /livez would say 200 (`ServerState.liveness`: a draining or loading server is
  alive), so a pod whose one routed port is gRPC's (KServe's v2 variant: Knative points every probe of the serving
  container at that port) has a liveness probe apart from readiness; no model is so named (models are lowercase);
- a model's name: SERVING while that model answers (`ServerState.model_ready`: ready and not draining), else
  NOT_SERVING (loading, checking, failed, unloaded);
- any other name: NOT_FOUND from Check, SERVICE_UNKNOWN from Watch, as the protocol says.
Open, as /livez and /readyz are: no API key. Neither logged nor counted in the request metrics: an orchestrator
calls it every few seconds.

Check answers from the state at the call, as /readyz does. A Watch stream sends the status again whenever it
changes: woken by the engine's word on the models and by the drain (`ServerState.watch`), and every HEARTBEAT_S for
the verdicts that time moves (a batch stuck on the device, a silent engine). The package's own servicer
(`grpc_health.v1.health.aio.HealthServicer`) was not used: it serves statuses that someone must set (a copy of the
state, behind it), and its Watch streams never end, so each one open would hold every drain for --drain-timeout-s
(grpc's stop waits for the calls in flight); here a stream ends once the server stops, after its last NOT_SERVING
(a client then watches again, with backoff, as the protocol asks).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, TypeAlias

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bertcore.messages import shown
from service.frontend.http.state import ServerState
from service.probes import HEARTBEAT_S

Status: TypeAlias = health_pb2.HealthCheckResponse.ServingStatus
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
INFERENCE_SERVICE = "inference.GRPCInferenceService"
WHOLE_SERVER = frozenset({"", INFERENCE_SERVICE})  # the names whose status is the server's readiness
LIVENESS = "bertserve.Liveness"  # the name whose status is the server's liveness


class HealthService(health_pb2_grpc.HealthServicer):
    """grpc.health.v1.Health's Check and Watch, from the front-end's state."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._closed = False
        self._woken = asyncio.Event()  # set (and replaced) at each change: every Watch stream looks again
        state.watch(self.wake)

    def status(self, service: str) -> Status | None:
        """The service's status now; None for a name that is neither the server nor one of its models."""
        if service in WHOLE_SERVER:
            ready = self.state.readiness()[0] == 200 and not self._closed
            return SERVING if ready else NOT_SERVING
        if service == LIVENESS:
            return SERVING if self.state.liveness()[0] == 200 else NOT_SERVING
        model = self.state.registry.models.get(service)
        if model is None:
            return None
        return SERVING if self.state.model_ready(model) and not self._closed else NOT_SERVING

    async def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> Any:
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, _unknown(request.service))
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        sent = None
        while True:
            woken = self._woken  # taken before the status: a change while it is being sent wakes the wait below
            status = self.status(request.service)
            status = SERVICE_UNKNOWN if status is None else status
            if status != sent:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                sent = status
            if self._closed:
                return  # its last word said NOT_SERVING (or SERVICE_UNKNOWN): it must not hold the drain
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), HEARTBEAT_S)

    def wake(self) -> None:
        """Every Watch stream looks again now. Safe from a signal handler: it only sets an event."""
        woken, self._woken = self._woken, asyncio.Event()
        woken.set()

    def close(self) -> None:
        """The server stops: every service is NOT_SERVING from now on, and each Watch stream ends after saying so."""
        self._closed = True
        self.wake()


def _unknown(service: str) -> str:
    known = f"'' (itself), {INFERENCE_SERVICE}, {LIVENESS} and its models"
    return f"unknown service {shown(service, 102)}: this server knows {known}"


def add_to(server: grpc.aio.Server, state: ServerState) -> HealthService:
    """Serve grpc.health.v1.Health on `server`, from `state`."""
    service = HealthService(state)
    health_pb2_grpc.add_HealthServicer_to_server(service, server)
    return service
