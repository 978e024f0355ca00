"""Request names as a Horovod face gives them. ``collectives.torch`` and ``collectives.tensorflow``
wrap the adapters' verbs with ``renamed``; the adapters themselves keep the name they are given,
because the framework-agnostic face's dispatch (collectives/dispatch.py) calls them too, and one
collective there may join a numpy array on one rank and a torch tensor on another under one name.
"""
import functools
import inspect

_PLAIN = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def renamed(verb, rename):
    """``verb`` with its ``name`` argument replaced by ``rename(first argument, name)`` before
    the call (the first argument is the verb's tensor or list of tensors).

    The wrapper is made with the verb's own parameter list (as dataclasses makes its methods),
    so a call costs one plain Python call more (0.19-0.25 us): a generic ``*args, **kwargs`` wrapper added
    0.45-0.49 us to an 8-byte ``collectives.torch.allreduce_`` (2.6 us without it; one rank,
    2026-11-29)."""
    parameters = list(inspect.signature(verb).parameters.values())
    if not parameters or any(p.kind not in _PLAIN for p in parameters) or "name" not in [p.name for p in parameters]:
        raise TypeError(f"renamed() needs plain parameters including 'name': {verb.__qualname__}")
    first = parameters[0].name
    namespace = {"_verb": verb, "_rename": rename}
    declared, passed, keyword_only = [], [], False
    for p in parameters:
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not keyword_only:
            declared.append("*")
            keyword_only = True
        if p.default is inspect.Parameter.empty:
            declared.append(p.name)
        else:
            namespace[f"_default_{p.name}"] = p.default
            declared.append(f"{p.name}=_default_{p.name}")
        value = f"_rename({first}, name)" if p.name == "name" else p.name
        passed.append(f"{p.name}={value}" if keyword_only else value)
    source = f"def {verb.__name__}({', '.join(declared)}):\n    return _verb({', '.join(passed)})\n"
    exec(source, namespace)  # noqa: S102 - our own text, from the verb's signature
    return functools.wraps(verb)(namespace[verb.__name__])


def kind_prefixed(kind):
    """horovod.torch's rule: ``<kind>.<name>`` for a given name. Without one, the core's
    ``<kind>.noname.<n>`` is already Horovod's form (Horovod numbers by handle, the core per kind
    and process set: the same on every rank either way). A name that is not text goes on
    unchanged, for the core to refuse."""
    def rename(_tensors, name):
        return f"{kind}.{name}" if isinstance(name, str) and name else name
    return rename
