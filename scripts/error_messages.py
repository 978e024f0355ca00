"""Every error message collectives can raise, read from its code (for docs/errors.md).

Two readers, both static (nothing is imported or run):
- Python (collectives/, adapters/): every ``raise X(...)`` and every ``parser.error(...)``/
  ``p.error(...)`` of the launcher; the message is the first argument with its literal parts kept
  and each computed part shown as ``…``. A message held in a variable is reported as
  ``<computed>`` (the catalog then matches it by its place: the entry's ``where``).
- The engine (csrc/): every ``Status::Error(StatusCode::X, ...)``; the string literals of the
  message are joined, each piece of code between them shown as ``…``. The status code gives the
  Python exception (collectives/errors.py maps codes to types).
"""
import ast
import os
import re
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON_TREES = ("collectives", "adapters")
ENGINE_TREE = "csrc"
COMPUTED = "<computed>"
HOLE = "…"

# csrc/common/status.h's codes -> collectives/errors.py's exceptions (its _BY_CODE).
CODE_EXCEPTIONS = {
    "INVALID_ARGUMENT": "InvalidArgumentError",
    "UNSUPPORTED_TYPE": "UnsupportedTypeError",
    "DUPLICATE_NAME": "DuplicateNameError",
    "NOT_INITIALIZED": "NotInitializedError",
    "MISMATCH": "TensorMismatchError",
    "SHUT_DOWN": "ShutdownError",
    "TIMEOUT": "StallTimeoutError",
    "INTERNAL": "InternalError",
    "NOT_IMPLEMENTED": "NotSupportedError",
}


@dataclass(frozen=True)
class Message:
    exception: str  # the class raised ("ValueError", "InvalidArgumentError", "usage" for parser.error)
    text: str       # literal parts, computed parts as HOLE; COMPUTED when none is literal
    where: str      # path:function (path relative to the repository)
    line: int


def _template(node):
    """The message's literal parts with each computed part as HOLE."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        return (HOLE if left is None else left) + (HOLE if right is None else right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _template(node.func.value)
    return None


def _name(func):
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


class _PythonReader(ast.NodeVisitor):
    def __init__(self, path):
        self.path = path
        self.scope = ["<module>"]
        self.found = []

    def _function(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _function

    def _add(self, exception, args, node):
        text = _template(args[0]) if args else ""
        if text is None:
            text = COMPUTED
        self.found.append(Message(exception, " ".join(text.split()), f"{self.path}:{self.scope[-1]}", node.lineno))

    def visit_Raise(self, node):
        call = node.exc
        if isinstance(call, ast.Call):
            name = _name(call.func)
            # Exception classes by convention (FooError, NotImplementedError, ...); a call of a
            # helper that builds the exception (raise _forked_error()) is read where it builds it.
            if name and (name.endswith("Error") or name.endswith("Exception") or name.endswith("Interrupt")):
                self._add(name, call.args, node)
        self.generic_visit(node)

    def visit_Call(self, node):
        # argparse's parser.error(...): collectivesrun's usage errors.
        if isinstance(node.func, ast.Attribute) and node.func.attr == "error" and \
                _name(node.func.value) in ("p", "parser"):
            self._add("usage", node.args, node)
        elif _name(node.func) and _name(node.func).endswith("Error") and self._builds_for_raise(node):
            self._add(_name(node.func), node.args, node)
        self.generic_visit(node)

    def _builds_for_raise(self, node):
        # `return XError(...)` inside a helper named *_error: the exception a caller raises.
        return self.scope[-1].endswith("_error") and getattr(node, "_returned", False)

    def visit_Return(self, node):
        if isinstance(node.value, ast.Call):
            node.value._returned = True
        self.generic_visit(node)


def python_messages(root=ROOT):
    found = []
    for tree in PYTHON_TREES:
        for folder, _, files in os.walk(os.path.join(root, tree)):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                with open(path) as f:
                    module = ast.parse(f.read(), path)
                reader = _PythonReader(os.path.relpath(path, root))
                reader.visit(module)
                found += reader.found
    return found


_STATUS_CALL = re.compile(r"Status::Error\(")
_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FUNCTION = re.compile(r"^[A-Za-z_][\w:<>,\s\*&]*?\b([A-Za-z_]\w*)\s*\([^;]*\)\s*(?:const\s*)?\{", re.M)


def _call_arguments(source, start):
    """The text between the call's parentheses (start: index just after its '(')."""
    depth, i, in_string = 1, start, False
    while i < len(source):
        c = source[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return source[start:i]
        i += 1
    return source[start:]


def _engine_template(message_code):
    parts, last = [], 0
    for m in _LITERAL.finditer(message_code):
        between = message_code[last:m.start()].strip().strip("+").strip()
        if between and between not in ("std::string(", ")", "std::string("):
            parts.append(HOLE)
        parts.append(bytes(m.group(1), "utf-8").decode("unicode_escape"))
        last = m.end()
    tail = message_code[last:].strip().strip(")").strip("+").strip()
    if tail:
        parts.append(HOLE)
    text = re.sub(f"(?:{HOLE})+", HOLE, "".join(parts))
    return text if _LITERAL.search(message_code) else COMPUTED


def engine_messages(root=ROOT):
    found = []
    for folder, _, files in os.walk(os.path.join(root, ENGINE_TREE)):
        for name in sorted(files):
            if not name.endswith((".cc", ".h")):
                continue
            path = os.path.join(folder, name)
            with open(path) as f:
                source = f.read()
            functions = [(m.start(), m.group(1)) for m in _FUNCTION.finditer(source)]
            for m in _STATUS_CALL.finditer(source):
                args = _call_arguments(source, m.end())
                code, _, message = args.partition(",")
                code = code.strip()
                exception = CODE_EXCEPTIONS.get(code.replace("StatusCode::", ""), "by status code")
                if code == "StatusCode c":  # the helper's own definition in status.h
                    continue
                function = ([f for at, f in functions if at < m.start()] or ["<file>"])[-1]
                text = " ".join(_engine_template(message).split())
                found.append(Message(exception, text, f"{os.path.relpath(path, root)}:{function}",
                                     source.count("\n", 0, m.start()) + 1))
    return found


def all_messages(root=ROOT):
    return python_messages(root) + engine_messages(root)


if __name__ == "__main__":
    for m in all_messages():
        print(f"{m.exception:28} {m.where:70} {m.text}")
