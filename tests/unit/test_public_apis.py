"""Product code reads no library's private internals: an AST walk over every product module, with the rule below.

A library's private names and the way its code runs (generator frames, code objects) are not promises: a release
may rename or rewire them without a word, and code that reads them breaks quietly or, worse, goes on answering
from a state that no longer means what it did. What Relay needs from a library it takes through that library's
public API; the few exceptions are listed in ``ALLOWED`` below, each with its reason.

The rule, per expression:

- Introspection of running code (``gi_frame``, ``gi_yieldfrom``, ``gi_code``, ``cr_frame``, ``f_locals``,
  ``__code__``, ...: ``INTROSPECTION``), read on anything, as an attribute or through ``getattr`` and friends with
  the name as a constant.
- ``x._name`` (one leading underscore; dunders are Python's protocols), read or written, or ``getattr(x, "_name")``
  and friends, is a finding unless ``x`` is
  - ``self`` or ``cls`` inside a class of Relay's that defines ``_name`` itself or in one of Relay's classes it
    derives from (a method, a class attribute, or an attribute its methods assign): a private name a class
    inherits from a library's base class is that library's;
  - a name the module binds to something of Relay's own: an import from one of Relay's packages (``PROJECT``),
    or a function or class defined at the module's top level.
  Anything else (another variable, ``super()``, ``self.conn``, a call's result) may be a library's object.
- An import of a private module of another package (``from h11._connection import ...``) or of a private name
  from one (``from websockets import _name``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every product module: what runs in Relay's processes, and the Python client executors import.
PRODUCT = ["core", "gateway", "api", "cli", "workflows", "activities", "worker.py", "clients/python/relay_dbos"]
PROJECT = {"core", "gateway", "api", "cli", "workflows", "activities", "worker", "relay_dbos"}  # import roots
# Generator, coroutine and async-generator internals (gi_frame, gi_yieldfrom, gi_code, cr_frame, ag_await, ...),
# frame and traceback internals, and the innards of a function object.
INTROSPECTION = re.compile(r"^(gi|cr|ag)_\w+$|^f_(locals|globals|builtins|back|code|lasti|lineno|trace)$|^tb_frame$"
                           r"|^__(code|closure|globals|defaults|kwdefaults)__$")
ATTRIBUTE_FUNCTIONS = {"getattr", "hasattr", "setattr", "delattr"}

# (module, the expression or import as written) -> why it stays. A stale entry fails the test as a finding does.
ALLOWED: dict[tuple[str, str], str] = {
    ("clients/python/relay_dbos/recovery.py", "DBOS._recover_pending_workflows"):
        "the one call the Python client makes outside DBOS's public API: no public call re-enqueues another "
        "executor's PENDING workflows; it is what DBOS.launch() runs for the process's own id and what dbos "
        "3.2.0's own conductor client ran for `recovery`; kept behind recovery.recover(), the dbos range pinned "
        "(clients/python/pyproject.toml, checked again at import) and the call tested on it "
        "(clients/python/tests/test_protocol.py, test_recovery_re_enqueues_exactly_the_dead_executors_pending_"
        "workflows)",
    ("core/store/base.py", "row._mapping"):
        "public: SQLAlchemy documents Row._mapping (the underscore keeps Row's API apart from column names)",
    ("core/store/claims.py", "row._mapping"):
        "public: SQLAlchemy documents Row._mapping (the underscore keeps Row's API apart from column names)",
    ("core/store/claims.py", "found_row._mapping"):
        "public: SQLAlchemy documents Row._mapping (the underscore keeps Row's API apart from column names)",
    ("core/temporal.py", "os._exit"):
        "public: os._exit is the documented way to end a process without running atexit hooks",
    ("cli/main.py", "self._actions"):
        "argparse (standard library) has no public way to list a parser's options, which the did-you-mean "
        "suggestion for a mistyped option needs; tests/unit/test_cli_output.py checks that suggestion",
}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    code: str  # the expression or import, as ast.unparse writes it

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.code}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_import(module: str | None, level: int) -> bool:
    return level > 0 or (module or "").split(".")[0] in PROJECT


@cache  # by node: a class is asked about once per ``self._name`` in it
def _class_names(cls: ast.ClassDef) -> frozenset[str]:
    """What a class defines itself: its body's names, and every ``self.x``/``cls.x`` its methods assign."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
              and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")}
    return frozenset(names)


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Subscript):  # Generic[T], a parametrised base
        base = base.value
    return base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else None


