#include "frontend/layout_check.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/engine.h"
#include "common/rank_list.h"

namespace collectives {
namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// One allgather of `bytes` bytes of `dtype` elements (`rows` rows of `cols`) under `name`; the
// engine allocates the result.
Status Gather(Engine* e, const std::string& name, int32_t process_set, DataType dtype, int64_t rows, int64_t cols,
              const void* input, const LayoutWait& wait, Result* out) {
  Submission s;
  s.request.op = OpType::ALLGATHER;
  s.request.name = name;
  s.request.dtype = dtype;
  s.request.shape = cols > 0 ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
  s.request.process_set = process_set;
  s.input = input;
  std::vector<Submission> subs;
  subs.push_back(std::move(s));
  std::vector<int64_t> handles;
  Status st = e->requests().Enqueue(std::move(subs), &handles, /*caller_waits=*/false);
  if (!st.ok()) return st;
  wait(handles.at(0));
  *out = e->requests().Collect(handles.at(0));
  return out->status;
}

std::vector<std::string> Lines(const std::string& record) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= record.size()) {
    size_t end = record.find('\n', start);
    if (end == std::string::npos) end = record.size();
    lines.push_back(record.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace

std::string LayoutMismatchMessage(const std::string& name, const std::vector<int64_t>& ranks,
                                  const std::vector<std::string>& records) {
  std::vector<std::vector<std::string>> lines;
  size_t longest = 0;
  for (const std::string& r : records) {
    lines.push_back(Lines(r));
    longest = std::max(longest, lines.back().size());
  }
  std::string head = "Mismatched allreduce tensor shapes: the ranks reduce different gradients under '" + name + "': ";
  const std::string tail = " (every rank must reduce gradients of the same shapes and dtypes: does the model "
                           "differ between ranks?)";
  for (size_t i = 0; i < longest; ++i) {
    // Each rank's entry i, as (label, value); ranks grouped by entry, in order of first appearance.
    std::vector<std::pair<std::string, std::string>> entries;
    for (const auto& l : lines) {
      if (i >= l.size()) {
        entries.emplace_back("", "no tensor");
        continue;
      }
      const size_t tab = l[i].find('\t');
      entries.emplace_back(tab == std::string::npos ? "" : l[i].substr(0, tab),
                           tab == std::string::npos ? l[i] : l[i].substr(tab + 1));
    }
    bool same = true, same_label = true;
    for (const auto& en : entries) {
      same = same && en == entries[0];
      same_label = same_label && en.first == entries[0].first;
    }
    if (same) continue;
    std::vector<std::pair<std::string, std::vector<int64_t>>> groups;
    for (size_t k = 0; k < entries.size(); ++k) {
      const std::string what =
          same_label || entries[k].first.empty() ? entries[k].second : entries[k].first + " " + entries[k].second;
      auto g = groups.begin();
      while (g != groups.end() && g->first != what) ++g;
      if (g == groups.end()) {
        groups.emplace_back(what, std::vector<int64_t>{});
        g = groups.end() - 1;
      }
      g->second.push_back(ranks[k]);
    }
    std::string msg = head + (same_label && !entries[0].first.empty() ? entries[0].first
                                                                        : "tensor " + std::to_string(i) + " of the list") +
                      " is ";
    for (size_t g = 0; g < groups.size(); ++g) {
      if (g > 0) msg += g + 1 == groups.size() ? " but " : ", ";
      msg += groups[g].first + " on " + NamedRanks(groups[g].second);
    }
    return msg + tail;
  }
  return head + "their layouts differ" + tail;
}

Status CheckLayout(Engine* e, const std::string& name, const std::string& record, int32_t process_set,
                   const LayoutWait& wait) {
  const std::string key = std::to_string(process_set) + '\n' + name + '\n' + record;
  if (e->requests().agreed_layouts().Contains(key)) return Status::Ok();

  const int64_t mine[3] = {e->job().rank, static_cast<int64_t>(Fnv1a(record)), static_cast<int64_t>(record.size())};
  Result heads;
  Status st = Gather(e, name, process_set, DataType::INT64, 1, 3, mine, wait, &heads);
  if (!st.ok()) return st;
  const int64_t n = heads.output_shape.empty() ? 0 : heads.output_shape[0];
  const auto* all = static_cast<const int64_t*>(heads.output ? heads.output->data() : nullptr);
  if (all == nullptr || n <= 0)
    return Status::Error(StatusCode::INTERNAL, "collectives: the layout check '" + name + "' gathered nothing");
  bool agree = true;
  for (int64_t k = 0; k < n; ++k) agree = agree && all[3 * k + 1] == mine[1] && all[3 * k + 2] == mine[2];
  if (agree) {
    e->requests().agreed_layouts().Add(key);
    return Status::Ok();
  }

  // Every rank saw the same heads and takes this path too: gather the records for the message.
  Result bodies;
  std::string padded = record.empty() ? std::string(1, '\0') : record;  // an allgather needs a row
  st = Gather(e, name + ".records", process_set, DataType::UINT8, static_cast<int64_t>(padded.size()), 0,
              padded.data(), wait, &bodies);
  if (!st.ok()) return st;
  const char* data = static_cast<const char*>(bodies.output ? bodies.output->data() : nullptr);
  std::vector<int64_t> ranks;
  std::vector<std::string> records;
  int64_t offset = 0;
  for (int64_t k = 0; k < n && data != nullptr; ++k) {
    const int64_t len = all[3 * k + 2];
    ranks.push_back(all[3 * k]);
    records.emplace_back(data + offset, static_cast<size_t>(len));
    offset += std::max<int64_t>(len, 1);
  }
  const std::string shown = process_set == 0 ? name : name + " [process set " + std::to_string(process_set) + "]";
  return Status::Error(StatusCode::MISMATCH, LayoutMismatchMessage(shown, ranks, records));
}

}  // namespace collectives
