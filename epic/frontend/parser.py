"""Text -> syntax tree. lark parses with grammar/epi.lark; lark's errors become E1xx diagnostics."""
from __future__ import annotations

import functools
from importlib import resources

import lark
from lark import Lark, Transformer, v_args

from ..diagnostics import Diagnostic, EpicError, Source, Span
from . import ast

# Readable names for grammar terminals in "expected ..." hints.
_TERMINAL_WORDS = {"NAME": "a name", "NUMBER": "a number", "STRING": "a quoted path",
                   "TILE_SPEC": "a tile size like 128x128x64", "$END": "end of file"}


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    text = resources.files("epic.grammar").joinpath("epi.lark").read_text()
    return Lark(text, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _describe(terminal: str) -> str:
    if terminal in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[terminal]
    try:
        pattern = _parser().get_terminal(terminal).pattern
    except KeyError:
        return terminal
    if isinstance(pattern, lark.lexer.PatternStr):
        return f"'{pattern.value}'"
    return terminal.lower()


def _expected(names) -> str:
    words = sorted({_describe(n) for n in names})
    if len(words) > 8:
        words = words[:8] + ["..."]
    return ", ".join(words)


def parse(text: str, name: str = "<string>") -> ast.Module:
    source = Source(name, text)
    try:
        tree = _parser().parse(text)
    except lark.exceptions.UnexpectedCharacters as e:
        span = Span(source, e.line, e.column)
        ch = text[e.pos_in_stream] if e.pos_in_stream is not None and e.pos_in_stream < len(text) else "?"
        hint = f"expected {_expected(e.allowed)}" if e.allowed else "names, numbers and operators are ASCII"
        raise EpicError(Diagnostic("E101", f"unexpected character {ch!r}", span, hint)) from None
    except lark.exceptions.UnexpectedToken as e:
        if e.token.type == "$END":
            lines = text.splitlines() or [""]
            span = Span(source, len(lines), len(lines[-1]) + 1)
            raise EpicError(Diagnostic("E103", "unexpected end of file", span,
                                       f"expected {_expected(e.expected)}")) from None
        tok = e.token
        span = Span(source, tok.line, tok.column, tok.end_line, tok.end_column)
        raise EpicError(Diagnostic("E102", f"unexpected {_describe(tok.type) if tok.type != 'NAME' else 'name'} "
                                   f"{str(tok)!r}", span, f"expected {_expected(e.expected)}")) from None
    except lark.exceptions.UnexpectedEOF as e:  # pragma: no cover - LALR reports UnexpectedToken($END)
        lines = text.splitlines() or [""]
        span = Span(source, len(lines), len(lines[-1]) + 1)
        raise EpicError(Diagnostic("E103", "unexpected end of file", span,
                                   f"expected {_expected(e.expected)}")) from None
    depth, deepest = _depth(tree)
    if depth > MAX_DEPTH:
        meta = deepest.meta
        span = Span(source, meta.line, meta.column) if not meta.empty else Span(source, 1, 1)
        raise EpicError(Diagnostic("E105", f"the program nests more than {MAX_DEPTH} levels deep", span,
                                   "split the expression into named values (h = ...)"))
    try:
        return ast.Module(source, _transform(_ToAst(source), tree).children)
    except lark.exceptions.VisitError as e:   # a diagnostic raised inside a transformer callback
        if isinstance(e.orig_exc, EpicError):
            raise e.orig_exc from None
        raise


# Programs nesting deeper than this are refused (docs/LANGUAGE.md): a real program (hundreds of
# nested calls) stays far below it. Every walk is iterative, so this is a limit on what is sensible,
# not on Python's stack.
MAX_DEPTH = 4000
# A left operand continues its operator's chain (a + b + c is add(add(a, b), c)): no new level, so
# a sum of any number of terms is one level deep. Argument lists are no level of their own.
_CHAINS = frozenset({"add", "sub", "mul", "div", "dim_mul", "dim_div"})
_WRAPPERS = frozenset({"args", "kwarg"})


def _depth(tree) -> tuple[int, "lark.Tree"]:
    """The nesting depth of a lark tree and its deepest node, without recursion."""
    best, deepest, stack = 0, tree, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        if d > best:
            best, deepest = d, node
        for i, c in enumerate(node.children):
            if isinstance(c, lark.Tree):
                free = node.data in _WRAPPERS or (i == 0 and node.data in _CHAINS)
                stack.append((c, d if free else d + 1))
    return best, deepest


def _transform(transformer: Transformer, tree: lark.Tree):
    """transformer.transform(tree) without recursion: callbacks run bottom-up, left to right, as in
    lark's own (recursive) walk, which a 20,000-term sum would take past Python's recursion limit."""
    results: list = []                 # transformed nodes, children before their parent
    stack = [(tree, False)]
    while stack:
        node, children_done = stack.pop()
        if not isinstance(node, lark.Tree):
            is_token = transformer.__visit_tokens__ and isinstance(node, lark.Token)
            results.append(transformer._call_userfunc_token(node) if is_token else node)
        elif not children_done:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(node.children))
        else:
            n = len(node.children)
            children = [c for c in results[len(results) - n:] if c is not lark.visitors.Discard]
            del results[len(results) - n:]
            results.append(transformer._call_userfunc(node, children))
    return results[0]