class _Module(ast.NodeVisitor):
    def __init__(self, path: str, tree: ast.Module, imports: list[ast.Import | ast.ImportFrom],
                 classes: dict[str, list[ast.ClassDef]]) -> None:
        self.path, self.classes = path, classes
        self.findings: list[Finding] = []
        self.enclosing: list[ast.ClassDef] = []
        # Names this module binds to Relay's own things: imports from Relay's packages, top-level defs and classes.
        self.own = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        for node in imports:
            if isinstance(node, ast.ImportFrom) and _own_import(node.module, node.level):
                self.own |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                self.own |= {a.asname or a.name.split(".")[0] for a in node.names if _own_import(a.name, 0)}

    def find(self, node: ast.AST, code: str) -> None:
        self.findings.append(Finding(self.path, getattr(node, "lineno", 0), code))

    def defines(self, cls: ast.ClassDef, name: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether ``cls`` or one of Relay's classes it derives from defines ``name``."""
        if name in _class_names(cls):
            return True
        bases = {b for b in map(_base_name, cls.bases) if b is not None and b not in seen}
        return any(self.defines(base, name, seen | bases) for b in bases for base in self.classes.get(b, []))

    def private_read_allowed(self, receiver: ast.expr, name: str) -> bool:
        if not isinstance(receiver, ast.Name):
            return False
        if receiver.id in ("self", "cls"):
            return bool(self.enclosing) and self.defines(self.enclosing[-1], name)
        return receiver.id in self.own

    def check(self, node: ast.AST, receiver: ast.expr, name: str, code: str) -> None:
        if INTROSPECTION.match(name) or (_private(name) and not self.private_read_allowed(receiver, name)):
            self.find(node, code)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.enclosing.append(node)
        self.generic_visit(node)
        self.enclosing.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.check(node, node.value, node.attr, ast.unparse(node))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if (isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_FUNCTIONS and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            self.check(node, node.args[0], node.args[1].value, f"{node.func.id}({ast.unparse(node.args[0])}, "
                                                               f"{node.args[1].value!r})")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if not _own_import(node.module, node.level):
            module = node.module or ""
            if any(_private(part) for part in module.split(".")):
                self.find(node, f"from {module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    self.find(node, f"from {module} import {alias.name}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not _own_import(alias.name, 0) and any(_private(part) for part in alias.name.split(".")):
                self.find(node, f"import {alias.name}")


def findings(sources: dict[str, str]) -> list[Finding]:
    """Every read of a library's internals in ``sources`` (path -> Python source), by the rule above."""
    trees = {path: ast.parse(source, path) for path, source in sources.items()}
    classes: dict[str, list[ast.ClassDef]] = {}  # every class of Relay's by name, for ``self._name`` in a subclass
    imports: dict[str, list[ast.Import | ast.ImportFrom]] = {}
    for path, tree in trees.items():
        imports[path] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                imports[path].append(node)
    found: list[Finding] = []
    for path, tree in trees.items():
        module = _Module(path, tree, imports[path], classes)
        module.visit(tree)
        found += module.findings
    return found


def _product_sources() -> Iterator[tuple[str, str]]:
    for entry in PRODUCT:
        path = ROOT / entry
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            yield file.relative_to(ROOT).as_posix(), file.read_text()


def test_product_code_reads_no_librarys_internals() -> None:
    sources = dict(_product_sources())
    assert len(sources) > 100, "the product modules were not found"
    found = findings(sources)
    unexplained = [str(f) for f in found if (f.path, f.code) not in ALLOWED]
    assert unexplained == [], ("reads of a library's internals: use its public API, or add each to ALLOWED with "
                               "the reason:\n" + "\n".join(unexplained))
    stale = sorted(set(ALLOWED) - {(f.path, f.code) for f in found})
    assert stale == [], f"ALLOWED entries that match nothing any more, to remove: {stale}"


# -- the rule catches what it is meant to catch --------------------------------------------------------------------

PLANTED = '''
from websockets.streams import StreamReader
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from websockets import _private_helper
import sys
import websockets._internal
from core import units
from gateway.liveness import _TICK
from .sibling import _helper

AT_EOF = getattr(getattr(StreamReader, "at_eof", None), "__code__", None)  # caught: __code__, through getattr
FRAME = sys._getframe()  # caught: a library module's private


def boundary(conn):
    parser = conn.parser
    while getattr(parser, "gi_yieldfrom", None) is not None:  # caught, through getattr
        parser = parser.gi_yieldfrom  # caught
    return parser.gi_code is AT_EOF and not conn.reader._buffer  # both caught: the second, a library object's private


def callers(coro, frame):
    return coro.cr_frame, frame.f_locals, boundary.__code__  # all caught: introspection, on anything


class Mine:
    _limit = 3

    def __init__(self, conn):
        self._conn = conn

    def fine(self):  # none caught: Relay's own names
        return self._conn, self._limit, self._own(), cls_helper._x, units._private, _helper._y, _TICK

    def _own(self):
        return Mine._limit

    def not_fine(self):
        return self._conn._state, super()._hidden, hasattr(self._conn, "_closing")  # all caught


class Sub(Mine):
    def inherited(self):
        return self._conn  # not caught: Relay's base class defines it


class OverALibrary(SomeLibraryProtocol):
    def reach(self):
        return self._transport_internal  # caught: the library base class's private


def cls_helper():
    pass
'''
CAUGHT = [
    "from h11._connection import ...", "from websockets import _private_helper", "import websockets._internal",
    "getattr(getattr(StreamReader, 'at_eof', None), '__code__')", "sys._getframe",
    "getattr(parser, 'gi_yieldfrom')", "parser.gi_yieldfrom", "parser.gi_code", "conn.reader._buffer",
    "coro.cr_frame", "frame.f_locals", "boundary.__code__",
    "self._conn._state", "super()._hidden", "hasattr(self._conn, '_closing')", "self._transport_internal",
]


def test_the_rule_catches_planted_reads_and_nothing_else() -> None:
    """Each planted read of a library's internals is found (the removed ping fast path of ``gateway.liveness``
    among them), and none of the planted reads of Relay's own names is."""
    found = findings({"planted.py": PLANTED})
    assert sorted(f.code for f in found) == sorted(CAUGHT)
    assert all(f.line > 0 for f in found)


def test_an_allowed_entry_covers_only_its_module() -> None:
    """The allow-list is by module and expression: the same read elsewhere is a finding."""
    [finding] = findings({"api/elsewhere.py": "from dbos import DBOS\nDBOS._recover_pending_workflows([])\n"})
    assert (finding.path, finding.code) not in ALLOWED
