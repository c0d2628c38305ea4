"""What every command shares: the two user-error kinds, JSON and prediction printing."""
from __future__ import annotations

import json


#: Layouts the event engine re-simulates and re-ranks in `plan`, `report plan` and the demo: one
#: default for the three, so that the same inputs give the same recommendation.
SEARCH_TOP_K = 10


class UsageError(ValueError):
    """A command-line argument breaks a rule."""


class RunFailed(ValueError):
    """A real run failed (a rank raised, hung past the timeout, or torch refused the layout)."""


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped a command; ``exit_code`` is the shell's 128 + signal number."""

    def __init__(self, signum: int):
        import signal

        self.signum, self.exit_code = signum, 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}: every worker process it started was ended "
                         "and no file was left half-written")


class stop_on_signals:   # noqa: N801 (a context manager read as a phrase)
    """While a command runs, its first SIGINT or SIGTERM raises ``Stopped`` in the main thread
    (the worker pools end their workers as it unwinds, ``simcore.planner.workers``); later ones
    are ignored so that the clean-up is not cut short. A real run's own handler
    (``executors.watchdog.ParentSignals``) takes over while its ranks run. A signal the process
    ignored (``nohup``) stays ignored."""

    def __init__(self):
        self.got, self._old = None, {}

    def _handle(self, signum, frame):
        if self.got is None:
            self.got = signum
            raise Stopped(signum)

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old = signal.getsignal(sig)
                if old is not signal.SIG_IGN:
                    self._old[sig] = old
                    signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        import signal

        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def warn(lines) -> None:
    """Warnings, one sentence a line, on stderr (stdout stays the answer)."""
    import sys

    for line in lines:
        print(f"trainplan: warning: {line}", file=sys.stderr)


def check_prediction(plan, result) -> None:
    """Refuse a prediction with no sensible answer (UsageError); warn about odd ones."""
    from simcore.planner.sanity import prediction_warnings, refusal

    why = refusal(plan, result)
    if why:
        raise UsageError(why)
    warn(prediction_warnings(plan, result))


def _headroom(plan, result) -> str:
    """', N GiB headroom of M GiB' from the one headroom helper, or '' without the plan."""
    if plan is None:
        return ""
    from simcore.planner.formatting import hbm_gib, headroom_gib

    return f", {headroom_gib(hbm_gib(plan), result.memory_per_gpu_gib):.2f} GiB headroom of {hbm_gib(plan):.0f} GiB"


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def fmt_s(x: float) -> str:
    """Seconds in the unit that reads best: us, ms, s, h or days."""
    if x < 1e-3:
        return f"{x * 1e6:.1f} us"
    if x < 1:
        return f"{x * 1e3:.1f} ms"
    if x < 3600:
        return f"{x:.3f} s"
    return f"{x / 3600:,.1f} h" if x < 86400 else f"{x / 86400:,.1f} days"


def print_prediction(result, plan=None) -> None:
    """A readable breakdown of a StepResult (predicted or measured), units adapted to the size."""
    from simcore.planner.formatting import binary_bytes, percent, si

    rows = [
        ("step time", fmt_s(result.step_time_s)),
        ("  compute", fmt_s(result.compute_s)),
        ("  exposed communication", fmt_s(result.exposed_comm_s)),
        ("  pipeline bubble", fmt_s(result.bubble_s)),
        ("  offload stall", fmt_s(result.offload_s)),
        ("tokens/s", f"{result.tokens_per_s:,.0f}"),
        ("model FLOP/s per GPU", si(result.model_tflops_per_gpu * 1e12, "FLOP/s")),
        ("hardware FLOP/s per GPU", si(result.hardware_tflops_per_gpu * 1e12, "FLOP/s")),
        ("MFU / HFU", f"{percent(result.mfu)} / {percent(result.hfu)}"),
        ("memory per GPU", f"{binary_bytes(result.memory_per_gpu_gib * 2**30)} "
                           f"({'fits' if result.fits else 'DOES NOT FIT'}{_headroom(plan, result)})"),
    ]
    print(f"{result.plan_name} ({result.source})")
    for k, v in rows:
        print(f"  {k:<28} {v}")
    if result.time_s:
        print("  time per phase (critical rank):")
        for k, v in result.time_s.items():
            if v:
                print(f"    {k:<26} {fmt_s(v)}")
    for note in result.notes:
        print(f"  note: {note}")


# --------------------------------------------------------------------------- output paths

#: Per command, the arguments naming a file it writes whole, and those naming a folder it fills.
FILE_OUTPUTS = {"plan": ("out",), "calibrate": ("out",), "simulate": ("trace", "gantt"), "topology": ("draw",),
                "run": ("trace",)}
DIR_OUTPUTS = {"report": ("out",), "demo": ("out",), "whatif": ("report",), "procure": ("report",),
               "validate": ("trace_dir",),
               "run": ("checkpoint_dir",)}


