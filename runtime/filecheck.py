"""A small FileCheck: match ``// CHECK:`` directives of a test file against a tool's output.

Supported, with LLVM FileCheck's meaning:
- ``PREFIX:`` (search forward), ``PREFIX-NEXT:`` (on the line after the previous match),
  ``PREFIX-SAME:`` (on the same line), ``PREFIX-EMPTY:`` (the next line is empty),
  ``PREFIX-NOT:`` (absent between the surrounding positive matches), ``PREFIX-DAG:``
  (a run of them matches in any order), ``PREFIX-COUNT-<n>:`` (n times in a row),
  ``PREFIX-LABEL:`` (treated as a plain forward search: labels do not partition the input);
- custom prefixes (``--check-prefix=X``, ``--check-prefixes=X,Y``);
- ``{LITERAL}`` after the directive (no regex or variable syntax);
- ``{{regex}}`` inside a pattern, ``[[VAR:regex]]`` to capture and ``[[VAR]]`` to reuse;
- horizontal whitespace canonicalization: a run of spaces/tabs in a pattern matches any run
  in the output; a pattern's leading and trailing whitespace is ignored.
Not supported: numeric variables ``[[#...]]``, ``--strict-whitespace``, ``--implicit-check-not``.

    errors = filecheck(check_text, output, prefixes=("CHECK",))   # [] when it matches
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from hlo.errors import HlotkError


class FileCheckError(HlotkError):
    """A directive did not match, or the check file cannot be read as FileCheck input."""


@dataclass(frozen=True)
class Directive:
    kind: str        # "CHECK" | "NEXT" | "SAME" | "EMPTY" | "NOT" | "DAG" | "LABEL"
    pattern: str     # the text after ``:``, whitespace-trimmed
    literal: bool
    line: int        # 1-based line in the check file
    spelling: str    # as written, e.g. "CHECK-DENSE-NEXT"


_SUFFIXES = {"": "CHECK", "-NEXT": "NEXT", "-SAME": "SAME", "-EMPTY": "EMPTY", "-NOT": "NOT",
             "-DAG": "DAG", "-LABEL": "LABEL"}


def parse_directives(check_text: str, prefixes: Sequence[str] = ("CHECK",)) -> list[Directive]:
    """The directives of ``prefixes`` in ``check_text``, in file order."""
    for p in prefixes:
        if not re.fullmatch(r"[A-Za-z][\w-]*", p):
            raise FileCheckError(f"invalid check prefix {p!r}")
    alt = "|".join(re.escape(p) for p in sorted(set(prefixes), key=len, reverse=True))
    rx = re.compile(r"(?<![\w-])(?P<prefix>" + alt + r")(?P<suffix>-NEXT|-SAME|-EMPTY|-NOT|"
                    r"-DAG|-LABEL|-COUNT-(?P<count>\d+))?(?P<lit>\{LITERAL\})?:(?P<pat>.*)$")
    out: list[Directive] = []
    for n, line in enumerate(check_text.split("\n"), start=1):
        m = rx.search(line)
        if not m:
            continue
        suffix = m.group("suffix") or ""
        spelling = m.group("prefix") + suffix
        pattern = m.group("pat").strip()
        literal = m.group("lit") is not None
        if m.group("count") is not None:
            count = int(m.group("count"))
            if count < 1:
                raise FileCheckError(f"line {n}: {spelling} needs a count of at least 1")
            out.extend(Directive("CHECK" if i == 0 else "NEXT", pattern, literal, n, spelling)
                       for i in range(count))
            continue
        kind = _SUFFIXES[suffix]
        if kind == "EMPTY" and pattern:
            raise FileCheckError(f"line {n}: {spelling} takes no pattern, got {pattern!r}")
        if kind not in ("EMPTY",) and not pattern:
            raise FileCheckError(f"line {n}: found empty check string with prefix "
                                 f"'{spelling}:'")
        out.append(Directive(kind, pattern, literal, n, spelling))
    return out


_VAR = r"\$?[A-Za-z_][A-Za-z0-9_]*"
_TOKEN_RE = re.compile(r"\{\{(?P<re>.*?)\}\}|\[\[(?P<def>" + _VAR + r"):(?P<defre>.*?)\]\]|"
                       r"\[\[(?P<use>" + _VAR + r")\]\]|\[\[#")


def _literal_regex(text: str) -> str:
    """Escaped text; each run of horizontal whitespace matches any such run."""
    return "".join(r"[ \t]+" if part.isspace() else re.escape(part)
                   for part in re.split(r"([ \t]+)", text) if part)


def _group_name(var: str) -> str:
    return "v_" + var.lstrip("$")


def compile_pattern(d: Directive, variables: dict[str, str]) -> tuple[re.Pattern, list[str]]:
    """The regex of a directive given the variables defined so far, and the variables it
    defines (named groups)."""
    if d.literal:
        return re.compile(_literal_regex(d.pattern)), []
    parts: list[str] = []
    defines: list[str] = []
    pos = 0
    for m in _TOKEN_RE.finditer(d.pattern):
        parts.append(_literal_regex(d.pattern[pos:m.start()]))
        pos = m.end()
        if m.group(0) == "[[#":
            raise FileCheckError(f"line {d.line}: numeric variables ([[#...]]) are not "
                                 "supported")
        if m.group("re") is not None:
            parts.append("(?:" + m.group("re") + ")")
        elif m.group("def") is not None:
            name = m.group("def")
            defines.append(name)
            parts.append(f"(?P<{_group_name(name)}>{m.group('defre')})")
        else:
            name = m.group("use")
            if name not in variables:
                raise FileCheckError(f"line {d.line}: {d.spelling}: use of undefined "
                                     f"variable [[{name}]]")
            parts.append(re.escape(variables[name]))
    parts.append(_literal_regex(d.pattern[pos:]))
    try:
        return re.compile("".join(parts)), defines
    except re.error as e:
        raise FileCheckError(f"line {d.line}: {d.spelling}: invalid regex in "
                             f"{d.pattern!r}: {e}") from None


class _Output:
    def __init__(self, text: str):
        self.text = text
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def line_of(self, pos: int) -> int:
        """0-based line index of a position."""
        return bisect.bisect_right(self.starts, pos) - 1

    def line_text(self, idx: int) -> str:
        if idx >= len(self.starts):
            return "<end of output>"
        end = self.text.find("\n", self.starts[idx])
        return self.text[self.starts[idx]:end if end >= 0 else len(self.text)]


def filecheck(check_text: str, output: str, prefixes: Sequence[str] = ("CHECK",),
              check_name: str = "<check file>") -> list[str]:
    """Match the directives of ``check_text`` against ``output``; the error messages
    (empty when everything matched). The first failing positive directive stops matching,
    as in FileCheck."""
    directives = parse_directives(check_text, prefixes)
    if not directives:
        return [f"{check_name}: no check strings found with prefix"
                f"{'es' if len(prefixes) > 1 else ''} {', '.join(p + ':' for p in prefixes)}"]
    out = _Output(output)
    variables: dict[str, str] = {}
    errors: list[str] = []
    pos = 0                      # where the next search starts
    prev_end: Optional[int] = None
    nots: list[Directive] = []

    def where(d: Directive) -> str:
        return f"{check_name}:{d.line}: {d.spelling}"

    def context(p: int) -> str:
        ln = out.line_of(min(p, len(output)))
        return f"output line {ln + 1}: {out.line_text(ln)!r}"

    def check_nots(lo: int, hi: int) -> None:
        for nd in nots:
            rx, _ = compile_pattern(nd, variables)
            m = rx.search(output, lo, hi)
            if m:
                errors.append(f"{where(nd)}: excluded string {nd.pattern!r} found at "
                              f"{context(m.start())}")
        nots.clear()

    def record(m: re.Match, defines: list[str]) -> None:
        for name in defines:
            variables[name] = m.group(_group_name(name))

    i = 0
    while i < len(directives):
        d = directives[i]
        if d.kind == "NOT":
            nots.append(d)
            i += 1
            continue
        if d.kind == "DAG":
            group = []
            while i < len(directives) and directives[i].kind == "DAG":
                group.append(directives[i])
                i += 1
            taken: list[tuple[int, int]] = []
            for gd in group:
                rx, defines = compile_pattern(gd, variables)
                start, found = pos, None
                while True:
                    m = rx.search(output, start)
                    if m is None:
                        break
                    if all(m.end() <= a or m.start() >= b for a, b in taken):
                        found = m
                        break
                    start = m.start() + 1
                if found is None:
                    errors.append(f"{where(gd)}: expected string not found in input: "
                                  f"{gd.pattern!r} (searched from {context(pos)})")
                    return errors
                taken.append((found.start(), found.end()))
                record(found, defines)
            check_nots(pos, min(a for a, _ in taken))
            pos = max(b for _, b in taken)
            prev_end = pos
            continue
        i += 1
        if d.kind in ("NEXT", "SAME", "EMPTY") and prev_end is None:
            errors.append(f"{where(d)}: found {d.spelling} without a previous match to "
                          "follow")
            return errors
        if d.kind == "EMPTY":
            assert prev_end is not None
            nl = output.find("\n", prev_end)
            if nl < 0 or not (nl + 1 == len(output) or output[nl + 1] == "\n"):
                ln = out.line_of(prev_end) + 1
                errors.append(f"{where(d)}: expected an empty line after output line "
                              f"{ln}, found {out.line_text(ln)!r}")
                return errors
            check_nots(pos, nl + 1)
            pos = prev_end = nl + 1
            continue
        rx, defines = compile_pattern(d, variables)
        m = rx.search(output, pos)
        if m is None:
            errors.append(f"{where(d)}: expected string not found in input: {d.pattern!r} "
                          f"(searched from {context(pos)})")
            return errors
        if d.kind in ("NEXT", "SAME"):
            assert prev_end is not None
            lines = output.count("\n", prev_end, m.start())
            want = 1 if d.kind == "NEXT" else 0
            if lines != want:
                prev_ln = out.line_of(max(prev_end - 1, 0)) + 1
                what = "the line after" if d.kind == "NEXT" else "the same line as"
                errors.append(f"{where(d)}: {d.pattern!r} is not on {what} the previous "
                              f"match (output line {prev_ln}); next match at "
                              f"{context(m.start())}; the expected line is "
                              f"{out.line_text(prev_ln - 1 + want)!r}")
                return errors
        check_nots(pos, m.start())
        record(m, defines)
        pos = prev_end = m.end()
    check_nots(pos, len(output))
    return errors


def check_or_raise(check_text: str, output: str, prefixes: Sequence[str] = ("CHECK",),
                   check_name: str = "<check file>") -> None:
    """``filecheck``, raising FileCheckError with every message when something fails."""
    errors = filecheck(check_text, output, prefixes, check_name)
    if errors:
        raise FileCheckError("\n".join(errors))
