"""Request names as a Horovod face gives them. ``collectives.torch`` and ``collectives.tensorflow``
wrap the adapters' verbs with ``renamed``; the adapters themselves keep the name they are given,
because the framework-agnostic face's dispatch (collectives/dispatch.py) calls them too, and one
collective there may join a numpy array on one rank and a torch tensor on another under one name.
"""
import functools
import inspect


def renamed(verb, rename):
    """``verb`` with its ``name`` argument replaced by ``rename(first argument, name)`` before
    the call (the first argument is the verb's tensor or list of tensors)."""
    parameters = list(inspect.signature(verb).parameters)
    first, index = parameters[0], parameters.index("name")

    @functools.wraps(verb)
    def call(*args, **kwargs):
        tensors = args[0] if args else kwargs.get(first)
        if len(args) > index:
            args = (*args[:index], rename(tensors, args[index]), *args[index + 1:])
        else:
            kwargs["name"] = rename(tensors, kwargs.get("name"))
        return verb(*args, **kwargs)

    return call


def kind_prefixed(kind):
    """horovod.torch's rule: ``<kind>.<name>`` for a given name. Without one, the core's
    ``<kind>.noname.<n>`` is already Horovod's form (Horovod numbers by handle, the core per kind
    and process set: the same on every rank either way). A name that is not text goes on
    unchanged, for the core to refuse."""
    def rename(_tensors, name):
        return f"{kind}.{name}" if isinstance(name, str) and name else name
    return rename
