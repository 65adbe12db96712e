"""A deterministic stand-in engine for control-plane load tests. Never a default.

Answers have the exact OpenAI shapes of the four endpoints (a ``response`` object for
``/v1/responses``) and mark themselves with ``"system_fingerprint": "llmbatch-simulated"``; the
same request always gets the same answer.
Latency, throughput and failures are configurable (engine args, see :class:`SimulatedArgs`).
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import random
import re
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llmbatch.core.billing import token_usage
from llmbatch.executor.engines.base import (
    Engine,
    EngineConfigError,
    EngineDead,
    EngineRequest,
    EngineResult,
    error_body,
)

FINGERPRINT = "llmbatch-simulated"
_WORDS = (
    "batch",
    "inference",
    "runs",
    "requests",
    "asynchronously",
    "within",
    "a",
    "window",
    "and",
    "returns",
    "results",
    "matched",
    "by",
    "custom",
    "id",
    "so",
    "clients",
    "can",
    "join",
    "answers",
    "back",
    "to",
    "their",
    "data",
)


class SimulatedArgs(BaseModel):
    """Engine args of the simulated engine."""

    model_config = ConfigDict(extra="forbid")

    max_num_seqs: int = Field(default=32, ge=1)
    latency_seconds: float = Field(default=0.0, ge=0, description="Fixed time per request.")
    tokens_per_second: float | None = Field(
        default=None, gt=0, description="Per-request decode speed; None: instant."
    )
    default_output_tokens: int = Field(default=16, ge=1)
    embedding_dim: int = Field(default=8, ge=1)
    max_model_len: int = Field(default=4096, ge=1)
    fail_pattern: str | None = Field(
        default=None, description="custom_ids matching this regex get fail_status."
    )
    fail_rate: float = Field(default=0.0, ge=0, le=1, description="Share of requests failing.")
    fail_status: int = Field(default=500, ge=400, le=599)
    fail_attempts: int | None = Field(
        default=None,
        ge=1,
        description="A failing request (fail_pattern, fail_rate) fails only this many times, "
        "then answers (a transient fault: an overloaded or flaky engine); None: every time.",
    )
    seed: int = 0
    die_after: int | None = Field(
        default=None, ge=0, description="The engine dies after answering this many requests."
    )
    crash_pattern: str | None = Field(
        default=None,
        description="A request whose custom_id matches this regex crashes the engine (a poison "
        "request): after latency_seconds the engine dies, and every request in it then fails.",
    )
    hang_after: int | None = Field(
        default=None, ge=0, description="Requests after this many never get an answer."
    )
    created: int = Field(default=1_700_000_000, description="`created` of every answer.")
    max_running: int | None = Field(
        default=None,
        ge=1,
        description="Requests in the engine's running batch at once; the rest wait in its queue, "
        "ordered as scheduling_policy says; with priority, a better request also takes the "
        "place of a running worse one (as the executor's vLLM scheduler does with max_num_seqs). "
        "None: every request runs at once.",
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        default="priority",
        description="Queue order when max_running is reached: arrival, or request priority "
        "(lower first, then arrival) — the policy the executor gives vLLM.",
    )


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()


def _count_tokens(value: Any) -> int:
    """A rough token count of any JSON value: words of its strings, at least 1."""
    if isinstance(value, str):
        return max(1, len(value.split()))
    if isinstance(value, list):
        return sum(_count_tokens(v) for v in value) or 1
    if isinstance(value, dict):
        return sum(_count_tokens(v) for v in value.values()) or 1
    return 1


@dataclass
class _Seat:
    """A request's place in the simulated engine's running batch."""

    key: int
    arrival: int
    preempted: asyncio.Event = field(default_factory=asyncio.Event)


class SimulatedEngine(Engine):
    name = "simulated"

    def __init__(self, args: dict[str, Any], served_names: list[str]) -> None:
        try:
            self.args = SimulatedArgs.model_validate(args)
            self._fail_re = re.compile(self.args.fail_pattern) if self.args.fail_pattern else None
            crash = self.args.crash_pattern
            self._crash_re = re.compile(crash) if crash else None
        except (ValueError, re.error) as exc:
            raise EngineConfigError(f"simulated engine args: {exc}") from exc
        self.served_names = served_names
        self.answered = 0
        self.failures: dict[str, int] = {}
        """custom_id -> failures answered so far (``fail_attempts``)."""
        self._dead: str | None = None
        self._death = asyncio.Event()
        self._hang = asyncio.Event()
        self._seats: dict[int, _Seat] = {}  # the running batch, by arrival
        self._queue: list[tuple[int, int, asyncio.Future[_Seat]]] = []
        self._arrivals = itertools.count()

    @property
    def max_num_seqs(self) -> int:
        return self.args.max_num_seqs

    async def start(self) -> None:
        return None

    def dead_reason(self) -> str | None:
        return self._dead

    async def close(self) -> None:
        return None

    def _should_fail(self, custom_id: str) -> bool:
        if self._fail_re is not None and self._fail_re.search(custom_id):
            return True
        if self.args.fail_rate > 0:
            rng = random.Random(_digest(str(self.args.seed), custom_id))
            return rng.random() < self.args.fail_rate
        return False

    async def handle(self, request: EngineRequest) -> EngineResult:
        a = self.args
        if self._dead is not None:
            raise EngineDead(self._dead)
        if a.hang_after is not None and self.answered >= a.hang_after:
            await self._hang.wait()  # never set: a hung engine
        if self._crash_re is not None and self._crash_re.search(request.custom_id):
            await self._unless_dead(asyncio.sleep(a.latency_seconds))
            self._die(f"simulated engine crash on request {request.custom_id}")
            raise EngineDead(self._dead)
        body = request.body
        model = body.get("model")
        if model not in self.served_names:
            msg = f"The model `{model}` does not exist."
            return EngineResult(404, error_body(msg, status_code=404, param="model"))
        if self._should_fail(request.custom_id):
            failed = self.failures.get(request.custom_id, 0)
            if a.fail_attempts is None or failed < a.fail_attempts:
                self.failures[request.custom_id] = failed + 1
                msg = f"Simulated failure for {request.custom_id}."
                return EngineResult(a.fail_status, error_body(msg, status_code=a.fail_status))
        if request.url == "/v1/embeddings":
            result = self._embeddings(request, str(model))
        elif request.url == "/v1/responses":
            result = self._responses(request, str(model))
        else:
            result = self._generate(request, str(model))
        if result.ok:
            seconds = a.latency_seconds
            if a.tokens_per_second:
                seconds += token_usage(result.body).output_tokens / a.tokens_per_second
            if seconds:
                await self._unless_dead(self._run_for(seconds, request.priority))
        self.answered += 1
        if a.die_after is not None and self.answered >= a.die_after:
            self._die(f"simulated engine death after {self.answered} requests")
        return result

    def _die(self, reason: str) -> None:
        if self._dead is None:
            self._dead = reason
            self._death.set()

    async def _unless_dead(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` unless the engine dies first: then the request fails with it."""
        task = asyncio.ensure_future(work)
        death = asyncio.ensure_future(self._death.wait())
        try:
            await asyncio.wait({task, death}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            death.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():  # the engine died under it
            raise EngineDead(self._dead or "engine dead")
        task.result()

    async def _run_for(self, seconds: float, priority: int) -> None:
        """Hold a place in the running batch for ``seconds`` of running time. Under the priority
        policy a waiting request of a better priority takes the place of the worst running one
        (as the executor's vLLM scheduler does, ``engines.tiersched``): the preempted request
        queues again under its first arrival and runs the rest of its time once re-admitted."""
        key = priority if self.args.scheduling_policy == "priority" else 0
        arrival = next(self._arrivals)
        loop = asyncio.get_running_loop()
        while seconds > 0:
            seat = await self._admitted(key, arrival)
            started = loop.time()
            try:
                await asyncio.wait_for(seat.preempted.wait(), seconds)
            except TimeoutError:  # ran its time out: its place goes on
                self._leave(arrival)
                return
            except asyncio.CancelledError:
                self._leave(arrival)
                raise
            seconds -= loop.time() - started

    async def _admitted(self, key: int, arrival: int) -> _Seat:
        """Wait for a place in the running batch (``max_running``), queue order by ``key``."""
        limit = self.args.max_running
        if limit is None or (len(self._seats) < limit and not self._queue):
            return self._seat(key, arrival)
        if self.args.scheduling_policy == "priority" and self._seats:
            worst = max(self._seats.values(), key=lambda seat: (seat.key, seat.arrival))
            if key < worst.key:
                del self._seats[worst.arrival]
                worst.preempted.set()
                return self._seat(key, arrival)
        admitted: asyncio.Future[_Seat] = asyncio.get_running_loop().create_future()
        entry = (key, arrival, admitted)
        heapq.heappush(self._queue, entry)
        try:
            return await admitted
        except asyncio.CancelledError:
            if admitted.done() and not admitted.cancelled():
                self._leave(arrival)  # admitted, then cancelled before it ran: give the place on
            elif entry in self._queue:
                self._queue.remove(entry)
                heapq.heapify(self._queue)
            raise

    def _seat(self, key: int, arrival: int) -> _Seat:
        seat = _Seat(key, arrival)
        self._seats[arrival] = seat
        return seat

    def _leave(self, arrival: int) -> None:
        """A request left the running batch: admit the head of the queue (a wait cancelled a
        moment ago may still be in it: skipped). A request preempted a moment ago has no place
        left to give."""
        if self._seats.pop(arrival, None) is None:
            return
        while self._queue:
            key, queued, waiting = heapq.heappop(self._queue)
            if not waiting.done():
                waiting.set_result(self._seat(key, queued))
                return

    def _generate(self, request: EngineRequest, model: str) -> EngineResult:
        a = self.args
        body = request.body
        chat = request.url == "/v1/chat/completions"
        prompt: Any = body.get("messages") if chat else body.get("prompt")
        if not prompt:
            field = "messages" if chat else "prompt"
            msg = f"`{field}` is required."
            return EngineResult(400, error_body(msg, status_code=400, param=field))
        prompt_tokens = _count_tokens(prompt)
        if prompt_tokens > a.max_model_len:
            return self._too_long(prompt_tokens, "messages" if chat else "prompt")
        seed = _digest(request.custom_id, model)
        text, n, cut = self._text(seed, body.get("max_completion_tokens") or body.get("max_tokens"))
        finish = "length" if cut else "stop"
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
        }
        common = {"created": a.created, "model": model, "system_fingerprint": FINGERPRINT}
        if chat:
            return EngineResult(
                200,
                {
                    "id": "chatcmpl-sim-" + seed[:24],
                    "object": "chat.completion",
                    **common,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "logprobs": None,
                            "finish_reason": finish,
                        }
                    ],
                    "usage": usage,
                },
            )
        return EngineResult(
            200,
            {
                "id": "cmpl-sim-" + seed[:24],
                "object": "text_completion",
                **common,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                "usage": usage,
            },
        )

    def _too_long(self, prompt_tokens: int, param: str) -> EngineResult:
        msg = (
            f"This model's maximum context length is {self.args.max_model_len} tokens. However, "
            f"your request has {prompt_tokens} input tokens."
        )
        return EngineResult(400, error_body(msg, status_code=400, param=param))

    def _text(self, seed: str, limit: Any) -> tuple[str, int, bool]:
        """The answer's text, its token count, and whether the limit cut it short."""
        want = self.args.default_output_tokens
        n = min(int(limit), want) if isinstance(limit, int) and limit > 0 else want
        words = [_WORDS[int(seed[i % 64], 16) % len(_WORDS)] for i in range(n)]
        return " ".join(words), n, isinstance(limit, int) and limit <= want

    def _responses(self, request: EngineRequest, model: str) -> EngineResult:
        """A ``response`` object (``openai.types.responses.Response``), as vLLM's layer answers."""
        body = request.body
        if not body.get("input"):
            msg = "`input` is required."
            return EngineResult(400, error_body(msg, status_code=400, param="input"))
        input_tokens = _count_tokens([body["input"], body.get("instructions") or ""])
        if input_tokens > self.args.max_model_len:
            return self._too_long(input_tokens, "input")
        seed = _digest(request.custom_id, model)
        limit = body.get("max_output_tokens")
        text, n, cut = self._text(seed, limit)
        message = {
            "type": "message",
            "id": "msg_sim" + seed[24:48],
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        usage = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + n,
        }
        return EngineResult(
            200,
            {
                "id": "resp_sim" + seed[:24],
                "object": "response",
                "created_at": self.args.created,
                "status": "incomplete" if cut else "completed",
                "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
                "error": None,
                "instructions": body.get("instructions"),
                "max_output_tokens": limit,
                "metadata": body.get("metadata"),
                "model": model,
                "output": [message],
                "parallel_tool_calls": True,
                "temperature": body.get("temperature", 1.0),
                "tool_choice": "auto",
                "tools": [],
                "top_p": body.get("top_p", 1.0),
                "store": False,
                "usage": usage,
                "system_fingerprint": FINGERPRINT,
            },
        )

    def _embeddings(self, request: EngineRequest, model: str) -> EngineResult:
        raw = request.body.get("input")
        if raw is None or raw == "" or raw == []:
            msg = "`input` is required."
            return EngineResult(400, error_body(msg, status_code=400, param="input"))
        inputs: list[Any] = raw if isinstance(raw, list) else [raw]
        data = []
        for i, item in enumerate(inputs):
            rng = random.Random(_digest(str(item), model))
            vector = [round(rng.uniform(-1, 1), 6) for _ in range(self.args.embedding_dim)]
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = _count_tokens(inputs)
        return EngineResult(
            200,
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "system_fingerprint": FINGERPRINT,
            },
        )
