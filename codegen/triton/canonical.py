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


def _statements(tokens: list[tokenize.TokenInfo]) -> list[list[tokenize.TokenInfo]]:
    """The logical lines' significant tokens (NEWLINE, INDENT, DEDENT kept as markers)."""
    out: list[list[tokenize.TokenInfo]] = [[]]
    for t in tokens:
        if t.type in _SKIP:
            continue
        out[-1].append(t)
        if t.type == tokenize.NEWLINE:
            out.append([])
    return [s for s in out if s]


def _assigned(stmt: list[tokenize.TokenInfo]) -> list[str]:
    """Names a statement binds: ``a = ...``, ``a, b = ...``, ``for a in ...``."""
    code = [t for t in stmt if t.type not in (tokenize.INDENT, tokenize.DEDENT)]
    if len(code) >= 2 and code[0].type == tokenize.NAME and code[0].string == "for":
        names = []
        for t in code[1:]:
            if t.type == tokenize.NAME and t.string == "in":
                return names
            if t.type == tokenize.NAME:
                names.append(t.string)
        return []
    names = []
    for k, t in enumerate(code):
        if t.type == tokenize.OP and t.string == "=":
            return names if k > 0 else []
        if t.type == tokenize.NAME:
            names.append(t.string)
        elif not (t.type == tokenize.OP and t.string == ","):
            return []
    return []


def canonical_text(source: str) -> str:
    """The token stream of ``source`` as described above (a string, for hashing); the
    source itself where it does not tokenize (then it shares a kernel with nothing)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source
    stmts = _statements(tokens)
    # the module docstring: a first statement made of one string
    if stmts and len(stmts[0]) == 2 and stmts[0][0].type == tokenize.STRING:
        stmts = stmts[1:]
    rename: dict[str, str] = {}
    for s in stmts:
        for name in _assigned(s):
            if _LOCAL.match(name) and name not in rename:
                rename[name] = f"${len(rename)}"     # never a Python name: no collisions
    out: list[str] = []
    for s in stmts:
        depth = 0
        for k, t in enumerate(s):
            if t.type == tokenize.INDENT:
                out.append("{")
                continue
            if t.type == tokenize.DEDENT:
                out.append("}")
                continue
            if t.type == tokenize.NEWLINE:
                out.append(";")
                continue
            text = t.string
            if t.type == tokenize.OP and text in "([{":
                depth += 1
            elif t.type == tokenize.OP and text in ")]}":
                depth -= 1
            elif t.type == tokenize.NAME and text in rename:
                after_dot = k > 0 and s[k - 1].type == tokenize.OP and s[k - 1].string == "."
                keyword = depth > 0 and k + 1 < len(s) and s[k + 1].string == "="
                if not after_dot and not keyword:
                    text = rename[text]
            out.append(text)
    return " ".join(out)
