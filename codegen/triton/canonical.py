"""A generated kernel's text as its cache key sees it: without what only names it.

Two fusions that compute the same thing over the same shapes (an optimizer's update of each
of a model's same-sized arrays: adam_step has 8 fusions over f32[3072]) generate the same
Triton code up to the HLO names: the module docstring quotes the fusion, each line's comment
quotes its instruction, and the emitter's locals are named after instructions
(``multiply_107_6``, ``Emitter.fresh``). Triton keys its compile on the function's text and
first line number, so each such kernel was compiled on its own (a pool job per kernel and
config on the cold first call).

``canonical_text(source)`` is the source's token stream without the comments, the module
docstring and blank lines, with every local the emitter made (an assigned name ending in
``_<digits>``) renamed to its order of first assignment. Two sources with the same canonical
text differ only by a consistent renaming of those locals and by text Python never runs, so
they are the same program: ``compile_fusion`` keys kernels by it and the second fusion
loads the first one's file (one module, one JIT function, one Triton compile per config).
Names the emitter does not make (parameters ``p0``/``out0``/``s0_0``, ``pid``, ``offs``,
helper functions, ``tl``, keyword arguments, attributes) are compared as written.
"""
from __future__ import annotations

import io
import re
import tokenize

_LOCAL = re.compile(r"^[A-Za-z_]\w*_\d+$")       # Emitter.fresh: f"{base}_{counter}"
_SKIP = (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER)
_NAME, _OP, _STRING, _NUMBER = tokenize.NAME, tokenize.OP, tokenize.STRING, tokenize.NUMBER
_NEWLINE, _INDENT, _DEDENT = tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT

# A token as canonical_text reads it: (type, string).
Token = tuple[int, str]


def _tokens(source: str) -> list[Token]:
    """``source``'s significant tokens (comments and non-logical newlines left out), as
    ``tokenize.generate_tokens`` gives them; raises what it raises."""
    fast = _fast_tokens(source)
    if fast is not None:
        return fast
    return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in _SKIP]


_PSEUDO = re.compile(tokenize.PseudoToken)
_ENDPATS = {k: re.compile(v) for k, v in tokenize.endpats.items() if v is not None}
_TRIPLE = frozenset(tokenize.triple_quoted)
_SINGLE = frozenset(tokenize.single_quoted)


def _fast_tokens(source: str) -> "list[Token] | None":
    """The tokens ``_tokens`` gives, for source as the generators write it (lines ending in
    ``\n``, indentation by spaces, no backslash continuations, strings on one line or
    triple-quoted): the same line and token rules as ``tokenize`` (CPython 3.11's
    ``_tokenize``), without its per-token position records (issue 13: a kernel's cache
    key tokenized its ~150 lines in ~1 ms). None for anything else: ``tokenize`` then reads
    it, errors included. tests/test_kernel_dedup.py compares the two on every kernel the
    generators write for the suite and zoo programs."""
    if not source.endswith("\n") or "\r" in source:
        return None
    out: list[Token] = []
    indents = [0]
    depth = 0
    contstr: "str | None" = None
    endprog = None
    lines = source.split("\n")
    for raw in lines[:-1]:
        line = raw + "\n"
        pos, end = 0, len(line)
        if contstr is not None:                      # inside a triple-quoted string
            m = endprog.match(line)                  # type: ignore[union-attr]
            if m is None:
                contstr += line
                continue
            pos = m.end(0)
            out.append((_STRING, contstr + line[:pos]))
            contstr = None
        elif depth == 0:                             # a new statement
            column = 0
            while pos < end and line[pos] == " ":
                column += 1
                pos += 1
            c = line[pos]
            if c in "\t\f":
                return None
            if c in "#\n":                           # a comment or blank line
                continue
            if column > indents[-1]:
                indents.append(column)
                out.append((_INDENT, line[:pos]))
            while column < indents[-1]:
                if column not in indents:
                    return None
                indents.pop()
                out.append((_DEDENT, ""))
        while pos < end:
            m = _PSEUDO.match(line, pos)
            if m is None:
                return None
            start, pos = m.span(1)
            if start == pos:
                continue
            token, initial = line[start:pos], line[start]
            if initial in "0123456789" or (initial == "." and token != "." and token != "..."):
                out.append((_NUMBER, token))
            elif initial == "\n":
                if depth == 0:
                    out.append((_NEWLINE, token))
            elif initial == "#":
                pass
            elif token in _TRIPLE:
                endprog = _ENDPATS[token]
                m = endprog.match(line, pos)
                if m is None:
                    contstr = line[start:]
                    break
                pos = m.end(0)
                out.append((_STRING, line[start:pos]))
            elif initial in _SINGLE or token[:2] in _SINGLE or token[:3] in _SINGLE:
                if token[-1] == "\n":
                    return None                      # a string continued by a backslash
                out.append((_STRING, token))
            elif initial.isidentifier():
                out.append((_NAME, token))
            elif initial == "\\":
                return None
            else:
                if initial in "([{":
                    depth += 1
                elif initial in ")]}":
                    depth -= 1
                out.append((_OP, token))
    if contstr is not None or depth != 0:
        return None                                  # tokenize raises: let it say why
    out.extend((_DEDENT, "") for _ in indents[1:])
    return out


