"""The CPU budget: how many threads serving and a training job may use, decided in one place.

Two torch processes that each take every core collapse on a small machine (measured on 2 cores: greedy
decode fell from 12.7 to under 0.5 tokens/s when a second busy process shared the cores), because an OpenMP
team waits at every barrier for a thread the kernel has descheduled. So the job process gets ``job`` threads,
and the serving engine (its own process) uses every core while no job runs and gives the job's share up while one
does: serving + job <= cores whenever there are at least two cores (on 2 cores: 2 alone, 1 + 1 beside a job).
The web stack needs no core of its own: it works while the engine samples between two decode steps. With one core
both run single-threaded and time-share it (no OpenMP team then waits on a descheduled peer), the job at a lower
priority (``nice``).

A job also takes serving's cores while nobody chats (``job_alone``, after ``idle_after_s`` without a reply in
flight): a retrain on a quiet 2-core machine runs on both cores (BENCHMARKS.md: PPO's update 1.55x, generation 1.3x
faster on 2 threads than on 1). The app tells the job process through a small file (``JobThreads``), which the job
reads on a thread of its own and applies on its training thread before the next module's forward; a chat that starts
gets its cores back once the job has read the file (every 0.2 s) and reached its next module's forward.

torch's intra-op thread count is per *calling thread* (OpenMP's nthreads ICV and MKL's local setting), so
``torch.set_num_threads`` called from one thread leaves another thread's parallel regions as they were: the
serving engine applies the budget from its own thread (each engine of ``rlhf.serving``), and the job process
gets the OMP/MKL variables in its environment before torch loads, then sets torch's counts on its main thread.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Mapping, MutableMapping, Optional

# The libraries that size a thread pool from the environment when they load: OpenMP (torch's intra-op pool),
# MKL and OpenBLAS (matmuls), and Rayon (the Rust tokenizers' batch encoding).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS")


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers and ``taskset`` narrow), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ThreadPlan:
    """Threads per process for a machine with ``cores`` cores."""

    cores: int
    serving_idle: int  # the serving engine while no job runs
    serving_busy: int  # the serving engine while a job runs
    job: int  # a job process (reward model, PPO, evaluation)
    job_nice: int = 0  # the job process's niceness: on a contended core, chat goes first
    job_alone: int = 0  # a job's threads while nobody chats (0 = ``job``: it never takes serving's cores)
    idle_after_s: float = 0.0  # ... once no reply has been in flight this long

    @property
    def job_most(self) -> int:
        """The most threads a job may use: ``job_alone`` while nobody chats, else ``job``."""
        return max(self.job, self.job_alone)

    def serving(self, job_threads: int = 0) -> int:
        """Serving threads while a job with ``job_threads`` threads runs (0 = no job)."""
        if job_threads <= 0:
            return self.serving_idle
        return max(1, min(self.serving_idle, self.cores - job_threads))

    def describe(self) -> str:
        """One line for people: `config show`, the Training tab."""
        share = f"{self.serving_busy} while a job runs" if self.serving_busy != self.serving_idle else \
            "the same while a job runs"
        alone = (f", {self.job_most} after {self.idle_after_s:g} s without a chat" if self.job_most > self.job
                 else "")
        return (f"{self.cores} core{'s' if self.cores != 1 else ''}: chat {self.serving_idle} thread"
                f"{'s' if self.serving_idle != 1 else ''} when no job runs, {share}; a job {self.job} thread"
                f"{'s' if self.job != 1 else ''}{alone} (nice {self.job_nice})")

    def to_dict(self) -> dict:
        return asdict(self)


def plan_threads(cores: int, serving_threads: int = 0, job_threads: int = 0, job_nice: int = 0,
                 idle_after_s: float = 0.0) -> ThreadPlan:
    """The budget arithmetic. ``job_threads`` 0 = half the cores (at least 1); any job leaves serving at least
    one core when there are two or more. ``serving_threads`` 0 = every core (BENCHMARKS.md, ``bench serve``: on 2
    quiet cores the engine decodes faster on 2 threads than on 1, the web stack included). A running job then
    takes its share. ``idle_after_s`` > 0: a job takes every core once no reply has been in flight that long."""
    cores = max(1, int(cores))
    job = int(job_threads) if job_threads and job_threads > 0 else max(1, cores // 2)
    job = max(1, min(job, cores - 1)) if cores > 1 else 1
    idle = min(int(serving_threads), cores) if serving_threads and serving_threads > 0 else cores
    idle_after_s = max(0.0, float(idle_after_s))
    return ThreadPlan(cores, idle, max(1, min(idle, cores - job)), job, max(0, min(19, int(job_nice))),
                      cores if idle_after_s > 0 else 0, idle_after_s)


def thread_plan(config, cores: Optional[int] = None) -> ThreadPlan:
    """The plan of an ``AppConfig`` on this machine (``serving.threads``, ``retrain.job_threads``/``job_nice``/
    ``idle_cores_after_seconds``)."""
    return plan_threads(available_cores() if cores is None else cores, config.serving.threads,
                        config.retrain.job_threads, config.retrain.job_nice, config.retrain.idle_cores_after_seconds)


def thread_env(threads: int, base: Optional[Mapping[str, str]] = None) -> dict:
    """``base`` (default: empty) with every thread-pool variable set to ``threads``: a child process's pools
    are sized before its torch loads."""
    env = dict(base or {})
    env.update({name: str(max(1, int(threads))) for name in THREAD_VARIABLES})
    return env


def export_thread_env(threads: int, environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Set the thread-pool variables in this process's environment; only useful before torch loads."""
    target = os.environ if environ is None else environ
    target.update(thread_env(threads))


