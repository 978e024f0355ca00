#include "negotiation/coordinator.h"

#include <algorithm>
#include <sstream>

#include "common/rank_list.h"

namespace collectives {
namespace {

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::vector<int64_t> Tail(const std::vector<int64_t>& s) {
  return s.empty() ? s : std::vector<int64_t>(s.begin() + 1, s.end());
}

// Finds the first request whose value differs from the first one's and describes the mismatch
// (requests are in member order; each carries its global rank).
template <typename F, typename Fmt>
bool FindMismatch(const std::vector<Request>& reqs, F key, Fmt fmt, const std::string& what,
                  const std::string& name, std::string* error) {
  for (size_t r = 1; r < reqs.size(); ++r) {
    if (!(key(reqs[r]) == key(reqs[0]))) {
      std::ostringstream os;
      os << "Mismatched " << OpTypeName(reqs[0].op) << " " << what << " for tensor '" << name
         << "': rank " << reqs[0].rank << " has " << fmt(reqs[0]) << ", rank " << reqs[r].rank << " has "
         << fmt(reqs[r]) << ".";
      *error = os.str();
      return true;
    }
  }
  return false;
}

}  // namespace

Coordinator::Coordinator(int size, double stall_check_s, double stall_shutdown_s)
    : size_(size),
      members_(size),
      joins_(size),
      stall_check_(Seconds(stall_check_s)),
      stall_shutdown_(Seconds(stall_shutdown_s)) {}

bool Coordinator::Ready(const Entry& e) const {
  const std::vector<int>* members = members_.Of(e.process_set);
  if (!members) return true;  // an unknown set: fail the request now rather than wait
  for (int m : *members)
    if (!e.have[static_cast<size_t>(m)] && !joins_.joined(m)) return false;
  return true;
}

void Coordinator::Complete(const std::string& name) {
  auto it = table_.find(name);
  Response resp = Validate(it->first, it->second);
  table_.erase(it);
  Emit(std::move(resp));
}

void Coordinator::Add(std::vector<Request>&& reqs, Clock::time_point now) {
  bool joins = false;
  for (Request& q : reqs) {
    if (q.op == OpType::JOIN) {
      joins_.Add(q, now);
      joins = true;
      continue;
    }
    if (!q.group.empty()) {
      const std::string group_error = TrackGroup(q);
      if (!group_error.empty()) {
        FailGroup(q.group, group_error);
        ready_.push_back(ErrorResponse(q, group_error));
        continue;
      }
    }
    auto it = table_.find(q.name);
    if (it == table_.end()) {
      Entry e;
      e.process_set = q.process_set;
      e.by_rank.resize(static_cast<size_t>(size_));
      e.have.assign(static_cast<size_t>(size_), false);
      e.first_seen = now;
      e.group = q.group;
      it = table_.emplace(q.name, std::move(e)).first;
    }
    Entry& e = it->second;
    const auto submitted = now - std::chrono::milliseconds(q.age_ms);
    if (submitted < e.first_seen) e.first_seen = submitted;
    const size_t r = static_cast<size_t>(q.rank);
    if (r >= e.have.size() || e.have[r]) continue;  // cannot happen: names are unique in flight
    e.have[r] = true;
    e.by_rank[r] = std::move(q);
    ++e.count;
    if (Ready(e)) Complete(it->first);
  }
  if (!joins) return;
  // A join can make waiting names ready: the joined ranks no longer need to submit them.
  std::vector<std::string> names;
  for (const auto& kv : table_)
    if (Ready(kv.second)) names.push_back(kv.first);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) Complete(name);
  Response done;
  if (joins_.TakeCompleted(&done)) Emit(std::move(done));
}

