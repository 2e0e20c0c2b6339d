"""The engine: every model's ONNX Runtime session and batcher on one device. Knows nothing of HTTP or text.

Rows (token ids) come in, per-row outputs go out. It runs inside the server process (in-process mode) or in an
engine process of its own that front-end processes reach over a socket (service.engine.server).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertcore.messages import one_line, shown
from bertcore.rows import Row
from service.engine.batcher import Batcher
from service.engine.runtime import ModelRuntime
from service.errors import BadRequest, LoadFailed, ModelFailed, ModelNotFound, NotReady
from service.metrics import Metrics, forget
from service.repository import (
    budget_problem,
    entry_version,
    file_signature,
    load_entries,
    name_problem,
    read_config,
    scan,
)
from service.settings import Settings
from service.system.memory import malloc_trim
from service.wire.model_status import ModelStatus
from service.wire.ticket import Ticket

if TYPE_CHECKING:
    from prometheus_client import Gauge

log = logging.getLogger("service.engine")
# The longest a load call waits for every front-end to serve the new version (each self-tests it first)
LOAD_SETTLE_S = 60.0
# Polling loads a changed entry once its files have sat still this long: files copied over a served entry in place
# (`cp -r`, rsync) could be read between one file and the next, and loaded half old, half new, or fail to load
# (logged, counted and alerted on)
WRITE_QUIET_S = 1.0


@dataclass(eq=False)
class Generation:
    """One version of a model, open: its session, its batcher, its warm-up."""

    version: str
    runtime: ModelRuntime
    requested_at: float  # time.monotonic() when its load began
    batcher: Batcher | None = None
    warmed_shapes: int = 0
    counted: bool = False  # its load is in the metrics (once a front-end serves it)
    # This load's own id, across engine restarts: a version loaded again (after the front-ends turned it down, or
    # after an unload) is a new offer that each front-end checks anew, not one it has judged already
    offer: int = field(default_factory=time.monotonic_ns)


@dataclass
class EngineModel:
    """A model and its open versions: `current` is the one offered to the front-ends (the newest that loaded and
    warmed up); `older` ones stay open while a front-end still uses them or requests run on them."""

    name: str
    status: ModelStatus = ModelStatus.LOADING  # loading -> ready | failed; unloading
    error: str | None = None  # why it is failed
    current: Generation | None = None
    older: list[Generation] = field(default_factory=list)
    loading: str | None = None  # the version being loaded now
    load_error: str | None = None  # why the latest load failed (the version before keeps serving)
    failed_version: str | None = None  # that load's version: polling does not retry it ...
    failed_files: tuple | None = None  # ... while the entry's files are the ones it failed with (file_signature)

    @property
    def runtime(self) -> ModelRuntime | None:
        return self.current.runtime if self.current else None

    @property
    def batcher(self) -> Batcher | None:
        return self.current.batcher if self.current else None

    @property
    def warmed_shapes(self) -> int:
        return self.current.warmed_shapes if self.current else 0

    def generation(self, version: str) -> Generation | None:
        for generation in (self.current, *self.older):
            if generation is not None and generation.version == version:
                return generation
        return None

    def state(self) -> dict[str, Any]:
        """What the front-ends need to know of this model (plain data: it crosses the process boundary)."""
        runtime = self.runtime
        return {
            "status": self.status,
            "error": self.error,
            "version": self.current.version if self.current else None,
            "offer": self.current.offer if self.current else None,
            "loading": self.loading,
            "load_error": self.load_error,
            "versions": [g.version for g in (self.current, *self.older) if g is not None],
            "provider": runtime.provider if runtime else None,
            "variant": runtime.variant if runtime else None,
            "note": runtime.placement.note if runtime else None,
            "placement": runtime.placement_report() if runtime else None,
            "cpu_variant_trial": runtime.variant_trial if runtime else None,
            "shape_buckets": len(runtime.grid.shapes) if runtime and runtime.grid else 0,
            "cuda_graphs": bool(runtime and runtime.graphs is not None),
            "warmed_shapes": self.warmed_shapes,
        }


class EngineCore:
    """Every model's open versions. Loads (at start, by a load call, by polling) run one at a time: the session
    opens on a thread of its own and warms up on its new batcher's thread, so the models serving meanwhile keep
    their device threads and event loop. A new version is offered to the front-ends once warmed up; each moves its
    traffic to it after its own self-test (`use`), or turns it down (`reject`: the version before keeps serving).
    A version no front-end uses any more is drained (its requests answered), closed, and its memory returned."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[str, EngineModel] = {}
        self.warmed_up = False
        self.on_change: Callable[[], None] = lambda: None  # called when a model's state changes
        self._load_lock: asyncio.Lock | None = None
        self._uses: dict[Hashable, dict[str, set[str]]] = {}  # front-end -> model -> versions it still uses
        self._front_ends: set[Hashable] = set()  # connected (a load call is answered once each serves the version)
        self._word = asyncio.Event()  # set at each front-end's word (use, reject, connect, leave)
        self._closing: set[asyncio.Task] = set()
        self._missing: dict[str, int] = {}  # polling: scans in a row that did not find the entry
        self._repository_error: str | None = None
        self._described: dict[str, dict[Gauge, tuple[str, ...]]] = {}  # model -> its info series (`_describe`)
        self.loaded_file: Path | None = None  # where the models loaded now are kept for a restart (`_record_loaded`)
        self._loaded = set(settings.model or ())  # explicit control: the models loaded now (`_record_loaded`)
        self.write_quiet_s = WRITE_QUIET_S

    def load(self) -> None:
        """Open every entry's session. StartupError where a model fails and --load-failure is fail."""
        load_entries(self.settings, log, self._open, self._failed)

    def _open(self, entry: Path) -> None:
        model = self.models[entry.name] = EngineModel(entry.name)
        started = time.monotonic()
        version = entry_version(entry)
        model.current = Generation(version, self._runtime(entry, version), started)
        self._describe(entry.name, model.current.runtime)

    def _runtime(self, entry: Path, version: str) -> ModelRuntime:
        """The session of `version` of the entry (on any thread); ValueError where the entry changed meanwhile."""
        runtime = ModelRuntime(entry, read_config(entry), self.settings)
        if entry_version(entry) != version:
            raise ValueError("the entry changed while it loaded (an export writing it?): load it again")
        log.info(
            "model %s: %s (%s); %d stream(s) of %d intra-op thread(s); version %s",
            entry.name,
            runtime.provider,
            runtime.variant,
            runtime.streams,
            runtime.intra_op_threads,
            version,
        )
        if runtime.placement.note:
            log.warning("model %s: %s", entry.name, runtime.placement.note)
        return runtime

    def _describe(self, name: str, runtime: ModelRuntime | None) -> None:
        """bertserve_model_info and bertserve_model_placement say what the version offered runs (`runtime`); the
        series of the one before go where their labels differ (another variant, provider or reason), and all of
        them where none is offered (unloaded, or its only version turned down)."""
        before = self._described.pop(name, {})
        now: dict[Gauge, tuple[str, ...]] = {}
        if runtime is not None:
            config = runtime.config
            now[self.metrics.model_info] = (name, config.task, config.architecture, runtime.variant, runtime.provider)
            now[self.metrics.model_placement] = (name, self.settings.device, runtime.provider, runtime.placement.reason)
            self._described[name] = now
        for gauge, labels in before.items():
            if now.get(gauge) != labels:
                forget(gauge, *labels)
        for gauge, labels in now.items():
            gauge.labels(*labels).set(1)

    def _failed(self, name: str, reason: str) -> None:
        model = self.models.setdefault(name, EngineModel(name))
        model.status, model.error, model.load_error = ModelStatus.FAILED, reason, reason
        entry = self.settings.repository / name
        with contextlib.suppress(OSError, ValueError):  # what it failed with: polling does not load that again
            model.failed_version = entry_version(entry)
            model.failed_files = file_signature(entry)
        self._count_failure(name)

    def start(self) -> None:
        for model in self.models.values():
            if model.current is not None and model.current.batcher is None:
                model.current.batcher = self._batcher(model.name, model.current.runtime, model.current.version)
                model.current.batcher.start()

    def _batcher(self, name: str, runtime: ModelRuntime, version: str) -> Batcher:
        return Batcher(
            name,
            runtime.execute,
            prepare=runtime.prepare,
            padded_cost=runtime.grid.padded_cost if runtime.grid is not None else None,
            max_batch_size=self.settings.max_batch_size,
            max_batch_tokens=max(self.settings.max_batch_tokens, runtime.max_length),
            max_wait_s=self.settings.max_wait_ms / 1000,
            max_queue_rows=self.settings.max_queue_rows,
            max_queue_s=self.settings.max_queue_s,
            max_padding_ratio=self._padding_ratio(runtime),
            observer=self.metrics.observer(name, runtime.streams),
            streams=runtime.streams,
            trace_attributes={
                "bertserve.model.version": version,
                "bertserve.provider": runtime.provider,
                "bertserve.variant": runtime.variant,
            },
        )

    def _padding_ratio(self, runtime: ModelRuntime) -> float:
        """On the CPU, rows of like length batch together (--max-padding-ratio). On a grid of shapes (CUDA) there
        is no cap unless one is set: measured on an H100 (BERT-base, 16-input requests from 64 connections),
        uncapped 29.9k sequences/s, 30.3k at 1.5, 27.2k at 1.25; a batch's fixed cost on the device (~1.2 ms)
        outweighs the padding a cap saves, and a deeper queue brings the padding down by itself (1.35 padded
        tokens per real one from 192 connections, 2.05 from 64)."""
        if runtime.grid is None or "max_padding_ratio" in self.settings.model_fields_set:
            return self.settings.max_padding_ratio
        return float("inf")

    async def warm_up(self) -> None:
        """Run every model at each warm-up shape on its batch thread, then mark it ready."""
        for model in list(self.models.values()):  # a load call may add one meanwhile
            generation = model.current
            if generation is None or generation.batcher is None or model.status != ModelStatus.LOADING:
                continue
            try:
                await self._warm(model.name, generation)
            except Exception as exc:
                reason = f"warm-up failed: {one_line(exc, hide=self.settings.repository)}"
                log.error("model %s: %s", model.name, reason)
                await self._close(model.name, generation)
                model.current = None
                self._failed(model.name, reason)
                self.on_change()
                continue
            model.status = ModelStatus.READY
            self.on_change()
        self.warmed_up = True
        self.on_change()

    async def _warm(self, name: str, generation: Generation) -> None:
        if not self.settings.warmup or generation.batcher is None:
            return
        started = time.monotonic()
        generation.warmed_shapes = await generation.batcher.run_on_worker(generation.runtime.warm_up)
        log.info("model %s: warmed up %d shapes in %.1f s", name, generation.warmed_shapes, time.monotonic() - started)

    async def infer(self, name: str, rows: list[Row], ticket: Ticket) -> list[dict[str, Any]]:
        _, batcher = self.serving(name)
        return await batcher.submit(rows, ticket)

    def serving(self, name: str) -> tuple[ModelRuntime, Batcher]:
        """The runtime and batcher that take requests for `name` now (NAME, the version offered, or NAME@VERSION,
        a version a front-end still uses); else the domain error that says why not."""
        name, _, version = name.partition("@")
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound.named(name)
        if version:
            generation = model.generation(version)
            if generation is None or generation.batcher is None:
                raise NotReady(f"model {name} version {version} is not loaded (any more); try again")
            return generation.runtime, generation.batcher
        if model.status == ModelStatus.FAILED:
            raise ModelFailed.because(name, model.error)
        if model.status == ModelStatus.UNLOADING:
            raise ModelNotFound(f"model {name} is being unloaded")
        if model.status != ModelStatus.READY or model.batcher is None or model.runtime is None:
            raise NotReady.loading(name)
        return model.runtime, model.batcher

    # --- Loading and unloading while serving ---------------------------------------------------------------------

    def _lock(self) -> asyncio.Lock:
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        return self._load_lock

    def _entry(self, name: str) -> Path:
        if problem := name_problem(name):
            raise BadRequest(problem, field="name")
        return self.settings.repository / name

    async def load_model(self, name: str) -> dict[str, Any]:
        """Load the entry's version on disk, beside the version serving (if any); answered once it is warmed up and
        offered to the front-ends. The same version as the one serving: nothing to do. LoadFailed says why a load
        failed (the version before keeps serving); ModelNotFound where there is no such entry."""
        entry = self._entry(name)
        async with self._lock():
            if not entry.is_dir() or (self.settings.models and name not in self.settings.models):
                raise ModelNotFound(f"no entry named {name!r} in the model repository")
            started = time.monotonic()
            model = self.models.get(name)
            try:
                version = await asyncio.to_thread(entry_version, entry)
            except (OSError, ValueError) as exc:
                raise self._load_failed(name, None, one_line(exc, hide=self.settings.repository)) from None
            if problem := await asyncio.to_thread(budget_problem, entry, self.settings):
                raise self._load_failed(name, version, problem)
            current = model.current if model is not None and model.status == ModelStatus.READY else None
            if model is not None and current is not None and current.version == version:
                self._settle(model)  # the entry is the version serving again: a failed load before is over
                return {"name": name, "version": version, "changed": False}
            if model is None:
                model = self.models[name] = EngineModel(name)
            model.loading = version
            self.on_change()
            generation = None
            try:
                runtime = await asyncio.to_thread(self._runtime, entry, version)
                generation = Generation(version, runtime, started)
                generation.batcher = self._batcher(name, runtime, version)
                generation.batcher.start()
                await self._warm(name, generation)
            except Exception as exc:
                reason = one_line(exc, hide=self.settings.repository)
                if generation is not None:
                    await self._close(name, generation)
                model.loading = None  # before the word on the failure goes out: it said "loading" for good
                raise self._load_failed(name, version, reason) from None
            finally:
                model.loading = None
            self._offer(model, generation)
            return {"name": name, "version": version, "changed": True}

    def _load_failed(self, name: str, version: str | None, reason: str) -> LoadFailed:
        """Record a failed load (a version before keeps serving) and the error that answers it."""
        model = self.models.get(name)
        shown = f"version {version} failed to load: {reason}" if version else f"failed to load: {reason}"
        log.error("model %s %s", name, shown)
        if model is not None:
            model.load_error, model.failed_version = shown, version
            try:
                model.failed_files = file_signature(self.settings.repository / name)
            except OSError:
                model.failed_files = None
            if model.current is None and model.status != ModelStatus.UNLOADING:
                model.status, model.error = ModelStatus.FAILED, reason
        self._count_failure(name)
        self.on_change()
        return LoadFailed(f"model {name} {shown}")

    def _settle(self, model: EngineModel) -> None:
        """The entry on disk is the version serving: a load that failed before is no longer the model's state (its
        error, the failure gauge that fires BertserveModelLoadFailed)."""
        if model.load_error is None and model.failed_version is None:
            return
        model.load_error = model.failed_version = model.failed_files = None
        self.metrics.model_load_failed.labels(model.name).set(0)
        self.on_change()

    def _count_failure(self, name: str) -> None:
        self.metrics.model_loads.labels(name, "ok")
        self.metrics.model_loads.labels(name, "failed").inc()
        self.metrics.model_load_failed.labels(name).set(1)

    def _offer(self, model: EngineModel, generation: Generation) -> None:
        """The new version becomes the one offered; the one before stays open while front-ends use it."""
        if model.current is not None:
            model.older.append(model.current)
        model.current, model.status, model.error = generation, ModelStatus.READY, None
        model.load_error = model.failed_version = model.failed_files = None
        self._describe(model.name, generation.runtime)
        log.info("model %s: version %s is loaded and warmed up", model.name, generation.version)
        self.on_change()
        self._retire()

    def use(self, front_end: Hashable, name: str, versions: list[str]) -> None:
        """A front-end's word: of model `name` it still uses `versions` (the one it serves, and older ones its
        requests in flight hold). The first use of a version counts its load as done."""
        uses = self._uses.setdefault(front_end, {})
        if versions:
            uses[name] = set(versions)
        else:
            uses.pop(name, None)
        model = self.models.get(name)
        for version in versions:
            generation = model.generation(version) if model else None
            if model is None or generation is None or generation.counted:
                continue
            generation.counted = True
            self.metrics.model_loads.labels(name, "failed")
            self.metrics.model_loads.labels(name, "ok").inc()
            self.metrics.model_load_duration.labels(name).observe(time.monotonic() - generation.requested_at)
            self.metrics.model_load_failed.labels(name).set(0)
            for other in (model.current, *model.older):
                if other is not None:
                    self.metrics.model_version.labels(name, other.version).set(1 if other is generation else 0)
        self._retire()
        self._heard()

    def reject(self, name: str, version: str, reason: str) -> None:
        """A front-end could not serve `version` (its self-test failed): the version before, if any, is offered
        again, and this one closes once nothing uses it."""
        model = self.models.get(name)
        generation = model.generation(version) if model else None
        if model is None or generation is None:
            return
        if generation is model.current:
            model.current = model.older.pop() if model.older else None
            model.older.append(generation)
            if model.current is None:
                model.status = ModelStatus.FAILED
            self._describe(name, model.runtime)
        self._load_failed(name, version, reason)
        if model.current is None:
            model.error = reason
        self._retire()
        self._heard()

    def forget(self, front_end: Hashable) -> None:
        """The front-end went away: it uses nothing any more."""
        self._uses.pop(front_end, None)
        self._front_ends.discard(front_end)
        self._retire()
        self._heard()

    def connect(self, front_end: Hashable) -> None:
        """A front-end connected: a load call now waits for its word too."""
        self._front_ends.add(front_end)
        self._heard()

    def _heard(self) -> None:
        self._word.set()
        self._word = asyncio.Event()

    async def _until_served(self, name: str, version: str, timeout_s: float) -> None:
        """Until every connected front-end serves `version` of the model (its `use` names it), or `timeout_s` has
        passed (answered anyway, with a warning); LoadFailed where a front-end turned it down (its self-test failed:
        the version before serves again)."""
        deadline = time.monotonic() + timeout_s
        while True:
            model = self.models.get(name)
            generation = model.generation(version) if model is not None else None
            if model is None or generation is None or generation is not model.current:
                if model is None or model.status == ModelStatus.UNLOADING:
                    raise LoadFailed.unloaded(name, version)
                if model.failed_version == version:
                    raise LoadFailed(f"model {name} {model.load_error}")
                return  # superseded meanwhile (a newer version serves): nothing more to wait for
            waiting = [fe for fe in self._front_ends if version not in self._uses.get(fe, {}).get(name, ())]
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                if waiting:
                    log.warning(
                        "model %s: version %s loaded; %d front-end(s) did not serve it within %g s",
                        name,
                        version,
                        len(waiting),
                        timeout_s,
                    )
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._word.wait(), remaining)

    async def unload_model(self, name: str) -> dict[str, Any]:
        """Stop offering the model: new requests get 404, the ones in flight finish; once no front-end uses any of
        its versions they close and the model is gone."""
        self._entry(name)
        async with self._lock():
            model = self.models.get(name)
            if model is None:
                raise ModelNotFound(f"no model named {name!r} is loaded")
            if model.status != ModelStatus.UNLOADING:
                if model.current is not None:
                    model.older.append(model.current)
                    self.metrics.model_version.labels(name, model.current.version).set(0)
                model.current, model.status, model.error = None, ModelStatus.UNLOADING, None
                self._describe(name, None)
                self.metrics.model_unloads.labels(name, "ok").inc()
                log.info("model %s: unloading", name)
                self.on_change()
                self._retire()
                self._heard()  # a load call waiting for the front-ends to serve it: it is answered now
            return {"name": name, "state": "UNLOADING" if name in self.models else "UNAVAILABLE"}

    def _used(self, name: str, version: str) -> bool:
        return any(version in uses.get(name, ()) for uses in self._uses.values())

    def _retire(self) -> None:
        """Close every version that is not offered and no front-end uses; drop unloaded models that have none."""
        for name, model in list(self.models.items()):
            for generation in list(model.older):
                if not self._used(name, generation.version):
                    model.older.remove(generation)  # no new request reaches it; those queued drain first
                    task = asyncio.get_running_loop().create_task(self._close(name, generation, drain=True))
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)
            if (
                model.status == ModelStatus.UNLOADING
                and model.current is None
                and not model.older
                and not model.loading
            ):
                del self.models[name]
                self._forget_model(name)
                self.on_change()

    async def _close(self, name: str, generation: Generation, drain: bool = False) -> None:
        """Answer what it holds, stop its threads, drop its session, give the memory back."""
        batcher = generation.batcher
        if batcher is not None:
            if drain:
                give_up = time.monotonic() + self.settings.request_timeout_s + 1
                while not batcher.idle() and time.monotonic() < give_up:
                    await asyncio.sleep(0.01)
            await batcher.stop()
        generation.runtime.memory.close()
        generation.batcher = None
        del generation.runtime
        gc.collect()
        malloc_trim()
        log.info("model %s: version %s closed", name, generation.version)
        model = self.models.get(name)
        if model is None or model.generation(generation.version) is None:  # not the same version loaded anew
            forget(self.metrics.model_version, name, generation.version)
        if model is None:  # the model is gone: its queue's series too, which the drain may have written
            self._forget_model(name)
        self.on_change()

    def _forget_model(self, name: str) -> None:
        """A model gone (unloaded, its versions closed or closing): its series that would otherwise stay, the last
        load's failure included (its alert would fire for a model no longer there)."""
        forget(self.metrics.queue_depth, name)
        forget(self.metrics.model_load_failed, name)

    def index(self) -> list[dict[str, Any]]:
        """The repository's entries and the loaded models, with their state (Triton's names) and version: the one
        serving, or for an entry not loaded, the one on disk. Blocking (it reads the disk): run it on a thread."""
        try:
            entries = scan(self.settings)
        except OSError as exc:
            raise NotReady(f"the model repository cannot be read: {exc.strerror or exc}") from None
        listed = []
        for name in sorted(set(entries) | set(self.models)):
            model = self.models.get(name)
            version, reason = None, ""
            if model is None or model.status == ModelStatus.FAILED:
                state = "UNAVAILABLE"
                reason = model.error or "" if model else "not loaded"
            else:
                state = {
                    ModelStatus.READY: "READY",
                    ModelStatus.LOADING: "LOADING",
                    ModelStatus.UNLOADING: "UNLOADING",
                }.get(model.status, "LOADING")
                version = model.current.version if model.current else None
                reason = model.load_error or ""
            if version is None and name in entries:
                try:
                    version = entry_version(entries[name])
                except (OSError, ValueError) as exc:
                    reason = reason or one_line(exc, hide=self.settings.repository)
            listed.append({"name": name, "version": version or "", "state": state, "reason": reason})
        return listed

    async def control(self, action: str, name: str) -> dict[str, Any]:
        """An admin call: load, unload or index. A load is answered once every connected front-end serves the new
        version (a request on any connection right after the answer gets it), or LoadFailed where one turned it
        down."""
        if action == "load":
            result = await self.load_model(name)
            self._record_loaded(name, loaded=True)
            await self._until_served(name, str(result["version"]), LOAD_SETTLE_S)
            return result
        if action == "unload":
            result = await self.unload_model(name)
            self._record_loaded(name, loaded=False)
            return result
        if action == "index":
            return {"models": await asyncio.to_thread(self.index)}
        raise BadRequest(f"unknown action {shown(action, 52)}")

    def _record_loaded(self, name: str, loaded: bool) -> None:
        """--model-control explicit in process mode: the models loaded now, written to `loaded_file`, which a
        restarted engine loads at its start in place of --model's (`loaded_at_restart`)."""
        if self.loaded_file is None:
            return
        self._loaded = self._loaded | {name} if loaded else self._loaded - {name}
        written = self.loaded_file.with_suffix(".tmp")
        written.write_text(json.dumps(sorted(self._loaded)), encoding="utf-8")
        written.replace(self.loaded_file)

    async def poll_repository(self) -> None:
        """--model-control poll: every --repository-poll-s, load new entries, reload changed ones, unload the ones
        gone (in two scans in a row: an export renames the old entry away a moment before the new one is in). A
        repository that cannot be read is logged once, and the models keep serving."""
        while True:
            await asyncio.sleep(self.settings.repository_poll_s)
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "polling the model repository failed; trying again in %g s", self.settings.repository_poll_s
                )

    async def poll_once(self) -> None:
        try:
            entries = await asyncio.to_thread(scan, self.settings)
            if not entries and self.models:
                raise OSError("it holds no entries")
        except OSError as exc:
            reason = f"the model repository {self.settings.repository} cannot be read: {exc.strerror or exc}"
            if reason != self._repository_error:
                log.error("%s; the loaded models keep serving", reason)
                self._repository_error = reason
            return
        if self._repository_error is not None:
            log.info("the model repository %s can be read again", self.settings.repository)
            self._repository_error = None
        for name, entry in entries.items():
            self._missing.pop(name, None)
            try:
                version = await asyncio.to_thread(entry_version, entry)
            except (OSError, ValueError):
                continue  # being written: the next scan
            model = self.models.get(name)
            if model is not None and version == model.loading:
                continue
            if model is not None and version == model.failed_version:
                # Not again with the very files it failed with (a broken export fails the same way); with files
                # written since, yes, whatever their digest: a load that failed because the entry changed under it
                # (rolled back mid-load, then put back) is tried again
                with contextlib.suppress(OSError):
                    if await asyncio.to_thread(file_signature, entry) == model.failed_files:
                        continue
            if model is not None and model.current is not None and model.current.version == version:
                self._settle(model)
                continue
            if await asyncio.to_thread(self._written_lately, entry):
                continue  # being copied in place: the next scan
            with contextlib.suppress(LoadFailed, ModelNotFound, BadRequest):  # logged, counted and reported
                await self.load_model(name)
        for name in [name for name in self.models if name not in entries]:
            self._missing[name] = self._missing.get(name, 0) + 1
            if self._missing[name] >= 2 and self.models[name].status != ModelStatus.UNLOADING:
                log.info("model %s: its entry is gone from the repository; unloading", name)
                await self.unload_model(name)

    def _written_lately(self, entry: Path) -> bool:
        """Whether a file of the entry was written (or its metadata changed) within `write_quiet_s`: ctime, which
        every write moves, and `cp -p` or rsync's preserved times do not hide. Files stamped by a clock ahead of
        this one by more than that (a network filesystem's server) do not hold a load back."""
        try:
            newest = max((ctime for *_, ctime in file_signature(entry)), default=0)
        except OSError:
            return True
        age_s = (time.time_ns() - newest) / 1e9
        return -self.write_quiet_s < age_s < self.write_quiet_s

    async def stop(self) -> None:
        for task in list(self._closing):
            task.cancel()
        generations = [g for m in self.models.values() for g in (m.current, *m.older) if g is not None]
        await asyncio.gather(*(g.batcher.stop() for g in generations if g.batcher is not None))

    def stuck(self) -> str | None:
        """Why the device counts as stuck, if it does: a batch still running --liveness-stall-s past every request's
        deadline (--request-timeout-s). Its requests were answered 504 long ago, and the device has not come back."""
        bound = self.settings.request_timeout_s + self.settings.liveness_stall_s
        for model in self.models.values():
            if model.batcher is not None and (busy := model.batcher.device_busy_s()) > bound:
                return (
                    f"model {model.name}: a batch has been on the device for {busy:.0f} s, past --request-timeout-s "
                    f"+ --liveness-stall-s ({bound:g} s)"
                )
        return None

    def model_reports(self) -> dict[str, dict[str, Any]]:
        return {name: model.state() for name, model in self.models.items()}
