"""The part of bash a Megatron-LM launch script is written in, evaluated far enough to find
its training command (``simcore.plan.megatron_reader`` reads the options).

Megatron-LM's own example scripts (examples/gpt3/train_gpt3_175b_distributed.sh,
examples/llama/train_llama3_8b_h100_fp8.sh, examples/mixtral/train_mixtral_8x7b_distributed.sh
at NVIDIA/Megatron-LM 157006d6 / 0a40979e; examples/megatron_fsdp/*.sh at d98e8a64) build the
command from shell variables and bash arrays: ``NAME=value``, ``NAME=${NAME:-default}``,
``ARGS=( --opt $VAR ... )``, ``ARGS+=( "--opt value" )``, ``EMPTY=()``, ``"${ARGS[@]}"``,
multi-line quoted strings, ``$PREFIX`` launchers such as ``uv run``, and an ``sbatch <<EOF``
here-document whose ``srun ... bash -c "$CMD"`` runs the command. ``expand_script`` evaluates
that much of bash (assignments, arrays, ``${...}`` expansion, ``$((...))`` arithmetic of
integers); an ``if``/``elif`` whose test is a plain ``[ ... ]`` / ``[[ ... ]]`` comparison of
strings or integers takes the branch bash would, any other test its first branch. The command
is the first one whose first word is a launcher (torchrun, python, srun, ...), a wrapper
(``uv run``, ``nsys profile``, ``env``) before one, or a .py script.
"""
from __future__ import annotations

import re
import shlex

from simcore.plan.spec import PlanError

_LAUNCHERS = {"torchrun", "python", "python3", "deepspeed", "srun", "mpirun", "bash", "sh"}
_WRAPPERS = {"uv", "nsys", "env", "exec", "nohup", "time", "numactl", "taskset"}
_SKIP_WORDS = {"if", "then", "else", "elif", "fi", "for", "do", "done", "echo", "mkdir", "export", "set",
               "exit", "cd", "source", ".", "[", "[[", "while", "case", "esac", "unset", "shift"}
_VAR = re.compile(r"\$\{(\w+)(?:\[@\]|\[\*\])?(?::?-([^}]*))?\}|\$(\w+|[0-9])")
_QUOTED_ARRAY = re.compile(r'"\$\{(\w+)\[@\]\}"')
_SEPARATORS = {";", "&&", "||", "|", "&"}