def apply_torch_threads(threads: int, interop: Optional[int] = None) -> int:
    """``torch.set_num_threads`` on the *calling* thread (and the inter-op pool when it is not started yet);
    returns the count now in effect for this thread."""
    import torch

    threads = max(1, int(threads))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if interop is not None:
        try:
            torch.set_num_interop_threads(max(1, int(interop)))
        except RuntimeError:  # the inter-op pool already ran work: it keeps its size (torch allows one setting)
            pass
    return torch.get_num_threads()


class CpuBudget:
    """The app process's live budget: the plan, the threads of the job running now, and whether anyone chats.

    The job runner reports job start and end and listens for changes of the job's share (``listen``); each serving
    engine reports whether it has replies in flight (``serving_load``) and reads ``serving_threads()`` before every
    step, applying it on its own thread.
    """

    def __init__(self, plan: ThreadPlan, clock=time.monotonic):
        self.plan = plan
        self.clock = clock
        self._job_threads = 0
        self._served_at = float("-inf")  # when a serving engine last had a reply in flight
        self._listeners: list = []
        self._lock = threading.Lock()

    def job_started(self, threads: Optional[int] = None) -> None:
        with self._lock:
            self._job_threads = max(1, int(threads or self.plan.job))

    def job_ended(self) -> None:
        with self._lock:
            self._job_threads = 0

    def listen(self, callback) -> None:
        """``callback()`` whenever a chat starts after a quiet spell (the job's share drops at once)."""
        self._listeners.append(callback)

    def serving_load(self, busy: bool) -> None:
        """A serving engine says whether it has replies in flight now (any thread, often)."""
        if not busy:
            return
        with self._lock:
            woke = self._quiet()
            self._served_at = self.clock()
        if woke:
            for callback in list(self._listeners):
                callback()

    def _quiet(self) -> bool:
        return self.plan.job_alone > self.plan.job and self.clock() - self._served_at >= self.plan.idle_after_s

    def job_share(self) -> int:
        """Threads a job may use now: every core while nobody chats (``job_alone``), else its share."""
        return self.plan.job_alone if self._quiet() else self.plan.job

    @property
    def job_threads(self) -> int:
        """Threads of the running job (0 = none)."""
        return self._job_threads

    def serving_threads(self) -> int:
        """Threads a serving engine should use now."""
        if not self._job_threads:
            return self.plan.serving(0)
        return self.plan.serving(max(self._job_threads, self.job_share()))

    def status(self) -> str:
        """The plan and what applies right now, for the Training tab."""
        now = (f"a job is running: chat uses {self.serving_threads()} thread(s), the job "
               f"{max(self._job_threads, self.job_share())}"
               if self._job_threads else f"no job is running: chat uses {self.serving_threads()} thread(s)")
        return f"CPU budget — {self.plan.describe()}. Now {now}."