std::string Coordinator::TrackGroup(const Request& q) {
  GroupTrack& t = group_tracks_[q.group];
  if (t.declared.empty()) {
    t.declared.assign(static_cast<size_t>(size_), 0);
    t.seen.assign(static_cast<size_t>(size_), 0);
  }
  const size_t r = static_cast<size_t>(q.rank);
  if (t.declared[r] == 0) t.declared[r] = q.group_size;
  ++t.seen[r];
  if (t.error.empty()) {
    bool differ = false;
    for (int32_t d : t.declared) differ = differ || (d != 0 && d != t.declared[r]);
    if (differ) {
      std::ostringstream os;
      os << "Mismatched grouped operation '" << q.group << "': the ranks submitted different numbers of tensors (";
      bool first = true;
      for (size_t k = 0; k < t.declared.size(); ++k) {
        if (t.declared[k] == 0) continue;
        os << (first ? "" : ", ") << "rank " << k << " has " << t.declared[k];
        first = false;
      }
      os << "). Every rank must group the same tensors.";
      t.error = os.str();
    }
  }
  // Forget the group once every rank that named it sent all the members it announced (the
  // name may be reused by the next step); a rank that sent nothing is a stall, not a mismatch.
  const std::vector<int>* members = members_.Of(q.process_set);
  bool complete = true;
  for (int m : members ? *members : members_.all())
    complete = complete && t.declared[static_cast<size_t>(m)] != 0 &&
               t.seen[static_cast<size_t>(m)] >= t.declared[static_cast<size_t>(m)];
  std::string error = t.error;
  if (complete) group_tracks_.erase(q.group);
  return error;
}

Response Coordinator::ErrorResponse(const Request& q, const std::string& error) const {
  Response resp;
  resp.name = q.name;
  resp.op = q.op;
  resp.dtype = q.dtype;
  resp.process_set = q.process_set;
  resp.group = q.group;
  resp.group_size = q.group_size;
  resp.shape = q.shape;
  resp.device = q.device;
  resp.error = error;
  return resp;
}

void Coordinator::FailGroup(const std::string& group, const std::string& error) {
  auto g = groups_.find(group);
  if (g != groups_.end()) {
    for (Response& m : g->second.ready) {
      m.error = error;
      ready_.push_back(std::move(m));
    }
    groups_.erase(g);
  }
  std::vector<std::string> names;
  for (const auto& kv : table_)
    if (kv.second.group == group) names.push_back(kv.first);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const Entry& e = table_[name];
    for (size_t r = 0; r < e.have.size(); ++r) {
      if (!e.have[r]) continue;
      ready_.push_back(ErrorResponse(e.by_rank[r], error));
      break;
    }
    table_.erase(name);
  }
}

void Coordinator::Emit(Response&& r) {
  if (r.group.empty()) {
    ready_.push_back(std::move(r));
    return;
  }
  GroupState& g = groups_[r.group];
  if (!r.error.empty() && g.first_error.empty()) g.first_error = r.error;
  const int group_size = r.group_size;
  const std::string group = r.group;
  g.ready.push_back(std::move(r));
  if (static_cast<int>(g.ready.size()) < group_size) return;
  // A group is executed together or failed together.
  for (Response& m : g.ready) {
    if (!g.first_error.empty() && m.error.empty())
      m.error = "Grouped operation '" + group + "' failed: " + g.first_error;
    ready_.push_back(std::move(m));
  }
  groups_.erase(group);
}

std::vector<Response> Coordinator::TakeReady() {
  std::vector<Response> out;
  out.swap(ready_);
  return out;
}

