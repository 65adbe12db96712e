"""In-process vLLM, driven through vLLM's own OpenAI serving layer.

This is the path ``vllm run-batch`` takes (``vllm/entrypoints/launchers/run_batch.py``): vLLM's
argument parser gives the full argument namespace, ``build_async_engine_client`` starts the engine
(``AsyncLLM``; its engine core runs in a child process), ``init_app_state`` builds the serving
objects (``OpenAIServingChat``, ``OpenAIServingCompletion``, ``OpenAIServingResponses``,
``ServingEmbedding``), and every request body goes through them, so response bodies are exactly
what ``vllm serve`` answers. Unlike ``run-batch`` we also serve ``/v1/completions`` and
``/v1/responses``, stream results as they finish and notice engine death instead of writing a 500
for every remaining row.

``/v1/responses`` runs with vLLM's response store off (whatever ``VLLM_ENABLE_RESPONSES_API_STORE``
says): a batch line is answered once, into the output file, and a store that is never emptied would
only grow with every row. Validation already refuses the fields that need it
(``llmbatch.core.validation.responses``).

vLLM is untyped and heavy (~15 s to import): it is imported only inside :meth:`VllmEngine.start`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from llmbatch.api.shard import MediaLimits, ModelRef
from llmbatch.executor import revision
from llmbatch.executor.engines import vllmcore
from llmbatch.executor.engines.base import (
    Engine,
    EngineConfigError,
    EngineDead,
    EngineRequest,
    EngineResult,
    error_body,
)

log = logging.getLogger("llmbatch.executor.vllm")

#: Environment the CPU build needs; set (if unset) before vLLM is imported.
CPU_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; the default asks for far more memory
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_TARGET_DEVICE": "cpu",
}
#: Environment every run gets (if unset): weights come from local folders, never from a hub.
COMMON_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
#: Engine args applied on the CPU platform unless the spec sets them. Chunked prefill stays off:
#: with it, a per-request `seed` kills the CPU engine ("CPU Generator does not use offset").
CPU_ENGINE_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 2048,
    "max_num_seqs": 32,
    "enable_chunked_prefill": False,
    "max_num_batched_tokens": 8192,
}
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's own default when the spec does not say
#: Engine args applied on every platform unless the spec sets them. Priority scheduling lets the
#: requests of an expedited shard overtake the queued requests of standard and flex shards that
#: share the engine (a warm slot runs several shards at once); with ``fcfs`` the engine refuses
#: any request priority but 0, so the tier priority is then not sent.
ENGINE_DEFAULTS: dict[str, Any] = {"scheduling_policy": "priority"}
#: The scheduler a priority-scheduled engine gets unless the spec names one: a waiting request of
#: a higher tier takes the seat of a running lower-tier one (vLLM's own preemption; tiersched).
TIER_SCHEDULER = "llmbatch.executor.engines.tiersched.tier_scheduler"
#: The only host vLLM's media connector may fetch from: a name that never resolves (RFC 6761).
#: The executor fetches remote media itself, guarded (executor.mediagate); should an http(s)
#: URL reach the engine anyway, the connector refuses it.
NO_MEDIA_HOST = "no-fetch.llmbatch.invalid"


def media_settings(limits: MediaLimits) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine args (defaults a pool's own engine args override) and the environment (set
    whatever it was) that make vLLM apply the pool's image limits and never fetch media."""
    args: dict[str, Any] = {
        "limit_mm_per_prompt": {"image": limits.max_images_per_request, "video": 0},
        "allowed_media_domains": [NO_MEDIA_HOST],
    }
    env = {
        "VLLM_MAX_IMAGE_PIXELS": str(limits.max_image_pixels),
        "VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0",
    }
    return args, env


def _load(module: str, *names: str) -> Any:
    """``module.name...`` loaded dynamically: vLLM is untyped and optional."""
    loaded: Any = importlib.import_module(module)
    for name in names:
        loaded = getattr(loaded, name)
    return loaded


def engine_argv(model: ModelRef, served_names: list[str], args: dict[str, Any]) -> list[str]:
    """vLLM command-line arguments for ``model`` and the engine ``args`` (Python names)."""
    argv = ["--model", model.path, "--served-model-name", *served_names]
    for name, value in args.items():
        if name in ("model", "served_model_name"):
            raise EngineConfigError(f"engine arg {name!r} is set by the spec's model")
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, list | tuple):
            argv.extend([flag, *(str(v) for v in value)])
        elif isinstance(value, dict):
            argv.extend([flag, json.dumps(value)])
        else:
            argv.extend([flag, str(value)])
    return argv