class _ToAst(Transformer):
    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    def _span(self, meta_or_tok) -> Span:
        m = meta_or_tok
        return Span(self.source, m.line, m.column, getattr(m, "end_line", None), getattr(m, "end_column", None))

    # ---- expressions
    @v_args(meta=True)
    def number(self, meta, children):
        return ast.Num(str(children[0]), self._span(meta))

    @v_args(meta=True)
    def name(self, meta, children):
        return ast.Name(str(children[0]), self._span(meta))

    @v_args(meta=True)
    def call(self, meta, children):
        func, args = children
        pos, kw, kw_spans = [], {}, {}
        for a in (args.children if args is not None else []):
            if isinstance(a, tuple):
                key, value, span = a
                if key in kw:
                    raise EpicError(Diagnostic("E203", f"argument '{key}' given twice", span,
                                               f"give '{key}' once"))
                kw[key] = value
                kw_spans[key] = span
            else:
                if kw:
                    raise EpicError(Diagnostic("E203", "positional argument after a keyword argument",
                                               _expr_span(a), "put positional arguments first, as in Python: "
                                               "f(x, y, eps=1e-6)"))
                pos.append(a)
        return ast.Call(str(func), pos, kw, self._span(meta), kw_spans)

    @v_args(meta=True)
    def kwarg(self, meta, children):
        return (str(children[0]), children[1], self._span(children[0]))

    def _binop(op):
        @v_args(meta=True)
        def build(self, meta, children):
            return ast.BinOp(op, children[0], children[1], self._span(meta))
        return build

    add, sub, mul, div = _binop("add"), _binop("sub"), _binop("mul"), _binop("div")

    @v_args(meta=True)
    def pow(self, meta, children):
        return ast.Pow(children[0], children[1], self._span(meta))
    _COMPARISONS = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}

    @v_args(meta=True)
    def comparison(self, meta, children):
        if len(children) > 3:     # a < b < c: Python would mean (a < b) and (b < c); the language has no `and`
            op = children[3]
            raise EpicError(Diagnostic(
                "E106", "chained comparisons are not supported", self._span(op),
                "compare twice and combine with select, e.g. select(a < b, select(b < c, x, y), y) "
                "for `x if a < b < c else y`"))
        lhs, op, rhs = children
        return ast.BinOp(self._COMPARISONS[str(op)], lhs, rhs, self._span(meta))

    @v_args(meta=True)
    def neg(self, meta, children):
        return ast.Neg(children[0], self._span(meta))

    # ---- types
    @v_args(meta=True)
    def dim_atom(self, meta, children):
        return ast.DimExpr(ast.DimAtom(str(children[0]), self._span(meta)), [], self._span(meta))

    def _dim_op(op):
        @v_args(meta=True)
        def build(self, meta, children):
            left, atom = children
            return ast.DimExpr(left.first, left.rest + [(op, atom.first)], self._span(meta))
        return build

    dim_mul, dim_div = _dim_op("*"), _dim_op("/")

    def dims(self, children):
        return list(children)

    @v_args(meta=True)
    def type_spec(self, meta, children):
        dtype, dims = children[0], (children[1] if len(children) > 1 else None)
        return ast.TypeSpec(str(dtype), dims, self._span(meta), self._span(dtype))

    @v_args(meta=True)
    def literal(self, meta, children):
        return float(children[0])

    @v_args(meta=True)
    def neg_literal(self, meta, children):
        return -float(children[0])

    # ---- statements
    @v_args(meta=True)
    def let_stmt(self, meta, children):
        return ast.Let(str(children[0]), children[1], self._span(meta))

    def store_role(self, children):
        return str(children[0])

    @v_args(meta=True)
    def store_stmt(self, meta, children):
        role, name, type_, expr = children
        return ast.Store(role, str(name), type_, expr, self._span(meta))

    @v_args(meta=True)
    def in_stmt(self, meta, children):
        name, type_, default = children[0], children[1], (children[2] if len(children) > 2 else None)
        return ast.InDecl(str(name), type_, default, self._span(meta))

    @v_args(meta=True)
    def operand(self, meta, children):
        type_ = children[1] if len(children) > 1 else None
        return ast.Operand(str(children[0]), type_, self._span(children[0]))

    @v_args(meta=True)
    def transposed_operand(self, meta, children):
        name, suffix = children
        if str(suffix) != "T":
            raise EpicError(Diagnostic("E102", f"unexpected '.{suffix}' after operand '{name}'", self._span(suffix),
                                       f"write {name}.T for its transpose"))
        return ast.Operand(str(name), None, self._span(meta), transposed=True)

    @v_args(meta=True)
    def option(self, meta, children):
        return (str(children[0]), (str(children[1]), self._span(children[1])), self._span(meta))

    def config(self, children):
        return children

    @v_args(meta=True)
    def gemm_stmt(self, meta, children):
        name, a, b, *rest = children
        options = {}
        body = rest
        if rest and isinstance(rest[0], list):
            for key, value, span in rest[0]:
                if key in options:
                    raise EpicError(Diagnostic("E202", f"option '{key}' given twice", span,
                                               f"keep one {key}=... in the `with` list"))
                options[key] = value
            body = rest[1:]
        return ast.Gemm(str(name), a, b, options, list(body), self._span(meta))

    @v_args(meta=True)
    def param(self, meta, children):
        name, kind, default = children
        if kind is not None and str(kind) not in ast.PARAM_KINDS:
            raise EpicError(Diagnostic("E204", f"unknown kind '{kind}' for parameter '{name}'", self._span(kind),
                                       "kinds: " + ", ".join(ast.PARAM_KINDS)))
        return ast.Param(str(name), default, self._span(meta), str(kind) if kind is not None else None)

    def params(self, children):
        return list(children)

    @v_args(meta=True)
    def def_expr(self, meta, children):
        name, params, result = children
        return ast.Def(str(name), params or [], [], result, self._span(children[0]))

    @v_args(meta=True)
    def def_block(self, meta, children):
        name, params, *lets, result = children
        return ast.Def(str(name), params or [], list(lets), result, self._span(children[0]))

    @v_args(meta=True)
    def use_stmt(self, meta, children):
        return ast.Use(str(children[0])[1:-1], self._span(meta))


def _expr_span(e) -> Span | None:
    return getattr(e, "span", None)
