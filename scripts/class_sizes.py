"""Members of C++ classes as declared in their headers: methods and fields, for keeping the engine's
classes small (docs/architecture.md records the counts).

    python scripts/class_sizes.py csrc/core/engine.h Engine csrc/execution/executor.h Executor
    python scripts/class_sizes.py --all [--over N]    # every class and struct under csrc/, largest first

How it counts, at the class's own brace depth, comments removed: a declaration or inline
definition with '(' before any '=' (outside template arguments) is a method (constructors,
destructors and operators included); any other declaration ending in ';' is a field (static ones,
function pointers like `int (*Init)(unsigned);` and std::function<void()> included); nested types,
using, friend and typedef lines are not members (--all counts nested types on their own). A heuristic, not a C++ parser: good for headers written
as ours are.
"""
import os
import re
import sys


CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
# A class or struct definition's head: not `enum class`, not a forward declaration.
DEFINITION = re.compile(r"(?<!enum )\b(?:class|struct)\s+(?:\w+\s+)*?(\w+)\s*(?:final\s*)?(?::[^;{()]*)?\{")


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", text), flags=re.S)


def is_method(decl):
    """Whether a declaration at class depth declares a method: '(' before any '=', template
    arguments and function pointers aside."""
    head = decl.split("=")[0]
    while True:  # std::function<void(int)> and the like: the parentheses are a type's
        stripped = re.sub(r"<[^<>]*>", "", head)
        if stripped == head:
            break
        head = stripped
    if re.search(r"\(\s*\*\s*\w+\s*\)\s*\(", head):  # a pointer to a function: a field
        return False
    return "(" in head


def count_members(text, name):
    text = strip_comments(text)
    start = re.search(r"\b(?:class|struct)\s+" + name + r"\b[^;{]*\{", text)
    if not start:
        raise SystemExit(f"no class {name}")
    return count_from(text, start.end())


def count_from(text, i):
    """(methods, fields) of the class whose body opens just before text[i]."""
    depth, stmt, methods, fields = 1, "", 0, 0
    skipping = False  # inside a method body or a nested type
    while depth > 0:
        c = text[i]
        i += 1
        if c == "{":
            if depth == 1 and not skipping:
                head = re.sub(r"\b(?:public|private|protected)\s*:", "", stmt).strip()
                if re.match(r"(?:class|struct|enum|union)\b", head):
                    skipping, stmt = True, ""
                elif is_method(head):
                    methods += 1
                    skipping, stmt = True, ""
                else:
                    stmt += c  # a field's brace initializer
            elif not skipping:
                stmt += c
            depth += 1
            continue
        if c == "}":
            depth -= 1
            if depth == 1 and skipping:
                skipping = False
            elif not skipping and depth >= 1:
                stmt += c
            continue
        if skipping:
            continue
        if c == ";" and depth == 1:
            decl = re.sub(r"\b(?:public|private|protected)\s*:", "", stmt).strip()
            stmt = ""
            if not decl or re.match(r"(?:using|friend|typedef|static_assert)\b", decl):
                continue
            if is_method(decl) and "{" not in decl:
                methods += 1
            else:
                fields += 1
            continue
        stmt += c
    return methods, fields


def all_classes(root=CSRC):
    """(path relative to the repository, class name, methods, fields) of every class and struct
    defined in a .h or .cc file under root, nested ones included."""
    found = []
    for folder, _, names in os.walk(root):
        for file in sorted(names):
            if not file.endswith((".h", ".cc")):
                continue
            path = os.path.join(folder, file)
            text = strip_comments(open(path).read())
            for match in DEFINITION.finditer(text):
                methods, fields = count_from(text, match.end())
                found.append((os.path.relpath(path, os.path.dirname(root)), match.group(1), methods, fields))
    return found


def main(args):
    if args and args[0] == "--all":
        over = int(args[2]) if len(args) > 2 and args[1] == "--over" else -1
        rows = sorted(all_classes(), key=lambda r: (-(r[2] + r[3]), r[0], r[1]))
        for path, name, methods, fields in rows:
            if methods + fields > over:
                print(f"{name:<28} methods {methods:3d}  fields {fields:3d}  total {methods + fields:3d}  ({path})")
        return
    for path, name in zip(args[::2], args[1::2]):
        methods, fields = count_members(open(path).read(), name)
        print(f"{name:<16} methods {methods:3d}  fields {fields:3d}  total {methods + fields:3d}  ({path})")


if __name__ == "__main__":
    main(sys.argv[1:])
