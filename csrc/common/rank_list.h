// Lists of ranks in error messages, in the three forms the messages use (tests and users read
// them, so each message keeps its form):
//   BracketedRanks  "[0, 2, 3]"        the coordinator's messages, after Horovod's
//   NamedRanks      "rank 3", "ranks 0, 2"   messages where the list is the subject
//   RankRanges      "0, 2-5"           long lists, as the watchdog names the ranks of each host
#pragma once
#include <string>
#include <vector>

namespace collectives {

template <typename Int>
std::string CommaSeparated(const std::vector<Int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

template <typename Int>
std::string BracketedRanks(const std::vector<Int>& ranks) {
  return "[" + CommaSeparated(ranks) + "]";
}

template <typename Int>
std::string NamedRanks(const std::vector<Int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + CommaSeparated(ranks);
}

// Runs of consecutive ranks as "a-b" (two in a row as "a, b"); expects them sorted.
template <typename Int>
std::string RankRanges(const std::vector<Int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s += (i ? ", " : "") + std::to_string(ranks[i]);
    if (j > i) s += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace collectives
