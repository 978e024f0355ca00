"""What the torch optimizers (optimizer.py, adasum_optimizer.py, zero_optimizer.py) share: the
hooks they hang on their parameters (``optimizer._on_grad_ready(p)`` runs the moment each
parameter's gradient is final), and Horovod's synchronize-before-step protocol."""
import warnings
import weakref


def register_grad_ready_hooks(optimizer, params):
    """Hook every parameter of ``params``; returns the handles (for ``remove_hooks``). The hooks
    hold the optimizer weakly: a discarded optimizer must not live on through its parameters."""
    ref = weakref.ref(optimizer)

    def hook(p):
        opt = ref()
        if opt is not None:
            opt._on_grad_ready(p)

    return [p.register_post_accumulate_grad_hook(hook) for p in params]


def remove_hooks(handles):
    for h in handles:
        h.remove()


def synchronize_before_step(optimizer):
    """Horovod's ``step()`` preamble: wait for the reductions unless inside
    ``skip_synchronize()``, warning (as Horovod does) when the user already synchronized."""
    if optimizer._should_synchronize:
        if optimizer._synchronized:
            warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                          "optimizer.synchronize(). This can cause training slowdown. You may want to "
                          "consider using optimizer.skip_synchronize() context if you use "
                          "optimizer.synchronize() in your code.")
        optimizer.synchronize()
