"""Isolated, fast execution of untrusted (model-written) code.

Use ``Sandbox`` (a pool of pre-warmed workers) with ``Job``s; read ``ExecResult``s.
``rlvr sandbox check`` proves the guarantees below on the machine it runs on (attack suite);
``rlvr sandbox bench`` measures throughput against a fresh interpreter per run.

What the strict backends guarantee (``forkserver``, the default as root, and
``forkserver-userns`` and ``bwrap``; see ``detect`` for how one is chosen):

- **No network**: a network namespace with no interface but a downed loopback, seccomp refusing
  every socket (only unnamed socketpairs remain), and landlock refusing TCP bind/connect.
- **Filesystem**: reads only of the system (``/usr``, the libraries) and the interpreter's
  prefixes; writes only in the run's workspace (landlock; ``bwrap`` also gives a fresh root).
  Anything under a closed home directory other than the interpreter is not even visible.
- **Processes**: each run is pid 1 of a fresh pid namespace, so when it ends or is killed at the
  wall-clock limit every process it started dies with it, daemons and ``setsid`` grandchildren
  included; nothing it starts can signal or see processes outside. A per-slot non-root uid (as
  root) makes RLIMIT_NPROC stop fork bombs. The worker is a child subreaper and reaps.
- **Resources**: rlimits on CPU time, address space, processes, file size, open files, no core
  dumps; stdout/stderr kept to a head and tail, the run killed past a total output cap.
- **Trustworthy verdicts**: tests and expected values are never in the candidate's memory
  (``tests`` jobs run the candidate in its own process and call it through a plain-data pipe;
  ``io`` jobs compare outputs here, in the trusted parent). Reports carry a per-run nonce and an
  expected test count, results fail closed, and protected files are hash-checked after the run.
- **Audit**: one JSON line per execution when ``audit_path`` is set.

What they do not guarantee:

- Kernel exploits: this is namespaces + landlock + seccomp on the host kernel, not a VM. For
  hostile adversaries (not just a policy gaming its reward) use a microVM (Firecracker, gVisor).
- RSS: RLIMIT_AS caps address space, not resident memory; cgroups are not used (they are not
  delegated on every machine). Total CPU across runs is not shared out fairly.
- Timing side channels, and reading what the system itself publishes under ``/usr``.
- ``command`` jobs (e.g. pytest) run tests and candidate in one interpreter: their exit status is
  only as trustworthy as the command. Rewards should come from ``tests`` or ``io`` jobs.
- The ``weak`` backend (no namespaces: non-Linux, or Linux without root and without user
  namespaces) only restricts what landlock/seccomp/rlimits can; training refuses it unless
  explicitly allowed, and says what it lacks.
"""

import importlib

_EXPORTS = {"Backend": "detect", "capabilities": "detect", "choose": "detect",
            "Sandbox": "pool", "ExecResult": "types", "Job": "types", "Limits": "types",
            "Workspace": "workspace"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # Lazy, so that the in-sandbox harness and the workers import only what they use.
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"rlvr.sandbox.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rlvr.sandbox' has no attribute {name!r}")
