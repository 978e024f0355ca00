#include "execution/host_algorithms.h"

#include <initializer_list>
#include <string>

#include "common/log.h"

namespace collectives {

Status HostAlgorithms::Init(MPI_Comm comm, MPI_Comm local, MPI_Comm cross, const HostAlgorithmSettings& settings,
                            std::atomic<const char*>* step) {
  Status st = hierarchy_.Init(comm, local, cross, settings.hierarchical_allreduce, settings.hierarchical_allgather);
  if (!st.ok()) return st;
  *step = "the shared-memory allreduce's segment (needs every rank)";
  st = shm_.Init(comm, settings.local_size, settings.shm_allreduce);
  if (!st.ok()) return st;
  *step = "the cross-memory allreduce's segment and probe (needs every rank)";
  st = cma_.Init(comm, settings.local_size, settings.cma_allreduce);
  if (!st.ok()) return st;
  // The allreduce algorithms in order of preference. Adasum is a reduction of its own; the
  // hierarchical one was asked for by name; cross-memory attach takes the large allreduces on
  // one host and shared memory the smaller ones; MPI's takes the rest.
  allreduce_.clear();
  std::string names;
  for (HostAllreduceAlgorithm* a : std::initializer_list<HostAllreduceAlgorithm*>{
           &adasum_, &hierarchical_allreduce_, &cma_, &shm_, &mpi_allreduce_}) {
    if (!a->Available()) continue;
    allreduce_.push_back(a);
    names += std::string(names.empty() ? "" : ", ") + a->name();
  }
  Log(LogLevel::INFO, "host allreduce algorithms, the first that applies runs: " + names);
  allgather_ = {&hierarchical_allgather_, &mpi_allgather_};
  return Status::Ok();
}

void HostAlgorithms::Release() {
  hierarchy_.Release();
  shm_.Release();
  cma_.Release();
}

HostAllreduceAlgorithm& HostAlgorithms::ForAllreduce(const AllreduceFacts& facts) const {
  for (HostAllreduceAlgorithm* a : allreduce_)
    if (a->Applies(facts)) return *a;
  return *allreduce_.back();  // not reached: MPI's is last and applies always
}

HostAllgatherAlgorithm& HostAlgorithms::ForAllgather(int32_t process_set) const {
  for (HostAllgatherAlgorithm* a : allgather_)
    if (a->Applies(process_set)) return *a;
  return *allgather_.back();
}

}  // namespace collectives