Response Coordinator::Validate(const std::string& name, const Entry& e) const {
  Response resp;
  resp.name = name;
  resp.process_set = e.process_set;
  const std::vector<int>* members = members_.Of(e.process_set);
  // The submitted requests in member order, and the members that joined instead.
  std::vector<Request> q;
  std::vector<int> joined;
  for (int m : members ? *members : members_.all()) {
    if (e.have[static_cast<size_t>(m)])
      q.push_back(e.by_rank[static_cast<size_t>(m)]);
    else
      joined.push_back(m);
  }
  if (q.empty()) {  // only a non-member submitted: the engine refuses those at enqueue
    for (size_t r = 0; r < e.have.size(); ++r)
      if (e.have[r]) q.push_back(e.by_rank[r]);
    resp.op = q[0].op;
    resp.error = "tensor '" + name + "' was submitted by rank " + std::to_string(q[0].rank) +
                 ", which is not a member of process set " + std::to_string(e.process_set);
    return resp;
  }
  // A rank that found its input bad fails the tensor everywhere with its reason.
  std::ostringstream failed;
  for (const Request& r : q)
    if (!r.failure.empty())
      failed << (failed.tellp() > 0 ? "; " : "") << "rank " << r.rank << ": " << r.failure;
  const Request& first = q[0];
  resp.op = first.op;
  resp.dtype = first.dtype;
  resp.reduce_op = first.reduce_op;
  resp.root = first.root;
  resp.prescale = first.prescale;
  resp.postscale = first.postscale;
  resp.device = first.device;
  resp.group = first.group;
  resp.group_size = first.group_size;
  resp.shape = first.shape;
  if (!members) {
    resp.error = std::string(OpTypeName(first.op)) + " of tensor '" + name + "': process set " +
                 std::to_string(e.process_set) + " does not exist (was it removed?)";
    return resp;
  }
  const int n = static_cast<int>(members->size());
  if (failed.tellp() > 0) {
    resp.error = std::string(OpTypeName(first.op)) + " of tensor '" + name + "' failed on another rank (" +
                 failed.str() + ")";
    return resp;
  }

  std::string err;
  auto op_name = [](const Request& r) { return std::string(OpTypeName(r.op)); };
  auto dtype_name = [](const Request& r) { return std::string(DataTypeName(r.dtype)); };
  auto shape = [](const Request& r) { return ShapeString(r.shape); };
  // Requests say only "GPU memory" (0): each rank uses its own GPU (device_executor.cc).
  auto device = [](const Request& r) { return r.device < 0 ? std::string("cpu") : std::string("GPU"); };
  auto group = [](const Request& r) { return "'" + r.group + "' of size " + std::to_string(r.group_size); };

  if (FindMismatch(q, [](const Request& r) { return r.op; }, op_name, "operations", name, &err) ||
      FindMismatch(q, [](const Request& r) { return r.dtype; }, dtype_name, "data types", name, &err) ||
      FindMismatch(q, [](const Request& r) { return r.device; }, device, "devices", name, &err) ||
      FindMismatch(q, [](const Request& r) { return std::make_pair(r.group, r.group_size); }, group, "groups", name, &err)) {
    resp.error = err;
    return resp;
  }
  if (!joined.empty() && first.op != OpType::ALLREDUCE) {
    resp.error = std::string(OpTypeName(first.op)) + " of tensor '" + name + "' cannot run: ranks " + BracketedRanks(joined) +
                 " have already called join(); after a join only allreduce continues (joined ranks contribute zeros).";
    return resp;
  }
  switch (first.op) {
    case OpType::ALLREDUCE:
    case OpType::REDUCESCATTER:
      if (FindMismatch(q, [](const Request& r) { return r.shape; }, shape, "tensor shapes", name, &err) ||
          FindMismatch(q, [](const Request& r) { return r.reduce_op; },
                       [](const Request& r) { return std::string(ReduceOpName(r.reduce_op)); }, "reduce ops", name, &err) ||
          FindMismatch(q, [](const Request& r) { return std::make_pair(r.prescale, r.postscale); },
                       [](const Request& r) { return "prescale " + std::to_string(r.prescale) + " / postscale " + std::to_string(r.postscale); },
                       "scale factors", name, &err))
        resp.error = err;
      break;
    case OpType::BROADCAST:
      if (FindMismatch(q, [](const Request& r) { return r.shape; }, shape, "tensor shapes", name, &err) ||
          FindMismatch(q, [](const Request& r) { return r.root; },
                       [](const Request& r) { return "root " + std::to_string(r.root); }, "root ranks", name, &err))
        resp.error = err;
      else if (std::find(members->begin(), members->end(), first.root) == members->end())
        resp.error = "BROADCAST of tensor '" + name + "': root rank " + std::to_string(first.root) +
                     " is not a member of process set " + std::to_string(e.process_set) + " " + BracketedRanks(*members) + ".";
      break;
    case OpType::ALLGATHER:
    case OpType::ALLTOALL:
      if (FindMismatch(q, [](const Request& r) { return r.shape.size(); },
                       [](const Request& r) { return std::to_string(r.shape.size()) + " dimensions"; }, "tensor ranks", name, &err) ||
          FindMismatch(q, [](const Request& r) { return Tail(r.shape); },
                       [](const Request& r) { return "trailing shape " + ShapeString(Tail(r.shape)); }, "tensor shapes", name, &err)) {
        resp.error = err;
        break;
      }
      if (first.op == OpType::ALLGATHER) {
        for (const Request& r : q) resp.rank_dim0.push_back(r.shape.empty() ? 1 : r.shape[0]);
      } else {
        for (const Request& r : q) {
          if (static_cast<int>(r.splits.size()) != n) {
            resp.error = "ALLTOALL tensor '" + name + "': rank " + std::to_string(r.rank) + " gave " +
                         std::to_string(r.splits.size()) + " splits for " + std::to_string(n) + " ranks.";
            break;
          }
          resp.split_matrix.insert(resp.split_matrix.end(), r.splits.begin(), r.splits.end());
        }
      }
      break;
    case OpType::PROCESS_SET_ADD:
      if (FindMismatch(q, [](const Request& r) { return r.splits; },
                       [](const Request& r) { return "ranks " + ShapeString(r.splits); }, "process set members", name, &err))
        resp.error = err;
      else
        resp.split_matrix = first.splits;
      break;
    case OpType::PROCESS_SET_REMOVE:
      if (FindMismatch(q, [](const Request& r) { return r.root; },
                       [](const Request& r) { return "process set " + std::to_string(r.root); }, "process sets", name, &err))
        resp.error = err;
      break;
    case OpType::BARRIER:
    case OpType::JOIN:
      break;
  }
  return resp;
}

