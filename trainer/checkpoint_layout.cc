// The checkpoint's "layout" section: each tensor's name, place and shape, written as text and
// checked on reading like every other section, and the by-name copy --weights makes of it.
#include <charconv>
#include <limits>
#include <map>
#include <set>

#include "trainer/checkpoint.h"

namespace rt::trainer {
namespace {

std::string join(const std::vector<int64_t>& dims, const char* sep) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? sep : "") + std::to_string(dims[i]);
  return s;
}

// Splits on `sep`, keeping empty fields.
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) out.emplace_back();
    else out.back().push_back(c);
  }
  return out;
}

bool parse_u64(const std::string& s, uint64_t* v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

}  // namespace

std::string checkpoint_layout_text(std::span<const CheckpointTensor> layout) {
  std::string text;
  for (const auto& t : layout) {
    text += str_cat(t.state ? "s" : "p", "\t", t.name, "\t", t.offset, "\t", t.count, "\t", join(t.dims, ","), "\n");
  }
  return text;
}

std::vector<CheckpointTensor> checkpoint_layout_parse(const std::string& text, size_t params, size_t state,
                                                      const std::string& path) {
  std::vector<CheckpointTensor> out;
  std::set<std::pair<bool, std::string>> names;
  size_t line_no = 0, at = 0;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    const std::string line = text.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? text.size() : nl + 1;
    ++line_no;
    auto bad = [&](const std::string& what) {
      return CheckpointError(str_cat(path, ": corrupt: section 'layout' line ", line_no, ": ", what));
    };
    const auto f = split(line, '\t');
    if (f.size() != 5 || (f[0] != "p" && f[0] != "s") || f[1].empty())
      throw bad("not 'p|s <tab> name <tab> offset <tab> count <tab> dims'");
    CheckpointTensor t;
    t.state = f[0] == "s";
    t.name = f[1];
    if (!parse_u64(f[2], &t.offset) || !parse_u64(f[3], &t.count)) throw bad("offset or count is not a number");
    uint64_t product = 1;
    for (const std::string& d : split(f[4], ',')) {
      uint64_t v;
      if (!parse_u64(d, &v) || v == 0 || v > uint64_t(std::numeric_limits<int64_t>::max()) ||
          product > std::numeric_limits<uint64_t>::max() / v)
        throw bad(str_cat("bad dims '", f[4], "'"));
      product *= v;
      t.dims.push_back(int64_t(v));
    }
    const size_t room = t.state ? state : params;
    if (product != t.count || t.count > room || t.offset > room - t.count)
      throw bad(str_cat("'", t.name, "' does not fit: ", t.count, " values of dims ", f[4], " at ", t.offset, " in ",
                        room));
    if (!names.insert({t.state, t.name}).second) throw bad(str_cat("'", t.name, "' listed twice"));
    out.push_back(std::move(t));
  }
  return out;
}

template <class T>
std::vector<std::string> checkpoint_copy_matching(const Checkpoint& ck, const Arena<T>& arena,
                                                  std::type_identity_t<std::span<T>> params,
                                                  std::type_identity_t<std::span<T>> state) {
  std::map<std::pair<bool, std::string>, const CheckpointTensor*> theirs;
  for (const auto& t : ck.layout) theirs[{t.state, t.name}] = &t;
  std::vector<std::string> kept;
  for (const CheckpointTensor& mine : checkpoint_layout(arena)) {
    const auto it = theirs.find({mine.state, mine.name});
    if (it == theirs.end()) {
      kept.push_back(mine.name + " (not in the checkpoint)");
    } else if (it->second->dims != mine.dims) {
      kept.push_back(str_cat(mine.name, " ([", join(mine.dims, ", "), "]; the checkpoint's is [",
                             join(it->second->dims, ", "), "])"));
    } else {
      const auto& from = mine.state ? ck.state : ck.params;
      auto& to = mine.state ? state : params;
      std::copy_n(from.begin() + ptrdiff_t(it->second->offset), mine.count, to.begin() + ptrdiff_t(mine.offset));
    }
  }
  return kept;
}

template <class T>
std::vector<std::string> checkpoint_unused(const Checkpoint& ck, const Arena<T>& arena) {
  std::set<std::pair<bool, std::string>> mine;
  for (const CheckpointTensor& t : checkpoint_layout(arena)) mine.insert({t.state, t.name});
  std::vector<std::string> unused;
  for (const CheckpointTensor& t : ck.layout)
    if (!mine.count({t.state, t.name})) unused.push_back(str_cat(t.name, " [", join(t.dims, ", "), "]"));
  return unused;
}

template <class T>
void checkpoint_copy_whole(const Checkpoint& ck, const Arena<T>& arena, std::type_identity_t<std::span<T>> params,
                           std::type_identity_t<std::span<T>> state, const std::string& path, const std::string& model,
                           const std::string& purpose, const std::string& hint) {
  const size_t total = arena.layout().size() + arena.state_layout().size();
  if (const auto missing = checkpoint_copy_matching(ck, arena, params, state); !missing.empty())
    throw CheckpointError(str_cat(path, ": ", purpose, " needs every tensor of ", model, "; ", missing.size(), " of ",
                                  total, " are not in it under the same name and shape (first: ", missing.front(), ")",
                                  hint));
  if (const auto unused = checkpoint_unused(ck, arena); !unused.empty())
    throw CheckpointError(str_cat(path, ": ", unused.size(), " of its tensors are not ", model, "'s (first: ",
                                  unused.front(), "): it holds another model than ", purpose, " would run", hint));
}

template void checkpoint_copy_whole<float>(const Checkpoint&, const Arena<float>&, std::span<float>, std::span<float>,
                                           const std::string&, const std::string&, const std::string&,
                                           const std::string&);
template void checkpoint_copy_whole<double>(const Checkpoint&, const Arena<double>&, std::span<double>,
                                            std::span<double>, const std::string&, const std::string&,
                                            const std::string&, const std::string&);
template std::vector<std::string> checkpoint_unused<float>(const Checkpoint&, const Arena<float>&);
template std::vector<std::string> checkpoint_unused<double>(const Checkpoint&, const Arena<double>&);
template std::vector<std::string> checkpoint_copy_matching<float>(const Checkpoint&, const Arena<float>&,
                                                                  std::span<float>, std::span<float>);
template std::vector<std::string> checkpoint_copy_matching<double>(const Checkpoint&, const Arena<double>&,
                                                                   std::span<double>, std::span<double>);

}  // namespace rt::trainer