def model_doc(model, seq_len: int | None = None) -> dict:
    """A Plan ``model`` section from ``--model`` (a catalog name or a config.json path, as a
    Plan's own ``model:`` takes them; or a section already) and ``--seq-len``."""
    from simcore.plan.hf_config import model_section

    return {**model_section(model or {}), **({"seq_len": seq_len} if seq_len is not None else {})}


def model_notes(model) -> list[str]:
    """What the model a config.json path (``--model``) gives leaves out, in ``trainplan import``'s words:
    the config's fields no Plan field holds, a wrapper's towers and ``text_config`` fields, the norms
    or layers priced otherwise (``hf_config.hf_import_notes``); [] for a catalog name or a section."""
    if not (isinstance(model, str) and model.endswith(".json")):
        return []
    from pathlib import Path

    from simcore.plan.hf_config import hf_import_notes, not_mapped, read_config

    dropped = not_mapped(read_config(Path(model)))
    return ([f"not mapped to the plan: {model}: {', '.join(dropped)}"] if dropped else []) + hf_import_notes(model)


def plan_model_notes(plan_path) -> list[str]:
    """``model_notes`` of a Plan file whose model section names a config.json (``hf_config``, relative to
    the file as the loader resolves it); [] otherwise. The file has loaded already: it reads."""
    from pathlib import Path

    from simcore.plan.yaml_file import read_yaml_file

    model = (read_yaml_file(plan_path, "plan file") or {}).get("model")
    hf = model.get("hf_config") if isinstance(model, dict) else None
    if not isinstance(hf, str):
        return []
    path = Path(hf).expanduser()
    return model_notes(str(path if path.is_absolute() else Path(plan_path).parent / path))


def compressions(text: str | None) -> list[str] | None:
    """``plan --compression``'s methods (``simcore.planner.compression.METHODS``); UsageError naming the flag."""
    from simcore.planner.compression import check_methods

    try:
        return list(check_methods(text, "--compression")) if text else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def portable_name(name: str) -> str:
    """A file name every system takes (scp, rsync, make, Windows): letters, digits, '.', '_'
    and '-' only; anything else (':' above all) becomes '-'."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]", "-", name)


def _flag(attr: str) -> str:
    return "--" + attr.replace("_", "-")


def _creatable(folder, flag: str, path, *, itself: bool = False) -> None:
    """A missing ``folder`` is created inside the working directory, or (``itself``: the
    folder a report fills) where only that last level is missing; elsewhere it must exist."""
    import os
    from pathlib import Path

    folder = Path(folder)
    if folder.exists():
        if not folder.is_dir():
            raise UsageError(f"{flag} {path}: {folder} is a file, not a folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {path}: the folder {folder} is not writable")
        return
    here = Path.cwd().resolve()
    full = (here / folder).resolve()
    if full != here and here not in full.parents and not (itself and full.parent.is_dir()):
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist (create it first; trainplan "
                         "creates missing folders only inside the working directory)")
    existing = next(p for p in full.parents if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot create {folder}: {existing} is not writable")


#: The command line's numeric options and the least each takes (``None``: above it, not at it),
#: with what they count; the rest of their rules (tokens, top-k, the Plan's own) are checked
#: where they are used.
NUMBERS = {"rows": (0, "rows to print"), "jobs": (1, "processes"), "monte_carlo": (0, "Monte-Carlo runs"),
           "seed": (0, "a random seed"), "steps": (1, "steps to run"), "warmup": (0, "warm-up steps"),
           "timeout": (None, "seconds")}


def check_numbers(args) -> None:
    """Every numeric option of the command within its range (``NUMBERS``): one sentence naming
    the option otherwise (UsageError, exit 2), before any work."""
    import math

    for attr, (least, what) in NUMBERS.items():
        value = getattr(args, attr, None)
        if value is None:
            continue
        rule = "above 0" if least is None else f"{least} or more"
        if not math.isfinite(value):
            raise UsageError(f"{_flag(attr)} {value:g} must be a finite number, {rule} ({what})")
        if not (value > 0 if least is None else value >= least):
            raise UsageError(f"{_flag(attr)} {value:g} must be {rule} ({what})")


def check_outputs(args) -> None:
    """Every output argument of the command checked before any work: a file's folder exists
    and is writable (or lies inside the working directory, where it is created), a file is not
    a folder, a folder is not a file. UsageError (one sentence, exit 2) otherwise."""
    import os
    from pathlib import Path

    command = getattr(args, "command", None)
    for attr in FILE_OUTPUTS.get(command, ()):
        path = getattr(args, attr, None)
        if path is None:
            continue
        path = Path(path)
        if path.is_dir():
            raise UsageError(f"{_flag(attr)} {path} is a folder; give a file name")
        if path.exists() and not os.access(path, os.W_OK):
            raise UsageError(f"{_flag(attr)} {path} exists and is not writable")
        _creatable(path.parent, _flag(attr), path)
    for attr in DIR_OUTPUTS.get(command, ()):
        path = getattr(args, attr, None)
        if path is None:
            continue
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise UsageError(f"{_flag(attr)} {path} is a file, not a folder")
        _creatable(path, _flag(attr), path, itself=True)