def _open_quote(text: str) -> bool:
    """Whether ``text`` ends inside a quoted string (comments and backslash escapes skipped)."""
    quote, i = None, 0
    while i < len(text):
        c = text[i]
        if quote is None and c == "#" and (i == 0 or text[i - 1] in " \t\n;"):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote is None and c in "\"'":
            quote = c
        elif c == quote:
            quote = None
        i += 1
    return quote is not None


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined and a quoted string over several lines kept
    as one; comment lines left out."""
    out, buf = [], None
    for line in re.sub(r"\\\n", " ", text).splitlines():
        buf = line if buf is None else buf + "\n" + line
        if not _open_quote(buf):
            out.append(buf)
            buf = None
    out += [buf] if buf is not None else []
    return [ln for ln in out if ln.strip() and not ln.lstrip().startswith("#")]


class _Shell:
    """The variables and arrays of a script, and ``${...}`` expansion."""

    def __init__(self):
        self.vars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.exported: dict[str, str] = {}

    def expand(self, text: str) -> str:
        def sub(match):
            name, default, plain = match.group(1), match.group(2), match.group(3)
            name = name or plain
            if name in self.arrays:  # unquoted ${A[@]}: bash splits each element into words
                return " ".join(self.arrays[name])
            value = self.vars.get(name)
            return value if value else (self._default(default) if default is not None else "")

        def quoted_array(match):  # "${A[@]}": one word per element, none for an empty array
            if match.group(1) not in self.arrays:
                return match.group(0)
            return " ".join(shlex.quote(e) for e in self.arrays[match.group(1)])
        text = _QUOTED_ARRAY.sub(quoted_array, text)
        text = re.sub(r"\$\(\((.*?)\)\)", lambda m: self._arith(self.expand_plain(m.group(1))), text)
        return _VAR.sub(sub, text)

    def expand_plain(self, text: str) -> str:
        return _VAR.sub(lambda m: self.vars.get(m.group(1) or m.group(3), ""), text)

    def _default(self, default: str) -> str:
        return self.expand(default).strip("\"'")

    @staticmethod
    def _arith(expr: str) -> str:
        if not re.fullmatch(r"[\d\s+\-*/()]+", expr):
            return "0"
        return str(eval(expr.replace("/", "//"), {"__builtins__": {}}))  # digits and + - * / only

    def test(self, line: str) -> bool | None:
        """The value of an ``if``/``elif`` test made of ``[ ... ]`` / ``[[ ... ]]`` string and
        integer comparisons joined by ``||`` / ``&&`` (left to right, as bash runs them);
        None for any other test."""
        body = re.sub(r"^(el)?if\s+|;?\s*then\s*$", "", line.strip())
        try:
            words = shlex.split(self.expand(body))
        except ValueError:
            return None
        value, op, term = None, None, []
        for w in words + ["||"]:
            if w not in ("||", "&&"):
                term.append(w)
                continue
            t = _bracket_test(term)
            if t is None:
                return None
            value = t if op is None else (value or t) if op == "||" else (value and t)
            op, term = w, []
        return value


_INT_OPS = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__,
            "-gt": int.__gt__, "-ge": int.__ge__}


def _bracket_test(words: list[str]) -> bool | None:
    if len(words) < 2 or (words[0], words[-1]) not in (("[", "]"), ("[[", "]]")):
        return None
    inner, negate = words[1:-1], False
    if inner[:1] == ["!"]:
        inner, negate = inner[1:], True
    value = None
    if len(inner) == 2 and inner[0] in ("-z", "-n"):
        value = (inner[1] == "") == (inner[0] == "-z")
    elif len(inner) == 3 and inner[1] in ("=", "==", "!="):
        value = (inner[0] == inner[2]) == (inner[1] != "!=")
    elif len(inner) == 3 and inner[1] in _INT_OPS and all(re.fullmatch(r"-?\d+", w) for w in inner[::2]):
        value = _INT_OPS[inner[1]](int(inner[0]), int(inner[2]))
    return None if value is None else value != negate


def _assign_array(sh: _Shell, head, body: str) -> None:
    words = shlex.split(sh.expand(body), comments=True)
    sh.arrays[head.group(1)] = (sh.arrays.get(head.group(1), []) if head.group(2) else []) + words


def expand_script(text: str) -> tuple[list[list[str]], dict[str, str]]:
    """Each command line of a script after variable and array expansion, as words, and
    the variables the script exports."""
    sh, out = _Shell(), []
    blocks: list[list[bool]] = []   # per open if/for/while/case: [running, a branch was taken]
    lines = _logical_lines(text)
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        running = all(b[0] for b in blocks)
        head = re.match(r"^(\w+)(\+?)=\($", line) or re.match(r"^(\w+)(\+?)=\((.*)\)$", line, re.S)
        if head:
            body = head.group(3) if head.lastindex == 3 else ""
            if head.lastindex != 3:
                while i < len(lines) and lines[i].strip() != ")":
                    body += "\n" + lines[i]
                    i += 1
                i += 1
            if running:
                _assign_array(sh, head, body)
            continue
        if _block_line(sh, line, blocks, running):
            continue
        if not running:
            continue
        assign = re.match(r"^(export\s+)?(\w+)=(.*)$", line, re.S)
        words = shlex.split(sh.expand(assign.group(3)), comments=True) if assign else []
        if assign and len(words) <= 1:
            sh.vars[assign.group(2)] = words[0] if words else ""
            if assign.group(1):
                sh.exported[assign.group(2)] = sh.vars[assign.group(2)]
            continue
        if line.split()[0] in _SKIP_WORDS:
            continue
        out.append(shlex.split(sh.expand(line), comments=True))
    return out, sh.exported


def _block_line(sh: _Shell, line: str, blocks: list[list[bool]], running: bool) -> bool:
    """Track if/elif/else/fi (and the loops, run once): whether ``line`` was such a line."""
    first = line.split()[0]
    if first == "if":
        taken = running and sh.test(line) is not False   # an unknown test: its first branch
        blocks.append([taken, taken])
    elif first in ("for", "while", "case"):
        blocks.append([True, True])
    elif first == "elif" and blocks:
        taken = not blocks[-1][1] and sh.test(line) is not False
        blocks[-1] = [taken, blocks[-1][1] or taken]
    elif first == "else" and blocks:
        blocks[-1] = [not blocks[-1][1], True]
    elif first in ("fi", "done", "esac") and blocks:
        blocks.pop()
    else:
        return False
    return True


def _segments(words: list[str]):
    """The simple commands of one line: split at ``;``, ``&&``, ``||``, ``|``, ``&``."""
    seg: list[str] = []
    for w in words:
        if w in _SEPARATORS or (w.endswith(";") and len(w) > 1):
            seg += [w[:-1]] if w not in _SEPARATORS else []
            yield seg
            seg = []
        else:
            seg.append(w)
    yield seg


def _command(words: list[str], exported: dict[str, str]):
    """(launcher options, environment, training-script words) of one simple command, or None."""
    env = dict(exported)
    while words and re.match(r"^\w+=", words[0]):  # NAME=value before the command
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if not words or (words[0] not in _LAUNCHERS | _WRAPPERS and not words[0].endswith(".py")):
        return None
    script = next((i for i, t in enumerate(words) if t.endswith(".py")), None)
    if script is None:
        shell = next((i for i, t in enumerate(words) if t in ("bash", "sh")), None)
        flag = next((i for i in range(shell + 1, len(words)) if re.fullmatch(r"-\w*c\w*", words[i])), None) \
            if shell is not None else None
        if flag is not None and flag + 1 < len(words):   # bash -c "...": the command is in the string
            return _find(*expand_script(words[flag + 1]), outer=env)
        return None
    words = [w for w in words if not re.match(r"^\d*[<>]", w)]   # 2>&1, > log: redirections
    script = next(i for i, t in enumerate(words) if t.endswith(".py"))
    pre = {"script": words[script]}
    for i, tok in enumerate(words[:script]):
        key, _, val = tok.partition("=")
        if key.startswith("--"):
            pre[key.replace("_", "-")] = val or (words[i + 1] if i + 1 < script else "")
    return pre, env, words[script + 1:]


def _find(commands: list[list[str]], exported: dict[str, str], outer: dict | None = None):
    for words in commands:
        for seg in _segments(words):
            found = _command(seg, {**(outer or {}), **exported})
            if found is not None:
                return found
    return None


def split_command(text: str) -> tuple[dict, dict[str, str], dict[str, list[str]]]:
    """The launcher's options, its environment (``export NAME=value`` lines) and the
    training script's options, of a command line or a launch script."""
    found = _find(*expand_script(text))
    if found is None:
        raise PlanError("megatron: no training script (a .py file such as pretrain_gpt.py) in the command")
    pre, env, rest = found
    return pre, env, options(rest, "megatron")


def options(tokens: list[str], where: str) -> dict[str, list[str]]:
    """``--name v1 v2`` / ``--name=v`` / ``--flag`` into {name: values}; last one wins."""
    opts: dict[str, list[str]] = {}
    name = None
    for tok in tokens:
        if tok.startswith("--"):
            name, _, value = tok.partition("=")
            opts[name] = [value] if value else []
        elif name is None:
            raise PlanError(f"{where}: unexpected argument {tok!r} before the first option")
        else:
            opts[name].append(tok)
    return opts
