"""Members of C++ classes as declared in their headers: methods and fields, for keeping the engine's
classes small (docs/architecture.md records the counts).

    python scripts/class_sizes.py csrc/core/engine.h Engine csrc/execution/executor.h Executor

How it counts, at the class's own brace depth, comments removed: a declaration or inline
definition with '(' before any '=' is a method (constructors, destructors and operators included);
any other declaration ending in ';' is a field (static ones included); nested types, using,
friend and typedef lines are not members. A heuristic, not a C++ parser: good for headers written
as ours are.
"""
import re
import sys


def count_members(text, name):
    text = re.sub(r"//[^\n]*", "", text)
    start = re.search(r"\b(?:class|struct)\s+" + name + r"\b[^;{]*\{", text)
    if not start:
        raise SystemExit(f"no class {name}")
    i, depth, stmt, methods, fields = start.end(), 1, "", 0, 0
    skipping = False  # inside a method body or a nested type
    while depth > 0:
        c = text[i]
        i += 1
        if c == "{":
            if depth == 1 and not skipping:
                head = re.sub(r"\b(?:public|private|protected)\s*:", "", stmt).strip()
                if re.match(r"(?:class|struct|enum|union)\b", head):
                    skipping, stmt = True, ""
                elif "(" in head.split("=")[0]:
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
            if "(" in decl.split("=")[0] and "{" not in decl:
                methods += 1
            else:
                fields += 1
            continue
        stmt += c
    return methods, fields


def main(args):
    for path, name in zip(args[::2], args[1::2]):
        methods, fields = count_members(open(path).read(), name)
        print(f"{name:<16} methods {methods:3d}  fields {fields:3d}  total {methods + fields:3d}  ({path})")


if __name__ == "__main__":
    main(sys.argv[1:])
