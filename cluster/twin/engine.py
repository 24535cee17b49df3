"""The twin's scheduler: continuous batching on a model clock, one thread, absolute deadlines.

Every request goes through a first-come first-served prefill (one prompt at a time, its
duration from the model), emits its first token, then advances by verify steps whose length
comes from the model for the number of requests in the engine at that moment. Step ``k`` of a
request emits ``floor(k·a) − floor((k−1)·a)`` tokens, ``a`` the accepted tokens per step, so
its long-run rate is exact. Deadlines are absolute (each one is the previous deadline plus a
step), so a late wake-up of the thread delays a delivery but never the schedule: the rates the
client measures are the model's, whatever the host's load.

Two deliberate modelling choices keep the host's accidents out of the measurement:
- a request that arrives within ``TURNAROUND_CREDIT_S`` of another's completion (a closed-loop
  client sending its next request) is timed from that completion: the client's own turnaround
  is not charged to the engine, and the slot counts as occupied meanwhile;
- deliveries are batched per wake-up (at least ``tick_s`` apart), as vLLM streams several
  accepted tokens in one chunk.

A *run* (one draw of run-to-run noise) starts when a request finds the engine idle: nothing in
flight and no slot being refilled. A bench cell is one run: it keeps the engine busy from its
first request to its window's end, where it cancels what is left.
"""

from __future__ import annotations

import heapq
import itertools
import math
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cluster import prompts
from cluster.stall import LATE_S
from cluster.twin import noise, text
from cluster.twin.physics import EngineModel
from knobs.records import Category

#: A request arriving this soon (wall seconds) after a completion is timed from it. 0.1 s was
#: too little on a loaded 2-core CI machine: a starved client refilled both of two slots later
#: than that, the engine found itself idle, and a new run (a new noise draw) began mid-cell.
TURNAROUND_CREDIT_S = 0.5
#: How often a held engine (a rank of its group stopped) looks again whether it may go on.
HELD_POLL_S = 0.05


@dataclass(frozen=True)
class Chunk:
    """Tokens delivered to one request at one wake-up; ``finished`` on its last chunk."""

    tokens: tuple[str, ...]
    total: int
    finished: bool


@dataclass(eq=False)
class Request:
    """One generation in the engine."""

    id: str
    prompt: str
    category: Category
    prompt_tokens: int
    max_tokens: int
    tokens: tuple[str, ...]
    accepted: float
    positions: tuple[float, ...]
    arrival: float
    out: queue.SimpleQueue[Chunk] = field(default_factory=queue.SimpleQueue)
    prefill_start: float = 0.0
    steps: int = 0
    emitted: int = 0
    done: bool = False
    aborted: bool = False


