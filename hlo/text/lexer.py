"""A small lexer for HLO text: a cursor that hands out tokens and knows line:column.

HLO text is mostly regular (names, numbers, strings, punctuation), but a few attribute
values have their own micro-syntax (``window={size=3x3 pad=1_1x1_1}``,
``dim_labels=b01f_01io->b01f``, verbatim ``backend_config={...}``). The parser reads those
with ``match`` (a regex at the cursor) or ``balanced`` (a bracketed chunk kept verbatim)
instead of forcing everything through one token grammar.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NoReturn, Optional

from ..errors import ParseError

NAME = "name"      # foo, %foo.1, get-tuple-element, f32, ROOT, true, inf
NUMBER = "number"  # 3, -1, 1.5e-05, -inf, -nan
STRING = "string"  # "text" (escapes kept raw in ``text``; use ``unquote``)
PUNCT = "punct"    # { } ( ) [ ] , : = -> <= * ?
EOF = "eof"


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    pos: int

    def describe(self) -> str:
        return "end of input" if self.kind == EOF else repr(self.text)


_SKIP = re.compile(r"(?:\s+|/\*.*?\*/|//[^\n]*)+", re.S)
_NAME = re.compile(r"%?[A-Za-z_][A-Za-z0-9_.\-]*|%[0-9][A-Za-z0-9_.\-]*")
_NUMBER = re.compile(r"-?(?:inf|nan)\b|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_PUNCT = re.compile(r"->|<=|[{}()\[\],:=*?<>]")


class Lexer:
    def __init__(self, text: str, filename: Optional[str] = None):
        self.text = text
        self.filename = filename
        self.pos = 0
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    # --- positions and errors -------------------------------------------------------------
    def line_col(self, pos: int) -> tuple[int, int]:
        import bisect
        i = bisect.bisect_right(self._line_starts, pos) - 1
        return i + 1, pos - self._line_starts[i] + 1

    def error(self, message: str, pos: Optional[int] = None) -> ParseError:
        pos = self.token_start() if pos is None else pos
        line, col = self.line_col(pos)
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        source_line = self.text[start:end if end >= 0 else len(self.text)]
        return ParseError(message, line, col, self.filename, source_line)

    def fail_expected(self, expected: str, tok: Optional[Token] = None) -> NoReturn:
        tok = tok or self.peek()
        raise self.error(f"expected {expected} but found {tok.describe()}", tok.pos)

    # --- tokens -----------------------------------------------------------------------------
    def skip_space(self) -> None:
        m = _SKIP.match(self.text, self.pos)
        if m:
            self.pos = m.end()

    def token_start(self) -> int:
        self.skip_space()
        return self.pos

    def _scan(self) -> Token:
        self.skip_space()
        pos = self.pos
        if pos >= len(self.text):
            return Token(EOF, "", pos)
        ch = self.text[pos]
        if ch == '"':
            m = _STRING.match(self.text, pos)
            if not m:
                raise self.error("unterminated string", pos)
            return Token(STRING, m.group(), pos)
        m = _NUMBER.match(self.text, pos)
        if m and (ch.isdigit() or ch in "-+."):
            return Token(NUMBER, m.group(), pos)
        m = _NAME.match(self.text, pos)
        if m:
            return Token(NAME, m.group(), pos)
        m = _PUNCT.match(self.text, pos)
        if m:
            return Token(PUNCT, m.group(), pos)
        return Token(PUNCT, ch, pos)  # an odd character: let the parser say what it wanted

    def peek(self) -> Token:
        save = self.pos
        tok = self._scan()
        self.pos = save
        return tok

    def next(self) -> Token:
        tok = self._scan()
        self.pos = tok.pos + len(tok.text)
        return tok

    def at(self, text: str) -> bool:
        return self.peek().text == text and self.peek().kind != STRING

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.next()
            return True
        return False

    def expect(self, text: str) -> Token:
        tok = self.peek()
        if tok.text != text or tok.kind == STRING:
            self.fail_expected(repr(text), tok)
        return self.next()

    def expect_kind(self, kind: str, what: str) -> Token:
        tok = self.peek()
        if tok.kind != kind:
            self.fail_expected(what, tok)
        return self.next()

    # --- special forms ----------------------------------------------------------------------
    def adjacent(self, ch: str) -> bool:
        """True if the very next character (no whitespace skipped) is ``ch``."""
        return self.text.startswith(ch, self.pos)

    def match(self, pattern: re.Pattern) -> Optional[str]:
        """Consume and return the regex match at the next token start, or None."""
        self.skip_space()
        m = pattern.match(self.text, self.pos)
        if not m:
            return None
        self.pos = m.end()
        return m.group()

    def balanced(self) -> str:
        """A verbatim attribute value: a bracketed group, a string, or a bare word.

        Brackets ``{}()[]`` nest and quoted strings are skipped whole; the value ends at
        a ``,`` or line end at depth 0 (or a closing bracket that is not ours).
        """
        start = self.token_start()
        text = self.text
        i = start
        depth = 0
        closers = {"{": "}", "(": ")", "[": "]"}
        stack: list[str] = []
        while i < len(text):
            ch = text[i]
            if ch == '"':
                m = _STRING.match(text, i)
                if not m:
                    raise self.error("unterminated string", i)
                i = m.end()
                continue
            if ch in closers:
                stack.append(closers[ch])
                depth += 1
            elif ch in "})]":
                if not stack:
                    break
                if stack[-1] != ch:
                    raise self.error(f"expected {stack[-1]!r} but found {ch!r}", i)
                stack.pop()
                depth -= 1
                if depth == 0 and text[start] in closers:
                    i += 1
                    break
            elif depth == 0 and (ch in ",\n"):
                break
            i += 1
        if stack:
            raise self.error(f"expected {stack[-1]!r} but found end of input", len(text))
        value = text[start:i].rstrip()
        if not value:
            self.fail_expected("an attribute value")
        self.pos = start + len(value)
        return value

    def balanced_word(self) -> str:
        """A verbatim value in a space-separated list: a ``{...}`` group or one bare word."""
        if self.at("{"):
            return self.balanced()
        start = self.token_start()
        i = start
        while i < len(self.text) and not self.text[i].isspace() and self.text[i] not in ",}":
            i += 1
        if i == start:
            self.fail_expected("a value")
        self.pos = i
        return self.text[start:i]

    def rest_of_line(self) -> str:
        """Everything up to the end of the current line (section entries)."""
        self.skip_inline_space()
        end = self.text.find("\n", self.pos)
        end = len(self.text) if end < 0 else end
        value = self.text[self.pos:end].rstrip()
        self.pos = end
        return value

    def skip_inline_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0"}


def unquote(token_text: str) -> str:
    """The value of a C-escaped double-quoted string token."""
    body = token_text[1:-1]
    out = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt == "x" and re.match(r"[0-9a-fA-F]{2}", body[i + 2:i + 4]):
                out.append(chr(int(body[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)