bool Coordinator::StallCheckDue(Clock::time_point now) const {
  const bool warn = stall_check_ > Clock::duration::zero();
  for (const auto& kv : table_) {
    const Entry& e = kv.second;
    if (warn && now - e.first_seen >= stall_check_ && (!e.warned || now - e.last_warned >= stall_check_)) return true;
    if (stall_shutdown_ > Clock::duration::zero() && now - e.first_seen >= stall_shutdown_) return true;
  }
  return warn && joins_.WarningDue(now, stall_check_);
}

void Coordinator::CheckStalls(Clock::time_point now, std::vector<std::string>* warnings, bool* shutdown,
                              std::string* reason) {
  const bool warn = stall_check_ > Clock::duration::zero();
  std::vector<std::string> names;
  for (const auto& kv : table_) names.push_back(kv.first);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    Entry& e = table_[name];
    const double waited = std::chrono::duration<double>(now - e.first_seen).count();
    std::vector<int> have, missing;
    OpType op = OpType::ALLREDUCE;
    const std::vector<int>* members = members_.Of(e.process_set);
    for (int r : members ? *members : members_.all()) {
      if (e.have[static_cast<size_t>(r)]) {
        have.push_back(r);
        op = e.by_rank[static_cast<size_t>(r)].op;
      } else if (!joins_.joined(r)) {
        missing.push_back(r);
      }
    }
    std::ostringstream os;
    os << "Stalled " << OpTypeName(op) << " of tensor '" << name << "': submitted by ranks "
       << BracketedRanks(have) << " but not by ranks " << BracketedRanks(missing) << " for " << static_cast<int64_t>(waited)
       << " s. One or more ranks may be blocked, or the ranks submitted different tensors.";
    if (stall_shutdown_ > Clock::duration::zero() && now - e.first_seen >= stall_shutdown_) {
      *shutdown = true;
      if (reason->empty()) *reason = os.str();
    }
    if (warn && now - e.first_seen >= stall_check_ && (!e.warned || now - e.last_warned >= stall_check_)) {
      e.warned = true;
      e.last_warned = now;
      warnings->push_back(os.str());
    }
  }
  // Ranks that joined wait (by design) for the others; say so now and then, no shutdown.
  if (warn && joins_.WarningDue(now, stall_check_)) warnings->push_back(joins_.TakeWarning(now));
}

}  // namespace collectives