def _statements(tokens: list[Token]) -> list[list[Token]]:
    """The logical lines' significant tokens (NEWLINE, INDENT, DEDENT kept as markers)."""
    out: list[list[Token]] = [[]]
    for t in tokens:
        out[-1].append(t)
        if t[0] == _NEWLINE:
            out.append([])
    return [s for s in out if s]


def _assigned(stmt: list[Token]) -> list[str]:
    """Names a statement binds: ``a = ...``, ``a, b = ...``, ``for a in ...``."""
    code = [t for t in stmt if t[0] != _INDENT and t[0] != _DEDENT]
    if len(code) >= 2 and code[0][0] == _NAME and code[0][1] == "for":
        names = []
        for t in code[1:]:
            if t[0] == _NAME and t[1] == "in":
                return names
            if t[0] == _NAME:
                names.append(t[1])
        return []
    names = []
    for k, t in enumerate(code):
        if t[0] == _OP and t[1] == "=":
            return names if k > 0 else []
        if t[0] == _NAME:
            names.append(t[1])
        elif not (t[0] == _OP and t[1] == ","):
            return []
    return []


def canonical_text(source: str) -> str:
    """The token stream of ``source`` as described above (a string, for hashing); the
    source itself where it does not tokenize (then it shares a kernel with nothing)."""
    try:
        tokens = _tokens(source)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source
    stmts = _statements(tokens)
    # the module docstring: a first statement made of one string
    if stmts and len(stmts[0]) == 2 and stmts[0][0][0] == _STRING:
        stmts = stmts[1:]
    rename: dict[str, str] = {}
    for s in stmts:
        for name in _assigned(s):
            if _LOCAL.match(name) and name not in rename:
                rename[name] = f"${len(rename)}"     # never a Python name: no collisions
    out: list[str] = []
    for s in stmts:
        depth = 0
        for k, (kind, text) in enumerate(s):
            if kind == _INDENT:
                out.append("{")
                continue
            if kind == _DEDENT:
                out.append("}")
                continue
            if kind == _NEWLINE:
                out.append(";")
                continue
            if kind == _OP and text in "([{":
                depth += 1
            elif kind == _OP and text in ")]}":
                depth -= 1
            elif kind == _NAME and text in rename:
                after_dot = k > 0 and s[k - 1][0] == _OP and s[k - 1][1] == "."
                keyword = depth > 0 and k + 1 < len(s) and s[k + 1][1] == "="
                if not after_dot and not keyword:
                    text = rename[text]
            out.append(text)
    return " ".join(out)
