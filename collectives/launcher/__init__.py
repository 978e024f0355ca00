"""The pieces of ``collectivesrun`` (``collectives/run.py``): one job per module.

args          the command line (our flags and horovodrun's spellings)
hosts         -H / --hostfile parsing and where each rank lands
host_sources  where a job's hosts come from: -H, --hostfile, a Slurm allocation, this machine
slurm_allocation  the nodes and task counts of a Slurm allocation; probing a node's slurmd
slurm_nodelist    Slurm's compressed node lists and task counts (scontrol's, or our parser)
reachability  resolving host names, telling local from remote, ssh checks
elf_deps      which libmpi the compiled engine links, and from where
mpi_locator   finding the MPI launcher that matches the engine, and its flavour
environment   the variables the ranks get (knobs, -x, thread and yield defaults)
command       the launcher's argv for MPICH/hydra or Open MPI
check_build   the ``--check-build`` report
supervise     running the launcher as a child; ending a job a crashed host or cut link broke
elastic_driver      ``--min-np/--max-np``: generations, restarts, blacklist, reset limit, exit status
elastic_generation  one launch of an elastic job, watched; which ranks failed and why
elastic_rank        the per-rank wrapper that tells the driver how its rank ended
host_discovery      running ``--host-discovery-script`` and parsing its ``host:slots`` lines
notification_server the driver's TCP endpoint: host-set version queries, rank reports
"""
