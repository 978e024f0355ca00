#include "operation/message.h"

#include <cstring>

namespace collectives {

bool Request::SameSignature(const Request& o) const {
  return name == o.name && op == o.op && dtype == o.dtype && reduce_op == o.reduce_op &&
         root == o.root && prescale == o.prescale && postscale == o.postscale &&
         shape == o.shape && splits == o.splits && device == o.device && group == o.group &&
         group_size == o.group_size && process_set == o.process_set && failure == o.failure;
}

namespace {

class Writer {
 public:
  template <typename T>
  void Put(T v) { buf_.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  void PutString(const std::string& s) {
    Put<int64_t>(static_cast<int64_t>(s.size()));
    buf_.append(s);
  }
  void PutVec(const std::vector<int64_t>& v) {
    Put<int64_t>(static_cast<int64_t>(v.size()));
    if (!v.empty()) buf_.append(reinterpret_cast<const char*>(v.data()), v.size() * 8);
  }
  std::string Take() { return std::move(buf_); }

 private:
  std::string buf_;
};

class Reader {
 public:
  Reader(const char* d, size_t n) : d_(d), n_(n) {}
  template <typename T>
  bool Get(T* v) {
    if (pos_ + sizeof(T) > n_) return false;
    std::memcpy(v, d_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s) {
    int64_t len;
    if (!Get(&len) || len < 0 || pos_ + static_cast<size_t>(len) > n_) return false;
    s->assign(d_ + pos_, static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return true;
  }
  bool GetVec(std::vector<int64_t>* v) {
    int64_t len;
    if (!Get(&len) || len < 0 || pos_ + static_cast<size_t>(len) * 8 > n_) return false;
    v->resize(static_cast<size_t>(len));
    if (len) std::memcpy(v->data(), d_ + pos_, static_cast<size_t>(len) * 8);
    pos_ += static_cast<size_t>(len) * 8;
    return true;
  }
  bool Done() const { return pos_ == n_; }

 private:
  const char* d_;
  size_t n_;
  size_t pos_ = 0;
};

template <typename E>
bool GetEnum(Reader& r, E* e) {
  int32_t v;
  if (!r.Get(&v)) return false;
  *e = static_cast<E>(v);
  return true;
}

}  // namespace

std::string EncodeRequests(const std::vector<Request>& reqs) {
  Writer w;
  w.Put<int64_t>(static_cast<int64_t>(reqs.size()));
  for (const auto& q : reqs) {
    w.PutString(q.name);
    w.Put<int32_t>(static_cast<int32_t>(q.op));
    w.Put<int32_t>(static_cast<int32_t>(q.dtype));
    w.Put<int32_t>(static_cast<int32_t>(q.reduce_op));
    w.Put<int32_t>(q.root);
    w.Put<double>(q.prescale);
    w.Put<double>(q.postscale);
    w.PutVec(q.shape);
    w.PutVec(q.splits);
    w.Put<int32_t>(q.device);
    w.PutString(q.group);
    w.Put<int32_t>(q.group_size);
    w.Put<int32_t>(q.process_set);
    w.Put<int32_t>(q.rank);
    w.Put<int64_t>(q.age_ms);
    w.PutString(q.failure);
  }
  return w.Take();
}

bool DecodeRequests(const char* data, size_t len, std::vector<Request>* out) {
  Reader r(data, len);
  int64_t n;
  if (!r.Get(&n) || n < 0) return false;
  out->clear();
  out->reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Request q;
    if (!r.GetString(&q.name) || !GetEnum(r, &q.op) || !GetEnum(r, &q.dtype) ||
        !GetEnum(r, &q.reduce_op) || !r.Get(&q.root) || !r.Get(&q.prescale) ||
        !r.Get(&q.postscale) || !r.GetVec(&q.shape) || !r.GetVec(&q.splits) ||
        !r.Get(&q.device) || !r.GetString(&q.group) || !r.Get(&q.group_size) ||
        !r.Get(&q.process_set) || !r.Get(&q.rank) || !r.Get(&q.age_ms) || !r.GetString(&q.failure))
      return false;
    out->push_back(std::move(q));
  }
  return r.Done();
}

std::string EncodeResponseList(const ResponseList& list) {
  Writer w;
  w.Put<int32_t>(list.shutdown ? 1 : 0);
  w.PutString(list.shutdown_reason);
  w.Put<int64_t>(static_cast<int64_t>(list.responses.size()));
  for (const auto& p : list.responses) {
    w.PutString(p.name);
    w.Put<int32_t>(static_cast<int32_t>(p.op));
    w.Put<int32_t>(static_cast<int32_t>(p.dtype));
    w.Put<int32_t>(static_cast<int32_t>(p.reduce_op));
    w.Put<int32_t>(p.root);
    w.Put<double>(p.prescale);
    w.Put<double>(p.postscale);
    w.Put<int32_t>(p.device);
    w.PutString(p.group);
    w.Put<int32_t>(p.group_size);
    w.Put<int32_t>(p.process_set);
    w.PutVec(p.shape);
    w.PutString(p.error);
    w.PutVec(p.rank_dim0);
    w.PutVec(p.split_matrix);
  }
  return w.Take();
}

bool DecodeResponseList(const char* data, size_t len, ResponseList* out) {
  Reader r(data, len);
  int32_t shutdown;
  int64_t n;
  if (!r.Get(&shutdown) || !r.GetString(&out->shutdown_reason) || !r.Get(&n) || n < 0)
    return false;
  out->shutdown = shutdown != 0;
  out->responses.clear();
  out->responses.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Response p;
    if (!r.GetString(&p.name) || !GetEnum(r, &p.op) || !GetEnum(r, &p.dtype) ||
        !GetEnum(r, &p.reduce_op) || !r.Get(&p.root) || !r.Get(&p.prescale) ||
        !r.Get(&p.postscale) || !r.Get(&p.device) || !r.GetString(&p.group) ||
        !r.Get(&p.group_size) || !r.Get(&p.process_set) || !r.GetVec(&p.shape) || !r.GetString(&p.error) || !r.GetVec(&p.rank_dim0) ||
        !r.GetVec(&p.split_matrix))
      return false;
    out->responses.push_back(std::move(p));
  }
  return r.Done();
}

}  // namespace collectives