@dataclass
class Counters:
    """The engine's Prometheus counters and gauges."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_ok: int = 0
    requests_aborted: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)
    running: int = 0
    waiting: int = 0
    stall_s: float = 0.0


class Engine:
    """Continuous batching over an ``EngineModel`` at a given speed (noise × clocks)."""

    def __init__(
        self,
        model: EngineModel,
        *,
        speed: float,
        seed: int,
        boot: int,
        tick_s: float = 0.002,
        clock: Callable[[], float] = time.monotonic,
        held: Callable[[], bool] | None = None,
    ) -> None:
        self.model = model
        #: whether the group's steps wait for a rank that is silent (``Head.silent``)
        self._held = held
        self.base_speed = speed
        self._seed = seed
        self._boot = boot
        self._tick = tick_s
        self._clock = clock
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Request]] = []
        self._seq = itertools.count()
        self._live: set[Request] = set()
        self._credits: deque[float] = deque()
        self._prefill_free = 0.0
        self._warm = False  # the first prefill after boot pays the model's cold start
        self._decode_free: float | None = None  # when the first decode step's compile ends
        self._run = 0
        self._run_speed = 1.0
        self._run_acceptance = 1.0
        self._pos_acc = [0.0] * model.k
        self.counters = Counters(per_position=[0] * model.k)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="twin-scheduler", daemon=True)

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the scheduler thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the scheduler thread (pending requests get no more tokens)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)

    @property
    def run(self) -> int:
        """The current run number: a run starts when a request finds the engine idle (nothing
        in flight, no closed-loop slot being refilled) and draws its own run-to-run noise."""
        return self._run

    @property
    def speed(self) -> float:
        """The current speed factor: clocks × boot noise × this run's noise."""
        return self.base_speed * self._run_speed

    # ---- requests --------------------------------------------------------------------------
    def submit(self, prompt: str, max_tokens: int, *, opened_at: float = -math.inf) -> Request:
        """Admit a greedy generation of ``max_tokens`` tokens for ``prompt``.

        ``opened_at`` is when the request's connection was opened (engine clock): only a
        completion that happened after it, while the client held the connection, can be the
        request's closed-loop predecessor (a new client's connections never inherit one).
        """
        category, _ = prompts.classify(prompt)
        trap = self.model.trap is not None
        tokens = text.greedy_tokens(prompt, max_tokens, trap=trap)
        length = prompts.count_tokens(prompt)
        with self._cond:
            now = self._clock()
            horizon = now - TURNAROUND_CREDIT_S
            while self._credits and self._credits[0] < horizon:
                self._credits.popleft()
            credit = next((c for c in self._credits if c > opened_at), None)
            if credit is not None:
                self._credits.remove(credit)
            elif not self._live:
                self._new_run()
            positions = tuple(
                min(1.0, p * self._run_acceptance) for p in self.model.positions(category)
            )
            arrival = now if credit is None else min(now, credit)
            req = Request(
                id=uuid.uuid4().hex,
                prompt=prompt,
                category=category,
                prompt_tokens=length,
                max_tokens=max_tokens,
                tokens=tokens,
                accepted=1.0 + sum(positions),
                positions=positions,
                arrival=arrival,
            )
            start = max(arrival, self._prefill_free)
            if not self._warm:
                self._warm = True
                start += self.model.cold_first_s / self.speed
            first = start + self.model.prefill_s(req.prompt_tokens) / self.speed
            self._prefill_free = first
            req.prefill_start = start
            self._live.add(req)
            self.counters.prompt_tokens += req.prompt_tokens
            heapq.heappush(self._heap, (first, next(self._seq), req))
            self._cond.notify_all()
        return req

    def abort(self, req: Request) -> None:
        """Drop a request whose client went away."""
        with self._cond:
            if req.done or req.aborted:
                return
            req.aborted = True
            self._live.discard(req)
            self.counters.requests_aborted += 1
            if not self._live:
                # the client left: nothing is being prefilled any more, no slot is being
                # refilled; the next request starts a new run
                self._prefill_free = 0.0
                self._heap.clear()
                self._credits.clear()

    def _new_run(self) -> None:
        """A burst of load on an idle engine is a new run: draw its noise."""
        self._credits.clear()
        self._run += 1
        n = self.model.landscape.noise
        self._run_speed, self._run_acceptance = noise.run_factors(
            self._seed, self._boot, self._run, n.run_to_run, n.acceptance
        )

    # ---- the scheduler ---------------------------------------------------------------------
    def _loop(self) -> None:
        with self._cond:
            while not self._stop:
                if self._held is not None and self._held():
                    # a rank of the group is stopped: no step completes, no token is sent
                    self._cond.wait(HELD_POLL_S)
                    continue
                now = self._clock()
                if self._heap and now - self._heap[0][0] > LATE_S:
                    # a delivery due this long ago (the client's stall watch's threshold): the
                    # host kept this thread off the CPU,
                    # and tokens due before a client's window edge reach it after the edge
                    self.counters.stall_s += now - self._heap[0][0]
                while self._heap and self._heap[0][0] <= now:
                    due, _, req = heapq.heappop(self._heap)
                    if not req.aborted:
                        self._advance(req, due)
                if self._heap:
                    wait: float | None = max(self._heap[0][0] - self._clock(), self._tick)
                else:
                    wait = None
                self._cond.wait(wait)

    def _occupancy(self, now: float) -> tuple[int, int]:
        """Requests in the engine (plus closed-loop slots being refilled), their prompt tokens."""
        horizon = now - TURNAROUND_CREDIT_S
        credits = sum(1 for c in self._credits if c >= horizon)
        n = len(self._live) + credits
        context = sum(r.prompt_tokens for r in self._live)
        if credits and self._live:
            context += credits * context // len(self._live)
        return n, context

    def _advance(self, req: Request, due: float) -> None:
        if req.emitted == 0:
            new = 1
        else:
            req.steps += 1
            self._count_step(req)
            new = self._target(req) - req.emitted
        chunk = req.tokens[req.emitted : req.emitted + new]
        req.emitted += new
        self.counters.generation_tokens += new
        finished = req.emitted >= req.max_tokens
        req.out.put(Chunk(tokens=chunk, total=req.emitted, finished=finished))
        if finished:
            req.done = True
            self._live.discard(req)
            self.counters.requests_ok += 1
            self._credits.append(due)
            return
        n, context = self._occupancy(due)
        step = self.model.step_s(n, context) / self.speed
        if self._decode_free is None:
            self._decode_free = due + self.model.cold_decode_s / self.speed
        heapq.heappush(self._heap, (max(due, self._decode_free) + step, next(self._seq), req))

    def _target(self, req: Request) -> int:
        done = 1 + math.floor(req.steps * req.accepted + 1e-9)
        return min(req.max_tokens, done)

    def _count_step(self, req: Request) -> None:
        k = self.model.k
        if k == 0:
            return
        c = self.counters
        c.drafts += 1
        c.draft_tokens += k
        for i, p in enumerate(req.positions):
            self._pos_acc[i] += p
            if self._pos_acc[i] >= 1.0:
                whole = int(self._pos_acc[i])
                self._pos_acc[i] -= whole
                c.per_position[i] += whole
                c.accepted += whole

    # ---- observation -----------------------------------------------------------------------
    def snapshot(self) -> Counters:
        """A copy of the counters, with the running / waiting gauges filled in."""
        with self._cond:
            now = self._clock()
            c = self.counters
            waiting = sum(1 for r in self._live if r.prefill_start > now)
            return Counters(
                prompt_tokens=c.prompt_tokens,
                generation_tokens=c.generation_tokens,
                requests_ok=c.requests_ok,
                requests_aborted=c.requests_aborted,
                drafts=c.drafts,
                draft_tokens=c.draft_tokens,
                accepted=c.accepted,
                per_position=list(c.per_position),
                running=len(self._live) - waiting,
                waiting=waiting,
                stall_s=c.stall_s,
            )
