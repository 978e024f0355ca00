"""Cause and fix for every error message collectives raises (docs/errors.md is made from this).

Each entry covers the messages that share a cause: ``match`` holds regular expressions searched in
a message's text (computed parts appear as ``…``), ``where`` holds ``path:function`` places, for
messages built at run time (shown as ``<computed>``). scripts/errors_page.py fails when a message
of the code has no entry or an entry matches no message, so this file stays complete and current.
"""
from dataclasses import dataclass, field
from typing import Tuple


@dataclass(frozen=True)
class Entry:
    key: str
    title: str
    cause: str
    fix: str
    match: Tuple[str, ...] = field(default=())
    where: Tuple[str, ...] = field(default=())


E = Entry
CATALOG = [
    # --- starting, stopping -------------------------------------------------------------------
    E("not-initialized", "Used before init()",
      "A collective, rank() or size() ran before `collectives.init()` (or the face's `hvd.init()`) in this "
      "process.",
      "Call `hvd.init()` once, early, on every rank.",
      match=(r"has not been initialized",)),
    E("forked-child", "Used in a forked child",
      "The process was forked (a DataLoader worker, multiprocessing with fork) after init(); the engine's "
      "thread and MPI do not survive a fork.",
      "Call collectives only from the process that called init(); use `multiprocessing_context='spawn'` or "
      "`forkserver` for workers that need it.",
      where=("collectives/basics.py:_forked_error",)),
    E("mpi-library", "The MPI library cannot be used",
      "The engine could not start MPI: MPI_Init_thread failed, MPI was initialized by someone else without "
      "thread support, or the MPI version could not be read.",
      "Let collectives initialize MPI (import mpi4py after init(), or with its default MPI_THREAD_MULTIPLE); "
      "check that the MPI library collectives was built with is the one loaded (`collectivesrun -cb`).",
      match=(r"^MPI_Init_thread failed", r"initialized without thread support", r"^MPI_Comm_dup failed"),
      where=("csrc/python/bindings.cc:MpiLibraryVersion",)),
    E("init-timeout", "init() timed out",
      "Not every rank reached init() within COLLECTIVES_INIT_TIMEOUT_SECONDS (300 s): a rank crashed or is "
      "still loading before init(), or the ranks were not started as one MPI job.",
      "Look for the failing rank's own error; start every rank with `collectivesrun`/`mpirun`; raise "
      "COLLECTIVES_INIT_TIMEOUT_SECONDS if start-up really takes longer.",
      where=("collectives/basics.py:_start_engine", "csrc/core/engine.cc:Start")),
    E("engine-started", "init() with another communicator while running",
      "init() was called again with a different communicator while the engine runs.",
      "Call shutdown() on every rank first, then init(comm) on every rank.",
      match=(r"^engine already started",)),
    E("init-comm", "init(comm=...) with a wrong argument",
      "init() takes an mpi4py communicator (or a list of ranks, as Horovod's).",
      "Pass `MPI.COMM_WORLD` or a communicator made from it, or nothing.",
      match=(r"^init\(comm=\.\.\.\) takes",)),
    E("stall", "A collective stalled",
      "Some ranks submitted a collective that others never did (different control flow, a rank stuck or "
      "dead, different tensor names) for longer than COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS (30 minutes), "
      "or a GPU collective never finished.",
      "The stall warnings before it name the tensor and the ranks missing; make every rank submit the same "
      "collectives in the same order. Raise the limit only for genuinely long steps.",
      match=(r"shut down after a stall", r"was still in progress after", r"\(GPU work did not finish\)"),
      where=("csrc/core/engine_watchdog.cc:OnBackendStall", "csrc/backends/nccl/nccl_completion.cc:WaitForEvent")),
    E("shut-down", "The engine was shut down",
      "shutdown() ran on this rank or another one, another rank exited or failed, or the engine stopped "
      "after an earlier error; operations still pending fail with this error on every rank.",
      "Find the first error in the job's output (the rank that failed says why). To start again after a "
      "shutdown() on every rank, call init() on every rank; after a failure, restart the job (or use "
      "elastic training).",
      match=(r"shut down", r"^collectives stopped earlier", r"shutdown\(\) on this rank too", r"^… \(tensor '…' was pending\)$"),
      where=("collectives/basics.py:stopped_error", "csrc/core/engine_lifetime.cc:RecordStopLocked")),
    # --- arguments ------------------------------------------------------------------------------
    E("argument-type", "An argument of the wrong type",
      "A name, root rank, op, scale factor, splits or process set of the wrong Python type.",
      "Pass the type the message names (`name='grad.w'`, `root_rank=0`, `op=hvd.Sum`, `prescale_factor=0.5`).",
      match=(r"must be a str, not", r"must be an int, not", r"must be a reduction op", r"must be a number, not",
             r"splits must be integers", r"process_set must be a ProcessSet", r"^start_timeline's file_path",
             r"^expected a handle returned")),
    E("argument-value", "An argument out of range",
      "An integer argument out of range, a non-finite scale factor, an unknown reduce op, a name that is not "
      "valid text, or an empty name.",
      "Use a value in range: root ranks 0..size-1 of the process set, finite factors, the ops of "
      "`collectives.constants` (Average, Sum, Adasum, Min, Max, Product).",
      match=(r"is out of range$", r"must be finite", r"^unknown reduction op", r"^unknown reduce op",
             r"lone surrogate", r"needs a non-empty name", r"^unknown operation", r"supersedes average")),
    E("root-rank", "A root rank outside the process set",
      "broadcast's (or another rooted verb's) root_rank is not a rank of the process set.",
      "Give the root as a rank of the process set (0..size-1 of the set).",
      match=(r"^root rank … is out of range", r"^root rank … is not a member")),
    E("shape", "A tensor without the dimension the verb needs",
      "reducescatter, alltoall and allgather split or join along the first dimension, which a scalar does "
      "not have; a negative dimension or a missing buffer is a malformed request.",
      "Reshape the tensor (`t.reshape(1, -1)`, `t[None]`) before the call.",
      match=(r"needs a tensor with at least one dimension", r"^negative dimension", r"^missing input or output buffer")),
    E("alltoall-splits", "alltoall splits that do not fit",
      "splits must have one non-negative entry per rank and sum to at most the first dimension; without "
      "splits, the first dimension must divide by the number of ranks.",
      "Pass `splits` with size() entries summing to `tensor.shape[0]`, or pad the tensor.",
      match=(r"^alltoall",)),
    E("inplace", "An in-place verb on something that cannot be written",
      "The `_` (in-place) verbs write into their argument; Python scalars and read-only arrays cannot be.",
      "Use the verb without `_` and take its result, or pass a writable array.",
      match=(r"cannot modify a … in place", r"needs a writable array", r"^cannot write back into a non-contiguous")),
    E("duplicate-name", "Two collectives with one name at once",
      "A collective was submitted with the name of one still in flight on this rank.",
      "Give concurrent collectives distinct names (or none: unnamed ones are numbered), or synchronize the "
      "first before reusing its name.",
      match=(r"is already in flight",)),
    E("handle", "A handle that is unknown or already used",
      "synchronize()/poll() got a handle that was already synchronized (its result returned once) or "
      "never came from an `*_async` call.",
      "Synchronize each handle once and keep its result.",
      match=(r"^Handle … was not created", r"^handle … is unknown")),
    E("mismatch", "Ranks disagree about a collective",
      "Ranks submitted the same name with different shapes, dtypes, ops, roots, scale factors or numbers of "
      "grouped tensors, or a check of a layout (ZeRO's parameters, broadcast_parameters) found them "
      "different. Every rank gets this error.",
      "Make every rank submit the same collective: the message names the field, the tensor and what each "
      "rank sent (`Mismatched allreduce tensor shapes for tensor 'w': rank 0 [4], rank 1 [5]`).",
      match=(r"the ranks hold different parameters", r"optimizers hold different parameters"),
      where=("csrc/execution/executor.cc:Execute", "csrc/frontend/layout_check.cc:CheckLayout")),
    E("layout-check", "A layout check gathered nothing",
      "Internal: an agreement over the ranks (ZeRO's parameter layout) came back empty.",
      "Report it with the job's output.",
      match=(r"the layout check '…' gathered nothing",)),
    # --- data types and tensors ------------------------------------------------------------------
    E("dtype", "A data type collectives does not move",
      "The tensor's dtype is not one of uint8, int8, int16, int32, int64, float16, bfloat16, float32, "
      "float64, bool; or the verb does not apply to it (bool tensors reduce only with Min and Max and cannot "
      "be scaled).",
      "Cast the tensor (`t.float()`, `tf.cast`), or use Min/Max for bool.",
      match=(r"does not support dtype", r"^unsupported data type", r"^bool tensors")),
    E("array-kind", "An object that is not a tensor or array",
      "A verb got something it cannot read: not a numpy array, a framework tensor, a DLPack capsule or a "
      "buffer; or a sparse/strided tensor where a dense one is needed.",
      "Pass a dense tensor or numpy array.",
      match=(r"^collectives cannot use a", r"takes a torch.Tensor, got", r"tensors are not supported; use a dense tensor",
             r"^non-contiguous GPU arrays", r"^collectives takes GPU arrays of", r"^expected an array in GPU memory")),
    E("torch-device", "A torch tensor on a device other than CPU or CUDA",
      "collectives.torch moves CPU and CUDA tensors; MPS, XLA and meta tensors are refused.",
      "Move the tensor with `.cpu()` or `.cuda()`.",
      match=(r"tensors on device '…' are not supported",)),
    E("bf16-numpy", "bfloat16 without ml_dtypes",
      "Reading a bfloat16 torch tensor through numpy needs the ml_dtypes package.",
      "`pip install ml_dtypes`.",
      match=(r"need the ml_dtypes package",)),
    E("large-count", "A message over 2^31-1 elements with an MPI-3 library",
      "MPI-3 calls count in int; larger messages need MPI-4's large-count calls.",
      "Use an MPI-4 library (the pip `mpich` wheel is one), or split the tensor.",
      match=(r"need an MPI-4 library",)),
    # --- process sets ---------------------------------------------------------------------------
    E("process-set-unknown", "A process set that is not registered",
      "A collective named a process set never added with add_process_set(), already removed, or removed "
      "while one of its collectives waited.",
      "Call `hvd.add_process_set(...)` on every rank (in the same order) before using the set.",
      match=(r"is not registered; call add_process_set", r"^no registered process set has id",
             r"^process set … does not exist", r"was removed while tensor", r"the global process set")),
    E("process-set-member", "A rank outside the process set",
      "A rank that is not a member of the set submitted one of its collectives (or asked for its rank).",
      "Guard the call with `if process_set.included():`.",
      match=(r"is not a member of process set", r"^rank … is not a member of …$",
             r"^Process is not part of provided process set")),
    E("process-set-definition", "A process set defined wrongly",
      "add_process_set() got ranks that are empty, repeated, out of order or out of range, a set that exists "
      "already, or communicators that do not agree across the ranks.",
      "Pass the same sorted, distinct ranks (or the same communicator) on every rank; add each set once.",
      match=(r"^add_process_set:", r"is already registered$", r"^a process set with ranks … already exists",
             r"^a process set needs at least one rank", r"^process set rank … is out of range",
             r"^process set ranks must be distinct", r"involves every rank")),
    # --- GPUs -----------------------------------------------------------------------------------
    E("gpu-unavailable", "GPU tensors where no GPU can be used",
      "A tensor in GPU memory, but the CUDA driver or NCCL could not be loaded on this rank (no driver, no "
      "NCCL library, or COLLECTIVES_NCCL_LIBRARY names one that does not load).",
      "Install the `nvidia-nccl-cu12` wheel (or point COLLECTIVES_NCCL_LIBRARY at libnccl.so.2), check "
      "`collectivesrun -cb`; or move the tensor to the host.",
      match=(r"collectives cannot use GPUs here", r"^GPU tensors need the CUDA driver and NCCL",
             r"^this rank cannot take part in a GPU collective", r"takes no GPU tensor"),
      where=("csrc/gpu/gpu_runtime.cc:InitDevice", "csrc/gpu/gpu_runtime.cc:ResolveDevice",
             "csrc/gpu/gpu_runtime.cc:Allocate", "csrc/gpu/gpu_runtime.cc:CopyOf",
             "csrc/execution/device_submission.cc:PrepareDeviceSubmission")),
    E("gpu-device", "A tensor on another GPU than the rank's",
      "collectives uses one GPU per process; this tensor is on a different one, or its pointer is not GPU "
      "memory the driver knows.",
      "Bind each rank to its GPU before creating tensors: `torch.cuda.set_device(hvd.local_rank())`.",
      match=(r"one GPU per process", r"^GPU … does not exist", r"does not say which GPU",
             r"is not GPU memory known to the CUDA driver", r"claims to be on GPU", r"cannot tell which GPU",
             r"^output: …$")),
    E("gpu-copy-kernel", "The GPU copy kernel is not available",
      "The fused-buffer copy kernel could not be loaded (the driver lacks the module API, the wheel was built "
      "without nvcc, or COLLECTIVES_GPU_COPY_KERNEL=0); collectives then copies tensor by tensor.",
      "Nothing to do unless you set COLLECTIVES_GPU_COPY_KERNEL=0 on purpose; the fallback is slower for "
      "many small tensors.",
      match=(r"lacks the module API", r"built without nvcc", r"^COLLECTIVES_GPU_COPY_KERNEL=0$",
             r"copy kernel is not loaded", r"scaled copies without the copy kernel")),
    E("gpu-failed", "CUDA or NCCL failed",
      "A CUDA driver call or an NCCL collective failed (out of GPU memory, a peer died, a network error), or "
      "a rank could not take part, so no rank ran the collective.",
      "The message has CUDA's or NCCL's own reason; `NCCL_DEBUG=INFO` shows NCCL's side. A lost peer means "
      "restarting the job (or elastic training).",
      match=(r"NCCL communicator", r"MPI_Bcast of the NCCL unique id", r"agreeing on a GPU collective",
             r"GPU collective's failure", r"no member of process set … ran this GPU collective",
             r"^rank has no GPU backend", r"GPU completion without a GPU backend", r"on the GPU path$"),
      where=("csrc/gpu/gpu_runtime.cc:CudaStatus", "csrc/backends/nccl/nccl_backend.cc:NcclStatus",
             "csrc/backends/nccl/nccl_communicators.cc:NcclStatus")),
    # --- MPI and the engine's own failures -------------------------------------------------------
    E("peer-exited", "A rank on this host exited mid-operation",
      "A shared-memory or cross-memory collective on one host saw a peer process exit.",
      "Find why that rank exited (its own error, or the out-of-memory killer in `dmesg`).",
      match=(r"exited during", r"^the wait was aborted", r"^process_vm_(readv|writev)", r"its error says why")),
    E("mpi-failed", "An MPI call failed",
      "An MPI call inside the engine failed: usually a peer process died or the network between hosts broke; "
      "the other ranks then fail with a shutdown error.",
      "Find the rank that died first (its own error or the launcher's line naming it); check the hosts' "
      "network. A job that must survive lost hosts should be elastic.",
      match=(r"^MPI_", r"failed: …$", r"^negotiation (gather|gatherv|broadcast) failed", r"MPI failure",
             r"^… failed during the Adasum reduction", r"^the doorbells' MPI_Allgather failed")),
    E("internal", "An internal error",
      "A state the engine should never reach: a corrupt negotiation message, a wrong word read while "
      "probing cross-memory attach (then it is not used), or an operation on the wrong path.",
      "Report it with the job's output and `COLLECTIVES_LOG_LEVEL=debug`.",
      match=(r"^corrupt negotiation", r"^read a wrong word", r"^not a control operation", r"^control operation on the data path",
             r"^Adasum needs a power-of-two", r"^Adasum cannot reduce", r"^engine.allreduce_now returned")),
    E("memory", "No memory for a buffer",
      "The host ran out of memory for the gradients' fused buffer.",
      "Lower the batch size or COLLECTIVES_FUSION_THRESHOLD.",
      match=(r"no memory for the gradients' buffer",)),
    # --- Adasum, sparse ---------------------------------------------------------------------------
    E("adasum", "Adasum where it does not apply",
      "Adasum needs the global process set, a power-of-two number of ranks, float16/32/64 host tensors and "
      "dense gradients; it combines whole optimizer steps, so it cannot combine with ZeRO sharding or "
      "skip_synchronize().",
      "Use op=Average there, or run on 2^k ranks; pass sparse_as_dense=True for sparse gradients.",
      match=(r"Adasum", r"^Skipping synchronization is not supported when using Adasum")),
    E("sparse", "Sparse gradients with an op they cannot use",
      "Sparse gradients (tf.IndexedSlices, torch sparse COO) are allgathered, not reduced, so only Sum and "
      "Average apply and they cannot be scaled.",
      "Pass `sparse_as_dense=True` to DistributedOptimizer, or use Sum/Average.",
      match=(r"tf.IndexedSlices", r"^sparse_allreduce_async", r"got a sparse gradient")),
    # --- optimizers and training wrappers ------------------------------------------------------
    E("optimizer-args", "DistributedOptimizer arguments that do not fit",
      "gradient_predivide_factor with an op other than Average, backward_passes_per_step below 1, an "
      "optimizer wrapped twice or of the wrong kind, groups/num_groups that are not a count or lists of the "
      "model's parameters.",
      "Follow the message; these are Horovod's own rules.",
      match=(r"gradient_predivide_factor not supported", r"backward_passes_per_step must be >= 1",
             r"already a DistributedOptimizer", r"^DistributedOptimizer (wraps|takes)", r"^groups ",
             r"A parameter can only appear once in groups", r"^groups should be", r"groups given as lists")),
    E("named-parameters", "named_parameters that do not name every parameter once",
      "named_parameters must be (name, parameter) pairs covering each parameter of the optimizer once.",
      "Pass `model.named_parameters()` of the model whose parameters the optimizer holds.",
      match=(r"named_parameters",)),
    E("grad-order", "Gradients and steps in the wrong order",
      "More backward passes than backward_passes_per_step before step(), or zero_grad() between backward() "
      "and step() while the gradients are still being reduced.",
      "Raise backward_passes_per_step to the number of passes you accumulate, and call zero_grad() before "
      "backward() or after step().",
      match=(r"^Gradients were computed more than", r"^optimizer.zero_grad\(\) was called after")),
    E("zero-args", "zero_stage with arguments it cannot use",
      "zero_stage is 0, 1 or 2; sharding steps flat shards, so optimizers that need whole tensors (LBFGS, "
      "Muon, Adafactor, SparseAdam, unknown classes), groups/num_groups, GradScaler (for now) and "
      "add_param_group() after construction are refused on every rank.",
      "Use an elementwise optimizer (SGD, Adam, AdamW, Adagrad, RMSprop, Adamax, NAdam, RAdam, ...), leave "
      "groups unset, build a new optimizer to change parameters.",
      match=(r"^zero_stage must be", r"cannot step on a shard", r"groups/num_groups do not apply",
             r"GradScaler is not supported with a sharded optimizer", r"parameters are fixed at construction",
             r"refused zero_stage", r"is supported for Keras 3 optimizers only", r"^zero_stage=… does not support",
             r"local variables \(register_local_var")),
    E("zero-grad-scaler", "GradScaler used in a way a sharded optimizer cannot follow",
      "With zero_stage, scaler.step(optimizer) unscales and checks the reduced shards itself; "
      "scaler.unscale_(optimizer) beforehand, or a GradScaler that decides found_inf from the local p.grad "
      "(another torch's protocol), would check the wrong gradients, so it is refused on every rank.",
      "Call scaler.scale(loss).backward(), scaler.step(opt), scaler.update() only; to clip, use "
      "`opt.clip_grad_norm_(max_norm * scaler.get_scale())` inside `opt.skip_synchronize()` before "
      "scaler.step(opt).",
      match=(r"scaler.unscale_\(optimizer\) reads the local", r"this GradScaler")),
    E("keras-apply", "A Keras optimizer applied to variables it was not built on",
      "Keras' own rules, kept by the sharded optimizer: apply() needs the variables (or a built optimizer), "
      "only the variables it was built on, and at least one gradient.",
      "Pass (gradient, variable) pairs of the model the optimizer was built for.",
      match=(r"When passing `grads` without `variables`", r"^Unknown variable: …", r"^No gradients provided")),
    E("zero-checkpoint", "A sharded optimizer's checkpoint used wrongly",
      "state_dict() of a sharded optimizer needs consolidate_state_dict(to=R) on every rank first (and is on "
      "rank R only); a loaded state dict must match the optimizer's parameter groups; a sharded load needs "
      "every shard of one save.",
      "torch: call `opt.consolidate_state_dict(to=0)` on every rank, then `opt.state_dict()` on rank 0; or "
      "use save_sharded_state_dict/load_sharded_state_dict with the whole directory. Keras: build the "
      "optimizer first, `opt.consolidate(to=0)` on every rank, and `opt.load_full(plain)` with a plain "
      "optimizer built on the same model's variables.",
      match=(r"^consolidate_state_dict", r"was not consolidated", r"^loaded state dict", r"^load_sharded_state_dict",
             r"nothing to consolidate", r"^cannot load …'s state")),
    E("clip-nonfinite", "A non-finite gradient norm",
      "clip_grad_norm_ found the total norm of the gradients infinite or NaN (as torch's own clip_grad_norm_ "
      "with error_if_nonfinite=True).",
      "Lower the learning rate or use a loss scaler; pass error_if_nonfinite=False to clip anyway.",
      match=(r"is non-finite, so it cannot be clipped",)),
    E("broadcast-state", "broadcast_parameters / broadcast_optimizer_state misuse",
      "broadcast_parameters takes a state_dict or (name, tensor) pairs, with a root in the set and the same "
      "parameters on every rank; LBFGS state cannot be broadcast.",
      "Pass `model.state_dict()` (or named_parameters()) of the same model on every rank.",
      match=(r"^broadcast_parameters", r"^broadcast_optimizer_state", r"cannot broadcast torch.optim.LBFGS")),
    E("sync-batch-norm", "SyncBatchNorm input it cannot normalize",
      "SyncBatchNorm needs (N, C, ...) input with the layer's channel count and more than one value per "
      "channel over all ranks; Keras' fused=True is not supported.",
      "Check the input's shape and batch size; leave fused unset.",
      match=(r"channels \(dimension 1\)", r"2D to 5D input", r"more than 1 value per channel", r"fused=True")),
    E("keras-callbacks", "Keras callbacks or wrappers missing what they need",
      "BestModelCheckpoint without a filepath, LearningRateWarmupCallback without initial_lr, a steps per "
      "epoch that fit() does not reveal, local layers that are not Keras layers, a tape that is not a "
      "GradientTape, or Adasum with Keras.",
      "Give the argument the message names.",
      match=(r"^BestModelCheckpoint needs a filepath", r"initial_lr", r"autodetect the number of steps",
             r"local layers must be", r"^DistributedGradientTape wraps", r"^op == Adasum is not supported yet with Keras")),
    E("tf-graph", "TensorFlow 1 graphs, XLA or eager-only calls",
      "Collectives cannot be placed in a TensorFlow 1 graph or an XLA-compiled function (jit_compile=True); "
      "broadcast_global_variables() needs a TF1 graph.",
      "Use TensorFlow 2 eager or tf.function without jit_compile; use `hvd.broadcast_variables(model.variables, "
      "root_rank=0)`.",
      match=(r"TensorFlow 1 graph", r"XLA-compiled", r"broadcast_global_variables")),
    E("tf-state", "Elastic TensorFlow state that does not fit",
      "TensorFlowState/KerasState need a built model or the variables to track; a commit restored into a "
      "different model has a different number of variables; a commit of a sharded optimizer (zero_stage 1 "
      "or 2) cannot be restored into an unsharded one, nor the reverse.",
      "Build the model (`model.build(input_shape)`) before making the state; restore into the same model.",
      match=(r"^Model must be built first", r"needs the variables to track", r"^cannot restore …: the commit has")),
    # --- elastic --------------------------------------------------------------------------------
    E("elastic-abstract", "An elastic State without its methods",
      "A subclass of elastic.State must implement save(), restore() and sync() (and the persistent-state "
      "hooks if it commits to disk).",
      "Implement them, or use ObjectState, TorchState, TensorFlowState or KerasState.",
      where=("collectives/elastic/state.py:", "adapters/torch/elastic_state.py:sync")),
    E("elastic-hosts-updated", "Hosts changed (elastic)",
      "HostsUpdatedInterrupt: the elastic driver changed the job's hosts; `hvd.elastic.run` catches it, "
      "restores the last commit and goes on at the new size.",
      "Nothing, inside `@hvd.elastic.run`; outside it, commit and restart the step.",
      where=("collectives/elastic/session.py:check_host_updates",)),
    E("elastic-internal", "A rank failed mid-step (elastic)",
      "HorovodInternalError: a collective failed because a rank was lost; `hvd.elastic.run` catches it and "
      "resumes from the last commit with the ranks left.",
      "Nothing inside `@hvd.elastic.run`; commit often enough that the work lost is small.",
      where=("adapters/tensorflow/elastic_run.py:translate_error",)),
    E("elastic-commit", "An elastic commit that cannot be written or read",
      "The commit directory (/dev/shm by default) has no room for the state, or a commit file is truncated or "
      "not a commit.",
      "Point COLLECTIVES_ELASTIC_COMMIT_BASE_DIR at a local disk with room; a truncated commit is skipped "
      "in favour of the previous one.",
      match=(r"commit header", r"not a commit file", r"the header says", r"could not read the newest commit"),
      where=("collectives/elastic/commit_store.py:",)),
    E("elastic-environment", "A rank started without the elastic driver's settings",
      "COLLECTIVES_ELASTIC_* variables are set by collectivesrun's elastic driver; a rank started otherwise "
      "(or with them edited) cannot reach the driver.",
      "Start elastic jobs with `collectivesrun --min-np/--max-np/--host-discovery-script`.",
      match=(r"^COLLECTIVES_ELASTIC_DRIVER", r"is not an integer$", r"cannot reach the elastic driver")),
    # --- settings ---------------------------------------------------------------------------------
    E("setting", "A setting with an invalid value",
      "A COLLECTIVES_* (or HOROVOD_*) variable, or the launcher flag that sets it, does not parse: a boolean "
      "that is not 1/true/yes/on/0/false/no/off, a negative count, an unknown log level.",
      "Fix the value; docs/configuration.md lists every setting and what it accepts.",
      match=(r"is not a valid value", r"^invalid value … for", r"must not be negative, not", r"is not a variable name"),
      where=("collectives/config.py:",)),
    # --- launcher ---------------------------------------------------------------------------------
    E("usage", "collectivesrun's command line",
      "A flag is missing, wrong, or not ours (collectivesrun prints its usage and exits with status 2).",
      "`collectivesrun --help`; docs/migrating.md maps horovodrun's flags.",
      match=(r"--gloo is not available", r"^-np", r"^no command given")),
    E("hosts", "Hosts or host files that do not parse",
      "-H/--hostfile entries must be `host:slots` (or `host slots=N` lines); a loopback name cannot be mixed "
      "with other hosts. In an MPIJob's launcher pod the host file is the one the operator names in "
      "HYDRA_HOST_FILE (/etc/mpi/hostfile).",
      "Write `-H host1:2,host2:2`, or a host file of `host slots=N` lines; name this machine by its network "
      "name when other hosts take part.",
      match=(r"slots must be a positive integer", r"empty host entry", r"expected \[address\]:slots",
             r"cannot read host file", r"unknown field", r"lists no hosts", r"is a loopback name",
             r"the host file named by")),
    E("unreachable", "A host cannot be reached",
      "collectivesrun checks before launching that every host resolves and answers ssh within --start-timeout.",
      "Check the name, DNS and passwordless ssh (`ssh host true`); raise --start-timeout for slow networks.",
      match=(r"no answer within", r"cannot resolve host", r"needs ssh, but no ssh client", r"over ssh"),
      where=("collectives/launcher/reachability.py:",)),
    E("mpi-launcher", "No usable MPI launcher",
      "collectivesrun runs the MPI launcher (hydra's mpiexec/mpirun) that belongs to the engine's MPI; none "
      "was found or it does not run.",
      "`pip install mpich`, or set COLLECTIVES_MPIRUN to the launcher of your MPI.",
      match=(r"MPI launcher", r"is not MPICH/hydra or Open MPI"),
      where=("collectives/launcher/cli.py:plan",)),
    E("discovery", "The host discovery script failed",
      "The elastic driver runs --host-discovery-script about once a second; it failed, timed out or printed "
      "lines that are not `host:slots`.",
      "Run the script by hand; make it print one `host:slots` (or `host`) per line and exit 0.",
      match=(r"host discovery script",),
      where=("collectives/launcher/host_discovery.py:parse_discovery_output",)),
    E("run-function", "collectives.run(func) failed",
      "collectives.run() runs func on np ranks; a rank raised (its exception is re-raised with the rank), "
      "the job exited early or ran past its timeout.",
      "The re-raised exception names the rank; fix the function, or raise the timeout.",
      match=(r"^run\(\) needs a callable", r"^np must be a positive int", r"^collectives.run:", r"^rank …: …: …")),
    # --- Slurm -------------------------------------------------------------------------------------
    E("slurm-allocation", "A Slurm allocation's environment that cannot be used",
      "collectivesrun reads the allocation from SLURM_JOB_ID, SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE; "
      "they are incomplete, disagree, give no tasks, or collectivesrun itself runs in every task of an srun "
      "step (`srun collectivesrun ...`) instead of once in the batch script.",
      "Run `collectivesrun python train.py` once, in the sbatch script or salloc shell (not under srun); or "
      "use plain `srun --mpi=pmi2 python train.py` without collectivesrun.",
      match=(r"^Slurm allocation", r"is set but SLURM_JOB_NODELIST is not", r"tasks of an srun step"),
      where=("collectives/launcher/host_sources.py:place",)),
    E("slurm-nodelist", "A Slurm node list or task count that does not parse",
      "A compressed node list (`node[01-04,07]`) or task count (`2(x3),1`) that Slurm's own rules reject.",
      "Check SLURM_JOB_NODELIST / SLURM_TASKS_PER_NODE (`scontrol show hostnames $SLURM_JOB_NODELIST`).",
      match=(r"^node list …:", r"^task counts …:")),
    # --- Ray ---------------------------------------------------------------------------------------
    E("ray-missing", "Ray is not installed",
      "collectives.ray needs Ray, an optional extra.",
      "`pip install 'collectives[ray]'`.",
      match=(r"^collectives.ray needs Ray",)),
    E("ray-arguments", "RayExecutor's arguments do not fit",
      "RayExecutor takes num_workers, or num_hosts with num_workers_per_host (not both); positive "
      "counts, cpus_per_worker and timeouts; gpus_per_worker only with use_gpu=True; ElasticRayExecutor's "
      "max_workers at least its min_workers.",
      "Give the arguments as Horovod's RayExecutor takes them.",
      match=(r"gpus_per_worker", r"num_workers", r"cpus_per_worker must be positive", r"must be a positive number of seconds",
             r"is below min_workers", r"^… must be a positive int, not …$")),
    E("ray-not-started", "A RayExecutor used before start() or after a lost worker",
      "run()/execute() before start(), or after a lost worker stopped the executor.",
      "Call `executor.start()` (again, after a lost worker).",
      match=(r"the executor is not started", r"call start\(\) first")),
    E("ray-worker-lost", "A Ray worker was lost",
      "A rank's actor, its process or its node died (killed, out of memory, node lost) during run(); the "
      "other workers were stopped and no actor is left.",
      "Find why the node or process died (`ray status`, the node's logs); start() again, or use "
      "ElasticRayExecutor to go on with the workers left.",
      match=(r"was lost \(", r"its process is not connected", r"ended while")),
    E("ray-start", "The MPI world among the Ray workers could not be formed",
      "collectives.ray starts MPICH's launcher (hydra) with its proxies inside the actors; the launcher is "
      "missing, exited early or printed an unexpected number of proxy commands.",
      "Install the `mpich` wheel in the environment the workers use (it comes with collectives); check "
      "that every Ray node has the same Python environment.",
      match=(r"^collectives.ray forms its MPI world", r"^MPICH's launcher"),
      where=("collectives/ray/world.py:",)),
    E("ray-elastic", "The elastic Ray job cannot go on",
      "Fewer workers fit than min_workers, no generation could start within elastic_timeout, or "
      "reset_limit restarts were used up.",
      "Add nodes or lower min_workers; raise elastic_timeout or reset_limit.",
      match=(r"^ElasticRayExecutor: only", r"no generation could start", r"reset_limit … reached")),
    E("ray-leftover-actors", "Actors still alive after shutdown()",
      "Ray still reported actors of the executor alive after shutdown() waited for them.",
      "Check `ray list actors`; kill them with `ray.kill`. Report it with the output.",
      match=(r"still reports … of its actors alive",)),
    # --- Horovod helpers ----------------------------------------------------------------------------
    E("horovod-util", "Horovod's utility functions with wrong arguments",
      "is_version_greater_equal_than takes two version strings of the form major.minor.patch.",
      "Pass strings like '2.16.0'.",
      match=(r"is_version_greater_equal_than", r"target version must be")),
    E("timeline-file", "The timeline file cannot be opened",
      "start_timeline()/COLLECTIVES_TIMELINE names a path rank 0 cannot write.",
      "Use a writable path whose directory exists.",
      match=(r"cannot open timeline file",)),
    E("missing-name", "A name the face does not have",
      "An attribute Horovod's face does not have either, or one our face lacks (docs/migrating.md lists "
      "them with the reason).",
      "See docs/migrating.md.",
      match=(r"^module … has no attribute",)),
    E("renamed", "An internal naming helper misused",
      "Internal: renamed() builds the faces' Horovod names from functions with plain parameters.",
      "Report it.",
      match=(r"^renamed\(\) needs plain parameters",)),
]
