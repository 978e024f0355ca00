"""``python -m collectives.run`` (the ``collectivesrun`` command, collectives/launcher/cli.py),
and ``collectives.run(func, np=N)``, Horovod's ``horovod.run``: run a function on N ranks and
get back each rank's return value (collectives/launcher/function_runner.py).

``collectives.run`` is both this module and that function: ``collectives/__init__.py`` binds
the function, and running ``python -m collectives.run`` (or ``import collectives.run``) rebinds
the package attribute to this module, which is therefore callable too.
"""
import sys
import types

from .launcher.cli import LaunchError, main, plan  # noqa: F401 - the command line's entry points


class _CallableModule(types.ModuleType):
    def __call__(self, func, *args, **kwargs):
        from .launcher.function_runner import run

        return run(func, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