class JobThreads:
    """The job process's side of the budget: the thread count the app writes to ``path``, followed on the job's
    training thread.

    A reader thread polls the file (``poll_s``); ``apply()``, called on the training thread, sets torch's count
    there when it changed. ``follow()`` makes every module's forward call ``apply()`` first (a global forward
    pre-hook: a few hundred nanoseconds per module when nothing changed), so a job gives cores back within one
    forward of the file changing, whatever it trains.
    """

    def __init__(self, path, threads: int, poll_s: float = 0.2):
        from pathlib import Path

        self.path = Path(path)
        self.applied = max(1, int(threads))
        self.wanted = self.applied
        self.poll_s = poll_s
        self.changes = 0
        self.owner = threading.get_ident()
        self._stop = threading.Event()
        self._hook = None

    @staticmethod
    def write(path, threads: int) -> None:
        """The app's side: publish ``threads`` atomically (a reader never sees half a number)."""
        from rlhf.files import atomic_file

        with atomic_file(path) as tmp:
            tmp.write_text(str(max(1, int(threads))))

    def read(self) -> int:
        try:
            return max(1, int(self.path.read_text().strip()))
        except (OSError, ValueError):  # not written yet, or gone after the job: keep what we have
            return self.wanted

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.wanted = self.read()

    def apply(self) -> int:
        """On the training thread: take up the thread count last read (other threads: nothing happens)."""
        wanted = self.wanted
        if wanted != self.applied and threading.get_ident() == self.owner:
            apply_torch_threads(wanted)
            self.applied = wanted
            self.changes += 1
        return self.applied

    def follow(self) -> "JobThreads":
        """Start reading the file and apply what it says before every module's forward (on this thread)."""
        import torch

        self.owner = threading.get_ident()
        self.wanted = self.read()
        self.apply()
        def before_forward(module, args) -> None:  # returns None: a pre-hook's return value would replace the input
            self.apply()

        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(before_forward)
        threading.Thread(target=self._poll, name="job-threads", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


class CpuMeter:
    """How many cores other processes kept busy lately, from Linux's /proc (0 where it cannot tell).

    A decode step on n threads waits at every layer for its slowest thread, so one thread that shares its core
    with another busy process stalls them all (measured on 2 cores: 112 tokens/s on 2 threads alone, 2-8 beside
    one busy process, 40-65 on 1 thread). ``fit(threads)`` gives the threads that fit beside what else runs: the
    cores less those other processes (including the kernel's steal from a virtual machine) kept busy over the
    last ``window_s``, never fewer than one.
    """

    def __init__(self, pids: Optional[list[int]] = None, window_s: float = 1.0, cores: Optional[int] = None):
        self.pids = pids or [os.getpid()]  # "own" processes: their CPU time is not another's
        self.window_s = window_s
        self.cores = cores or available_cores()
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.others = 0.0
        self._last: Optional[tuple[float, float, float]] = None

    @staticmethod
    def machine_busy(stat_text: str) -> float:
        """Busy ticks of all CPUs from /proc/stat's first line (user nice system idle iowait irq softirq steal)."""
        fields = [int(x) for x in stat_text.split("\n", 1)[0].split()[1:9]]
        fields += [0] * (8 - len(fields))
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields
        return float(user + nice + system + irq + softirq + steal)

    @staticmethod
    def process_busy(stat_text: str) -> float:
        """utime + stime ticks of one process from /proc/<pid>/stat (fields after the command's parenthesis)."""
        fields = stat_text.rsplit(")", 1)[1].split()
        return float(int(fields[11]) + int(fields[12]))

    def _sample(self) -> Optional[tuple[float, float, float]]:
        try:
            with open("/proc/stat") as fh:
                machine = self.machine_busy(fh.read())
            own = 0.0
            for pid in self.pids:
                with open(f"/proc/{pid}/stat") as fh:
                    own += self.process_busy(fh.read())
        except (OSError, ValueError, IndexError):  # not Linux, or a process ended
            return None
        return time.monotonic(), machine, own

    def update(self) -> float:
        """Re-measure when the window has passed; the cores other processes kept busy (smoothed)."""
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < self.window_s:
            return self.others
        sample = self._sample()
        if sample is not None and self._last is not None:
            elapsed = (sample[0] - self._last[0]) * self.ticks
            if elapsed > 0:
                busy = max(0.0, ((sample[1] - self._last[1]) - (sample[2] - self._last[2])) / elapsed)
                self.others = 0.5 * self.others + 0.5 * min(busy, float(self.cores))
        self._last = sample
        return self.others

    def fit(self, threads: int) -> int:
        """``threads``, less the cores other processes keep busy now."""
        return threads_beside(threads, self.cores, self.update())


def threads_beside(threads: int, cores: int, others: float) -> int:
    """``threads`` (at most), on ``cores`` of which other processes keep ``others`` busy: a core counts as taken
    once it is more than 60% busy; never fewer than one."""
    return max(1, min(int(threads), int(cores - others + 0.6)))