def pinned_weights(model: ModelRef) -> ModelRef:
    """``model`` with ``path`` the folder of its pinned revision (executor/revision.py); an
    :class:`EngineConfigError` when the weights there are another revision."""
    try:
        weights = revision.resolve(model.path, model.revision)
    except revision.RevisionMismatch as exc:
        raise EngineConfigError(str(exc)) from exc
    if model.revision is not None and not weights.verified:
        log.warning(
            "model folder %s declares no revision (no %s file, not a Hugging Face cache): "
            "revision %r is served unchecked",
            weights.folder,
            revision.MARKER,
            model.revision,
        )
    else:
        log.info("model %s: weights %s (revision %s)", model.name, weights.folder, weights.revision)
    return model.model_copy(update={"path": str(weights.folder), "revision": weights.revision})


def response_id(request_id: str) -> str:
    """The ``id`` of a ``/v1/responses`` answer: ``resp_`` and the line's own digest, so a re-run
    of the line answers with the same id (the other endpoints' ids derive from it too)."""
    return "resp_" + request_id.removeprefix("req_")


def is_cpu_platform() -> bool:
    """True when this vLLM build targets the CPU (the ``vllm-cpu`` distribution)."""
    from importlib import metadata

    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        return True
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


class VllmEngine(Engine):
    name = "vllm"

    def __init__(
        self,
        args: dict[str, Any],
        model: ModelRef,
        served_names: list[str],
        media: MediaLimits | None = None,
    ) -> None:
        self.model = model
        self.served_names = served_names
        self.cpu = is_cpu_platform()
        media_args, self.media_env = media_settings(media or MediaLimits())
        defaults = {**ENGINE_DEFAULTS, **media_args, **(CPU_ENGINE_DEFAULTS if self.cpu else {})}
        self.args = {**defaults, **args}
        self.priority_scheduling = self.args.get("scheduling_policy") == "priority"
        if self.priority_scheduling:
            self.args.setdefault("scheduler_cls", TIER_SCHEDULER)
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._chat: Any = None
        self._completion: Any = None
        self._embedding: Any = None
        self._responses: Any = None
        self._closed = False
        self._api: dict[str, Any] = {}

    @property
    def max_num_seqs(self) -> int:
        value = self.args.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS)
        return int(value)

    async def start(self) -> None:
        if not Path(self.model.path).exists():
            raise EngineConfigError(f"model path not found: {self.model.path}")
        weights = pinned_weights(self.model)
        for key, value in {**COMMON_ENV, **(CPU_ENV if self.cpu else {})}.items():
            os.environ.setdefault(key, value)
        os.environ.update(self.media_env)
        argv = engine_argv(weights, self.served_names, self.args)
        log.info("starting vLLM: %s", " ".join(argv))
        # on CPU, the engine core's import runs in a forkserver while we import the rest
        core_server = self.cpu and vllmcore.enabled() and vllmcore.start_server()

        entry = "vllm.entrypoints.launchers.api_server.entry"
        build_async_engine_client = _load(entry, "build_async_engine_client")
        init_app_state = _load(entry, "init_app_state")
        make_arg_parser = _load("vllm.entrypoints.launchers.run_batch", "make_arg_parser")
        usage_context = _load("vllm.usage.usage_lib", "UsageContext", "OPENAI_BATCH_RUNNER")
        parser_class = _load("vllm.utils.argparse_utils", "FlexibleArgumentParser")
        state_class = _load("starlette.datastructures", "State")
        self._api = {
            "chat_request": _load(
                "vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest"
            ),
            "completion_request": _load(
                "vllm.entrypoints.openai.completion.protocol", "CompletionRequest"
            ),
            "embedding_request": _load(
                "vllm.entrypoints.pooling.embed.protocol", "EmbeddingRequest"
            ),
            "responses_request": _load(
                "vllm.entrypoints.openai.responses.protocol", "ResponsesRequest"
            ),
            "error_response": _load("vllm.entrypoints.serve.engine.protocol", "ErrorResponse"),
            "create_error_response": _load("vllm.entrypoints.serve", "create_error_response"),
        }

        if core_server:
            vllmcore.use_for_engine_core()
        parser = make_arg_parser(parser_class(prog="llmbatch-executor"))
        try:
            ns = parser.parse_args(["-i", "-", "-o", "-", *argv])
        except SystemExit as exc:  # argparse reports and exits on a bad flag
            raise EngineConfigError(f"vLLM rejected the engine args: {argv}") from exc
        try:
            client = await self._stack.enter_async_context(
                build_async_engine_client(ns, usage_context=usage_context)
            )
        except (ValueError, TypeError, OSError) as exc:
            await self._stack.aclose()
            raise EngineConfigError(f"vLLM could not start: {exc}") from exc
        self._client = client
        supported = await client.get_supported_tasks()
        state = state_class()
        await init_app_state(client, state, ns, supported)
        self._chat = getattr(state, "openai_serving_chat", None)
        self._completion = getattr(state, "openai_serving_completion", None)
        self._embedding = getattr(state, "serving_embedding", None)
        self._responses = getattr(state, "openai_serving_responses", None)
        if self._responses is not None:
            self._responses.enable_store = False  # see the module docstring
        log.info("vLLM ready; supported tasks: %s", supported)

    def dead_reason(self) -> str | None:
        client = self._client
        if client is None or self._closed:
            return None
        try:
            errored = bool(client.errored)
        except Exception as exc:
            return f"vLLM engine state unknown: {exc}"
        if errored:
            return "vLLM engine core died (EngineDeadError); see the executor log"
        return None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stack.aclose()
        client = self._client
        if client is not None:
            # Shut down by the context manager already; vLLM's AsyncLLM.__del__ would shut it
            # down again at interpreter exit and fail noisily.
            with contextlib.suppress(Exception):
                client.shutdown = lambda *args, **kwargs: None
        # Drop the serving objects and the client now, not at interpreter exit (vLLM's
        # AsyncLLM.__del__ fails noisily when it runs during shutdown).
        self._chat = self._completion = self._embedding = self._responses = None
        self._client = None
        import gc

        gc.collect()

    async def handle(self, request: EngineRequest) -> EngineResult:
        dead = self.dead_reason()
        if dead is not None:
            raise EngineDead(dead)
        try:
            response = await self._call(request)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            message = f"{first.get('msg')} ({param})" if param else str(first.get("msg"))
            return EngineResult(400, error_body(message, status_code=400, param=param))
        except Exception as exc:
            response = self._api["create_error_response"](exc)
        return self._result(response)

    async def _call(self, request: EngineRequest) -> Any:
        body = dict(request.body)
        if self.priority_scheduling:
            # The tier decides, not the line: a line's own `priority` (a vLLM extension) would
            # let one batch jump its tier.
            body["priority"] = request.priority
        if request.url == "/v1/chat/completions":
            if self._chat is None:
                return self._unsupported(request.url)
            body.setdefault("request_id", request.request_id)
            return await self._chat.create_chat_completion(
                self._api["chat_request"].model_validate(body)
            )
        if request.url == "/v1/completions":
            if self._completion is None:
                return self._unsupported(request.url)
            body.setdefault("request_id", request.request_id)
            completion = self._api["completion_request"].model_validate(body)
            return await self._completion.create_completion(completion)
        if request.url == "/v1/responses":
            if self._responses is None:
                return self._unsupported(request.url)
            # Always ours (vLLM's extra field names the engine request: two rows naming the
            # same one would collide there), so the response id is the line's own.
            body["request_id"] = response_id(request.request_id)
            responses = self._api["responses_request"].model_validate(body)
            return await self._responses.create_responses(responses)
        if request.url == "/v1/embeddings":
            if self._embedding is None:
                return self._unsupported(request.url)
            embed = TypeAdapter(self._api["embedding_request"]).validate_python(body)
            return await self._embedding(embed)
        return self._unsupported(request.url)

    def _unsupported(self, url: str) -> EngineResult:
        message = f"The model {self.model.name} does not support {url}."
        return EngineResult(400, error_body(message, status_code=400, param="url"))

    def _result(self, response: Any) -> EngineResult:
        if isinstance(response, EngineResult):
            return response
        if isinstance(response, self._api["error_response"]):
            err = response.error
            status = int(err.code)
            body = error_body(err.message, status_code=status, param=err.param)
            return EngineResult(status, body)
        if isinstance(response, BaseModel):
            return EngineResult(200, response.model_dump(mode="json"))
        raw = getattr(response, "body", None)
        if isinstance(raw, bytes | bytearray):  # a starlette Response (pooling endpoints)
            status = int(getattr(response, "status_code", 200))
            decoded = json.loads(raw)
            if status >= 400 and isinstance(decoded.get("error"), dict):
                err = decoded["error"]
                decoded = error_body(
                    str(err.get("message")), status_code=status, param=err.get("param")
                )
            return EngineResult(status, decoded)
        message = "Streaming responses are not supported in batch."
        return EngineResult(400, error_body(message, status_code=400, param="stream"))
