"""The wafer's program: the compiled step it runs, and tiered compilation.

``compiler="fx"`` replays the captured graph op by op (nothing to compile). ``"inductor"``
runs the inductor artifact: loaded from the compile cache if there, else compiled first (in a
separate process) before the first step. ``"auto"`` (the default): the wafer starts on fx at
once; if the cache holds the inductor artifact it is loaded after the first step (a warm cache
starts no later than a cold one) and checked on the second, otherwise inductor is compiled in
the background when the run is long enough to profit (the fx steps still to run would take at
least ``TIER_UP_MIN_S``). Once the inductor version is ready it is run beside fx on one step,
from the same state and batch; if its outputs and updated state agree with fx's
(``torch.allclose``, rtol 1e-3, atol 1e-5: fused kernels round differently), the next
``2 * TIER_TRIAL_STEPS`` steps alternate between the two versions (the check step ran each once:
both are warm when the trial starts), and :func:`choose_compiler` compares their median step
times over the same number of steps: the wafer switches to inductor unless fx's median was
clearly lower (``TIER_UP_MIN_GAIN``): inductor is not faster for every step (a step made of a
few large matmuls gains nothing from fusion, and inductor's own matmul calls may be slower
than eager's), but a tie goes to inductor. When and how long it took, the check and both
medians are in :attr:`Program.report`.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from typing import Optional

import torch

from executor.engine import compiler as compilers
from executor.engine.compiler import CacheEntry, CompiledStep

log = logging.getLogger("cstream.compile")

TIER_UP_MIN_S = 30.0
"""Compile inductor in the background only when the fx steps left would take this long."""
TIER_UP_PROBE_STEPS = 20
"""Steps timed on fx before deciding whether a background compile pays."""
TIER_TRIAL_STEPS = 20
"""Steps each version runs in the trial after the check (alternating)."""
TIER_UP_MIN_GAIN = 0.05
"""The wafer stays on fx only if fx's median step time in the trial is at least this fraction
below inductor's; otherwise, a tie included, it switches to inductor. The two mistakes cost
unequally: fx replays the graph op by op and took 1.2-3x inductor's step on the models of
``benchmarks/train_throughput.py`` (``step_replay.py``: the small transformer 13.7 against
11.4 ms, the small MLP 0.37 against 0.11 ms), while a step that inductor cannot speed up (a
few large matmuls) runs the same matmul calls in both. A trial timed while the input
workers fill their buffers is noisy: in one 3-round run on 2 cores, trials kept fx 3 times in
36 (medians within 4% twice), and those runs were 8-17% slower than the same variant's runs
that switched."""


def _agree(a: list, b: list) -> tuple[bool, float]:
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf")
        if x.is_floating_point():
            if not torch.allclose(x, y, rtol=1e-3, atol=1e-5, equal_nan=True):
                return False, float((x - y).abs().max())
            if x.numel():
                worst = max(worst, float((x.float() - y.float()).abs().max()))
        elif not torch.equal(x, y):
            return False, float("inf")
    return True, worst


def _median(xs: list) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def choose_compiler(fx_s: list, inductor_s: list, min_gain: float = TIER_UP_MIN_GAIN) -> dict:
    """The tiering trial's verdict from its step times (seconds), as :attr:`Program.report`
    keeps it: ``chosen`` (``"fx"`` if its median step time is at least ``min_gain`` below
    inductor's, else ``"inductor"``: a tie goes to inductor), both medians and the steps timed
    on each.
    Both versions must have been timed on the same number of steps, at least one."""
    if not fx_s or len(fx_s) != len(inductor_s):
        raise ValueError(f"the tiering trial compares medians over the same number of steps "
                         f"(at least one): fx was timed on {len(fx_s)}, inductor on "
                         f"{len(inductor_s)}.")
    fx_median, ind_median = _median(fx_s), _median(inductor_s)
    chosen = "fx" if fx_median < (1 - min_gain) * ind_median else "inductor"
    return {"chosen": chosen, "fx_median_s": fx_median, "inductor_median_s": ind_median,
            "steps_each": len(fx_s)}


class Program:
    """``program(state, batch, step) -> outputs``: runs one step, updating ``state`` in place."""

    def __init__(self, gm: torch.fx.GraphModule, example: tuple, compiler: str, device: str,
                 entry: Optional[CacheEntry], num_steps: Optional[int] = None,
                 generator: Optional[torch.Generator] = None):
        t0 = time.perf_counter()
        self.consts = list(example[2])
        self.mode = compiler
        self.num_steps = num_steps
        self.report: dict = {"compiler": compiler, "cache_hit": False, "key": entry and entry.key}
        self._gm, self._example, self._entry = gm, example, entry
        self._generator = generator
        self._random = compilers.has_random_ops(gm)  # inductor's steps then lend the RNG
        self._candidate: Optional[CompiledStep] = None
        self._tier_up_begun = False  # decided once: compiling or loading inductor began
        self._tier_error: Optional[str] = None
        self._fx_times: list[float] = []
        self._trial: Optional[dict] = None  # {"fx": [s, ...], "inductor": [...]} while timing
        self._load_after_first_step = False  # auto on a warm cache, until step 2 begins
        self._first_step_ran = False
        if entry is not None:
            entry.write_manifest(gm, compilers.input_spec(example), device)
        if compiler == "inductor":
            self.active = self._inductor_now()
        else:
            # fx_step rewrites the graph it runs (random ops, detach): the cache key and the
            # inductor compile keep the captured one
            self.active = compilers.fx_step(copy.deepcopy(gm), device, generator)
            if compiler == "auto" and entry is not None and entry.has_artifact():
                # loaded after the first step, which runs on fx at once: a warm cache starts
                # as soon as a cold one
                self.report["cache_hit"] = True
                self.report["tier_up"] = {"compiled_in_background": False}
                self._tier_up_begun = True
                self._load_after_first_step = True
        self.report["active"] = self.active.compiler
        self.report["compile_s"] = time.perf_counter() - t0

    # -- one compiler, now ------------------------------------------------------------------------
    def _inductor_now(self) -> CompiledStep:
        entry = self._entry
        if entry is None:
            raise ValueError('compiler="inductor" needs a compile_dir to keep its artifact in.')
        if entry.has_artifact():
            self.report["cache_hit"] = True
            log.info("compile cache hit: %s (inductor): nothing compiled", entry.key)
        else:
            t0 = time.perf_counter()
            proc = compilers.start_inductor_compile(self._gm, self._example, entry)
            if proc.wait() != 0 or not entry.has_artifact():
                raise RuntimeError(self._compile_failure(proc.returncode))
            log.info("compiled step %s with inductor in %.2f s", entry.key,
                     time.perf_counter() - t0)
        return compilers.load_inductor_artifact(entry, self._generator, self._random)

    def _compile_failure(self, rc) -> str:
        logf = self._entry.dir / "compile.log"
        tail = logf.read_text(errors="replace")[-2000:] if logf.exists() else ""
        return f"the inductor compile failed (exit code {rc}); its log {logf} ends:\n{tail}"

    # -- tiered compilation ---------------------------------------------------------------------
    def _load_cached(self) -> None:
        """Load the cached inductor artifact (after the first step) for the check."""
        self._load_after_first_step = False
        t0 = time.perf_counter()
        try:
            self._candidate = compilers.load_inductor_artifact(self._entry, self._generator,
                                                               self._random)
            self.report["tier_up"]["ready_s"] = time.perf_counter() - t0
        except Exception as e:  # the run goes on with fx; the profile says why
            self._tier_error = f"{type(e).__name__}: {e}"
            self.report["tier_up"]["error"] = self._tier_error
            self.mode = "fx"
            log.warning("tiered compilation: staying on fx: %s", self._tier_error)

    def _start_tier_up(self) -> None:
        """Compile inductor in the background, then load it for the switch."""
        self.report["tier_up"] = {"compiled_in_background": True}

        def work():
            t0 = time.perf_counter()
            try:
                proc = compilers.start_inductor_compile(self._gm, self._example, self._entry)
                if proc.wait() != 0 or not self._entry.has_artifact():
                    raise RuntimeError(self._compile_failure(proc.returncode))
                candidate = compilers.load_inductor_artifact(self._entry, self._generator,
                                                             self._random)
                self.report["tier_up"]["ready_s"] = time.perf_counter() - t0
                self._candidate = candidate
            except Exception as e:  # the run goes on with fx; the profile says why
                self._tier_error = f"{type(e).__name__}: {e}"
                self.report["tier_up"]["error"] = self._tier_error
                log.warning("tiered compilation: staying on fx: %s", self._tier_error)

        self._tier_up_begun = True
        threading.Thread(target=work, name="tier-up", daemon=True).start()

    def _maybe_start_tier_up(self, step: int, took_s: float) -> None:
        if self.mode != "auto" or self._tier_up_begun or self._entry is None \
                or self.num_steps is None:
            return
        self._fx_times.append(took_s)
        if len(self._fx_times) < TIER_UP_PROBE_STEPS:
            return
        per_step = _median(self._fx_times)
        left_s = per_step * (self.num_steps - step - 1)
        if left_s >= TIER_UP_MIN_S:
            self.report["tier_up_started_at_step"] = step + 1
            log.info("tiered compilation: compiling inductor in the background (fx steps left: "
                     "~%.0f s)", left_s)
            self._start_tier_up()
        else:
            self._fx_times = []
            self.mode = "fx"  # too short to profit: decided once
            self.report["tier_up"] = {"skipped": f"the fx steps left take ~{left_s:.1f} s, "
                                                 f"under {TIER_UP_MIN_S:.0f} s"}

    def _try_switch(self, state: list, batch: list, step: int) -> list:
        candidate, self._candidate = self._candidate, None
        before = [t.clone() for t in state]
        rng = self._generator
        rng_before = rng.get_state() if rng is not None else None
        outputs = self.active(state, batch, self.consts)
        if rng is not None:  # the candidate draws what fx drew; the stream advances once
            rng_after = rng.get_state()
            rng.set_state(rng_before)
        cand_out = candidate(before, batch, self.consts)
        if rng is not None:
            rng.set_state(rng_after)
        ok, diff = _agree(list(outputs) + list(state), list(cand_out) + list(before))
        tier = self.report.setdefault("tier_up", {})
        tier.update(checked_at_step=step + 1, max_abs_diff=diff, agreed=ok)
        if ok:
            self._trial = {"fx": [], "inductor": [], "first_step": step + 2,
                           "versions": {"fx": self.active, "inductor": candidate}}
            log.info("tiered compilation: inductor agrees with fx at step %d; timing both",
                     step + 1)
        else:
            self.mode = "fx"
            log.warning("tiered compilation: inductor's outputs differ from fx's at step %d "
                        "(max abs diff %g); staying on fx", step + 1, diff)
        return outputs

    def _trial_step(self, state: list, batch: list, step: int) -> list:
        """One step of the trial: fx and inductor alternate; after ``TIER_TRIAL_STEPS`` each,
        fx runs from the next step on if its median step time was at least
        ``TIER_UP_MIN_GAIN`` below inductor's, else inductor does."""
        trial = self._trial
        name = "fx" if (step + 1 - trial["first_step"]) % 2 == 0 else "inductor"
        t0 = time.perf_counter()
        outputs = trial["versions"][name](state, batch, self.consts)
        trial[name].append(time.perf_counter() - t0)
        if len(trial["inductor"]) < TIER_TRIAL_STEPS:
            return outputs
        self._trial = None
        verdict = choose_compiler(trial["fx"], trial["inductor"])
        fx_s, ind_s = verdict["fx_median_s"], verdict["inductor_median_s"]
        tier = self.report["tier_up"]
        tier["trial"] = {"steps": [trial["first_step"], step + 1], **verdict}
        if verdict["chosen"] == "inductor":
            self.active = trial["versions"]["inductor"]
            self.report["active"] = "inductor"
            tier["switched_at_step"] = step + 2
            log.info("tiered compilation: switched to inductor at step %d (median step %.2f ms "
                     "against fx's %.2f ms)", step + 2, ind_s * 1e3, fx_s * 1e3)
        else:
            self.mode = "fx"
            tier["kept_fx"] = (f"fx's median step in the trial ({fx_s * 1e3:.3g} ms) was "
                               f"{TIER_UP_MIN_GAIN:.0%} or more below inductor's "
                               f"({ind_s * 1e3:.3g} ms)")
            log.info("tiered compilation: staying on fx: %s", tier["kept_fx"])
        return outputs

    @property
    def generator(self) -> Optional[torch.Generator]:
        """The wafer's generator, which the step's random ops draw from."""
        return self._generator

    @property
    def draws_random(self) -> bool:
        """Whether some op of the step draws random numbers."""
        return self._random

    def settled(self) -> bool:
        """Whether the next step runs :attr:`active` as it is: no check or trial of tiered
        compilation is pending or under way (a compile may run in the background; its result,
        once ready, unsettles the program for its check and trial). A caller that runs
        :attr:`active` itself reports each step's time to :meth:`observe`."""
        return self._trial is None and self._candidate is None \
            and not self._load_after_first_step

    def observe(self, step: int, took_s: float) -> None:
        """``step`` ran :attr:`active` outside :meth:`__call__` (a CUDA graph's replay) in
        ``took_s``: the probe of tiered compilation counts it."""
        if self.mode == "auto" and not self._tier_up_begun:
            self._maybe_start_tier_up(step, took_s)

    def __call__(self, state: list, batch: list, step: int) -> list:
        if self._trial is not None:
            return self._trial_step(state, batch, step)
        if self._load_after_first_step:
            if self._first_step_ran:
                self._load_cached()
            else:
                self._first_step_ran = True
                return self.active(state, batch, self.consts)
        if self._candidate is not None:
            return self._try_switch(state, batch, step)
        if self.mode != "auto" or self._tier_up_begun:
            return self.active(state, batch, self.consts)
        t0 = time.perf_counter()
        outputs = self.active(state, batch, self.consts)
        self._maybe_start_tier_up(step, time.perf_counter() - t0)
        return outputs
